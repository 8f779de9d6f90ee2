// backward.wgsl — backward entry points of the frozen network's kernel families
// (rmsnorm, bitlinear, linear, ffn gating, rope, attention). Each entry point's
// bindings are self-contained (own module-scope variables), so each can move into
// its family's file unchanged. Layouts are row-major f32 unless marked u32/i32.
// "accumulate" (a u32 param) selects dx = ... (0) or dx += ... (1), so several
// input-gradient contributions (q, k, v projections; LoRA; the residual stream) add
// into one buffer without temporaries. Frozen weights get no weight gradient.
//
// rmsnorm_backward   y = w * x * rstd,  rstd[n] = 1 / sqrt(mean_c x[n, c]^2 + eps)
//   dx = rstd * (w*dy - x * rstd^2 * mean_c(w*dy*x))
//   0 params {N, C, accumulate} | 1 dy[N, C] read | 2 x[N, C] read | 3 w[C] read |
//   4 rstd[N] read | 5 dx[N, C] read_write
//   dispatch: one workgroup (256) per row: N workgroups split over x, y
//
// bitlinear_backward_input   y = actquant(x) Wq^T, Wq = t[O, I] * scale (ternary)
//   Straight-through estimator at both quantisers (HF's ActQuant / WeightQuant
//   backward return the gradient unchanged), so dx = dy Wq = scale * dy t.
//   t comes from w_packed[O, ceil(I/16)] u32 (formats/tensors.py: weight (o, i) is
//   code (word >> 2*(i%16)) & 3 of word o*ceil(I/16) + i/16, t = code - 1).
//   0 params {N, I, O, scale, accumulate, ko, split} | 1 dy[N, O] read |
//   2 w_packed[O, I/16] read | 3 dx[N, I] read_write | 4 part read_write
//   Split-K (splitk.wgsl; both dense and ternary): workgroup z sums o in
//   [z*ko, (z+1)*ko) only (ko a multiple of 16); with split = 1 it writes its raw sums
//   to part[z, N, I] and splitk_reduce scales and adds them (part is bound, unused,
//   when split = 0).
//   dispatch: groups (ceil(ceil(I/16) / 8), ceil(N/64), slices); a 16x16 workgroup owns
//   64 rows x 8 words (128 columns) of dx; per 16 o the words are decoded once into
//   workgroup memory as vec4s of ternary weights, and thread (tx, ty) keeps rows
//   ty + 16a x column quads tx, tx + 16 (8 vec4 sums in named variables: as a
//   function-local array indexed in loops they went to memory on NVIDIA's Vulkan
//   compiler, 6.5x slower on an H200).
//
// linear_backward_input   y = x W^T with a dense float W[O, I] (lm_head / tied
//   embedding, W = E[V, C]): dx = scale * dy W
//   W is f32, or bf16 packed two per u32 (low half first) when the override constant
//   LN_BF16 is true (the embedding as the checkpoint stores it; no shader-f16 needed).
//   dy rows are ld_dy floats apart, so a vocabulary chunk [v0, v0 + Oc) of a
//   dlogits[N, V] buffer is used in place: bind dy from float v0 (ld_dy = V) and W
//   from row v0, call once per chunk with accumulate = 1 after the first (each
//   binding then stays under maxStorageBufferBindingSize; v0 a multiple of 64 keeps
//   the views 256-byte aligned).
//   0 params {N, I, O, scale, accumulate, ld_dy, ko, split} | 1 dy[N, ld_dy] read |
//   2 w[O, I] read (f32, or u32 pairs of bf16) | 3 dx[N, I] read_write | 4 part read_write
//   dispatch: groups (ceil(I/64), ceil(N/64), slices); 16x16 threads, a 64x64 tile of dx per
//   workgroup (4x4 elements per thread), o in chunks of 16.
//
// relu2_gating_backward   h = relu(g)^2 * u  (BitNet's MLP, before ffn_sub_norm)
//   dg = 2 relu(g) u dh,  du = relu(g)^2 dh   (overwrite)
//   0 params {count = N*F} | 1 dh[N, F] read | 2 g[N, F] read | 3 u[N, F] read |
//   4 dg[N, F] write | 5 du[N, F] write
//   dispatch: ceil(N*F / 256) workgroups split over x, y
//
// rope_backward   (HF rotate_half RoPE; forward y = x cos + rotate_half(x) sin)
//   the inverse rotation, in place: for j < D/2, with c = cos[t, j], s = sin[t, j],
//   t = n % T (positions 0..T-1 in each sequence):
//     dx[j] = dy[j] c + dy[j + D/2] s,   dx[j + D/2] = dy[j + D/2] c - dy[j] s
//   0 params {N, T, H, D} | 1 g[N, H*D] read_write (dy in, dx out) |
//   2 cos[T, D/2] read | 3 sin[T, D/2] read
//   (H is the head count of this tensor: H for q, Hkv for k)
//   dispatch: ceil(N*H*D/2 / 256) workgroups split over x, y
//
// attention_backward_dq, attention_backward_dkv   causal softmax attention with GQA,
//   all positions of all sequences at once. Inputs are post-RoPE q[N, H*D],
//   k[N, Hkv*D], v[N, Hkv*D] and dout[N, H*D]; query head h reads KV head
//   h / (H/Hkv) (HF repeat_kv). Nothing from the forward is needed: the softmax is
//   recomputed (P[i, j] = exp(s[i, j] - lse[i]), s = scale * q_i . k_j, j <= i).
//     dP = dout_i . v_j,   Dsum_i = sum_j P dP,   dS = P (dP - Dsum_i)
//     dq_i = scale * sum_j dS k_j,   dk_j = scale * sum_{h in group, i >= j} dS q_i,
//     dv_j = sum_{h in group, i >= j} P dout_i
//   Pass 1 (dq) also writes stats[N, H, 2] = (lse, Dsum) for pass 2.
//   Padding: sequences are right-padded; causal masking alone keeps every valid row
//   exact, and a padded row gets no gradient when its dout is zero (masked loss).
//   D <= 256.
//   attention_backward_dq:
//     0 params {B, T, H, Hkv, D, scale} | 1 dout[N, H*D] read | 2 q read | 3 k read |
//     4 v read | 5 dq[N, H*D] write | 6 stats[N, H, 2] write
//     dispatch: one workgroup (64) per (n, h): N*H workgroups split over x, y
//   attention_backward_dkv:
//     0 params (same) | 1 dout read | 2 q read | 3 k read | 4 v read |
//     5 stats[N, H, 2] read | 6 dk[N, Hkv*D] write | 7 dv[N, Hkv*D] write
//     dispatch: one workgroup (64) per (n, kv head): N*Hkv workgroups split over x, y

const WG: u32 = 256u;

// ============================================================================ rmsnorm
struct NormParams { n: u32, c: u32, accumulate: u32 };
@group(0) @binding(0) var<uniform> rn_p: NormParams;
@group(0) @binding(1) var<storage, read> rn_dy: array<f32>;
@group(0) @binding(2) var<storage, read> rn_x: array<f32>;
@group(0) @binding(3) var<storage, read> rn_w: array<f32>;
@group(0) @binding(4) var<storage, read> rn_rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> rn_dx: array<f32>;
var<workgroup> rn_sh: array<f32, WG>;

@compute @workgroup_size(WG)
fn rmsnorm_backward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= rn_p.n) { return; }
    let C = rn_p.c;
    let base = n * C;
    var acc = 0.0;
    for (var c = lid; c < C; c += WG) { acc += rn_w[c] * rn_dy[base + c] * rn_x[base + c]; }
    rn_sh[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) { rn_sh[lid] += rn_sh[lid + s]; }
        workgroupBarrier();
    }
    let r = rn_rstd[n];
    let k = r * r * rn_sh[0] / f32(C);
    for (var c = lid; c < C; c += WG) {
        let g = r * (rn_w[c] * rn_dy[base + c] - rn_x[base + c] * k);
        if (rn_p.accumulate != 0u) { rn_dx[base + c] = rn_dx[base + c] + g; } else { rn_dx[base + c] = g; }
    }
}

// ============================================================================ bitlinear
struct LinParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, ko: u32, split: u32 };
@group(0) @binding(0) var<uniform> bl_p: LinParams;
@group(0) @binding(1) var<storage, read> bl_dy: array<f32>;
@group(0) @binding(2) var<storage, read> bl_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> bl_dx: array<f32>;
@group(0) @binding(4) var<storage, read_write> bl_part: array<f32>;   // split: [z, N, I] raw sums
var<workgroup> bl_dy_sh: array<array<vec4<f32>, 4>, 64>;  // [row][o quad], 16 o
var<workgroup> bl_w_sh: array<array<vec4<f32>, 32>, 16>;   // [o][column quad], 128 columns, decoded

fn ternary_quad(word: u32, q: u32) -> vec4<f32> {          // weights of columns 4q .. 4q+3 of a word
    let b = word >> (8u * q);
    return vec4<f32>(vec4<u32>(b & 3u, (b >> 2u) & 3u, (b >> 4u) & 3u, (b >> 6u) & 3u)) - 1.0;
}

@compute @workgroup_size(16, 16)
fn bitlinear_backward_input(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = bl_p.n;
    let I = bl_p.i;
    let O = bl_p.o;
    let W = (I + 15u) / 16u;
    let n0 = wid.y * 64u;
    let wq0 = wid.x * 8u;
    let oend = min(O, (wid.z + 1u) * bl_p.ko);
    var a00 = vec4<f32>(0.0); var a01 = vec4<f32>(0.0);
    var a10 = vec4<f32>(0.0); var a11 = vec4<f32>(0.0);
    var a20 = vec4<f32>(0.0); var a21 = vec4<f32>(0.0);
    var a30 = vec4<f32>(0.0); var a31 = vec4<f32>(0.0);
    for (var o0 = wid.z * bl_p.ko; o0 < oend; o0 += 16u) {
        for (var m = 0u; m < 4u; m++) {
            let e = lid + 256u * m;
            let rr = e / 16u;
            let oo = e % 16u;
            var dv = 0.0;
            if (n0 + rr < N && o0 + oo < oend) { dv = bl_dy[(n0 + rr) * O + o0 + oo]; }
            bl_dy_sh[rr][oo / 4u][oo % 4u] = dv;
        }
        for (var m = 0u; m < 2u; m++) {
            let e = lid + 256u * m;
            let oo = e / 32u;
            let q = e % 32u;
            let wi = wq0 + q / 4u;
            var word = 0x55555555u;
            if (o0 + oo < oend && wi < W) { word = bl_w[(o0 + oo) * W + wi]; }
            bl_w_sh[oo][q] = ternary_quad(word, q % 4u);
        }
        workgroupBarrier();
        for (var oq = 0u; oq < 4u; oq++) {
            let d0 = bl_dy_sh[ty][oq];
            let d1 = bl_dy_sh[ty + 16u][oq];
            let d2 = bl_dy_sh[ty + 32u][oq];
            let d3 = bl_dy_sh[ty + 48u][oq];
            var w0 = bl_w_sh[oq * 4u][tx];
            var w1 = bl_w_sh[oq * 4u][tx + 16u];
            a00 += d0.x * w0; a01 += d0.x * w1; a10 += d1.x * w0; a11 += d1.x * w1;
            a20 += d2.x * w0; a21 += d2.x * w1; a30 += d3.x * w0; a31 += d3.x * w1;
            w0 = bl_w_sh[oq * 4u + 1u][tx];
            w1 = bl_w_sh[oq * 4u + 1u][tx + 16u];
            a00 += d0.y * w0; a01 += d0.y * w1; a10 += d1.y * w0; a11 += d1.y * w1;
            a20 += d2.y * w0; a21 += d2.y * w1; a30 += d3.y * w0; a31 += d3.y * w1;
            w0 = bl_w_sh[oq * 4u + 2u][tx];
            w1 = bl_w_sh[oq * 4u + 2u][tx + 16u];
            a00 += d0.z * w0; a01 += d0.z * w1; a10 += d1.z * w0; a11 += d1.z * w1;
            a20 += d2.z * w0; a21 += d2.z * w1; a30 += d3.z * w0; a31 += d3.z * w1;
            w0 = bl_w_sh[oq * 4u + 3u][tx];
            w1 = bl_w_sh[oq * 4u + 3u][tx + 16u];
            a00 += d0.w * w0; a01 += d0.w * w1; a10 += d1.w * w0; a11 += d1.w * w1;
            a20 += d2.w * w0; a21 += d2.w * w1; a30 += d3.w * w0; a31 += d3.w * w1;
        }
        workgroupBarrier();
    }
    let c0 = (wq0 * 4u + tx) * 4u;
    let c1 = (wq0 * 4u + tx + 16u) * 4u;
    bl_store(n0 + ty, c0, a00, wid.z); bl_store(n0 + ty, c1, a01, wid.z);
    bl_store(n0 + ty + 16u, c0, a10, wid.z); bl_store(n0 + ty + 16u, c1, a11, wid.z);
    bl_store(n0 + ty + 32u, c0, a20, wid.z); bl_store(n0 + ty + 32u, c1, a21, wid.z);
    bl_store(n0 + ty + 48u, c0, a30, wid.z); bl_store(n0 + ty + 48u, c1, a31, wid.z);
}

fn bl_store(n: u32, i0: u32, acc: vec4<f32>, z: u32) {
    if (n >= bl_p.n) { return; }
    for (var c = 0u; c < 4u; c++) {
        let i = i0 + c;
        if (i < bl_p.i) {
            let idx = n * bl_p.i + i;
            if (bl_p.split != 0u) { bl_part[z * bl_p.n * bl_p.i + idx] = acc[c]; continue; }
            let g = bl_p.scale * acc[c];
            if (bl_p.accumulate != 0u) { bl_dx[idx] = bl_dx[idx] + g; } else { bl_dx[idx] = g; }
        }
    }
}

// ============================================================================ dense linear
struct DenseParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, ld_dy: u32, ko: u32, split: u32 };
override LN_BF16: bool = false;
@group(0) @binding(0) var<uniform> ln_p: DenseParams;
@group(0) @binding(1) var<storage, read> ln_dy: array<f32>;
@group(0) @binding(2) var<storage, read> ln_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> ln_dx: array<f32>;
@group(0) @binding(4) var<storage, read_write> ln_part: array<f32>;   // split: [z, N, I] raw sums
var<workgroup> ln_dy_sh: array<array<vec4<f32>, 4>, 64>;  // [row][o quad], 16 o
var<workgroup> ln_w_sh: array<array<vec4<f32>, 16>, 16>;   // [o][column quad], 64 columns

fn ln_weight(e: u32) -> f32 {   // element e of W, row-major
    if (LN_BF16) {
        let word = ln_w[e >> 1u];
        return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (e & 1u) == 1u));
    }
    return bitcast<f32>(ln_w[e]);
}

// A 64x64 tile of dx per workgroup; thread (tx, ty) owns rows ty + 16a (a < 4) and the
// four columns 4tx .. 4tx+3, as four vec4 sums in named variables (see bitlinear above).
@compute @workgroup_size(16, 16)
fn linear_backward_input(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let i0 = wid.x * 64u;
    let N = ln_p.n;
    let I = ln_p.i;
    let O = ln_p.o;
    let oend = min(O, (wid.z + 1u) * ln_p.ko);            // this z's slice of the outputs
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var o0 = wid.z * ln_p.ko; o0 < oend; o0 += 16u) {
        for (var m = 0u; m < 4u; m++) {
            let e = lid + 256u * m;
            let rr = e / 16u;         // dy tile: 64 rows x 16 o, coalesced along o
            let oo = e % 16u;
            var dv = 0.0;
            if (n0 + rr < N && o0 + oo < oend) { dv = ln_dy[(n0 + rr) * ln_p.ld_dy + o0 + oo]; }
            ln_dy_sh[rr][oo / 4u][oo % 4u] = dv;
            let wo = e / 64u;         // w tile: 16 o x 64 cols, coalesced along cols
            let wc = e % 64u;
            var wv = 0.0;
            if (o0 + wo < oend && i0 + wc < I) { wv = ln_weight((o0 + wo) * I + i0 + wc); }
            ln_w_sh[wo][wc / 4u][wc % 4u] = wv;
        }
        workgroupBarrier();
        for (var oq = 0u; oq < 4u; oq++) {
            let d0 = ln_dy_sh[ty][oq];
            let d1 = ln_dy_sh[ty + 16u][oq];
            let d2 = ln_dy_sh[ty + 32u][oq];
            let d3 = ln_dy_sh[ty + 48u][oq];
            var w = ln_w_sh[oq * 4u][tx];
            a0 += d0.x * w; a1 += d1.x * w; a2 += d2.x * w; a3 += d3.x * w;
            w = ln_w_sh[oq * 4u + 1u][tx];
            a0 += d0.y * w; a1 += d1.y * w; a2 += d2.y * w; a3 += d3.y * w;
            w = ln_w_sh[oq * 4u + 2u][tx];
            a0 += d0.z * w; a1 += d1.z * w; a2 += d2.z * w; a3 += d3.z * w;
            w = ln_w_sh[oq * 4u + 3u][tx];
            a0 += d0.w * w; a1 += d1.w * w; a2 += d2.w * w; a3 += d3.w * w;
        }
        workgroupBarrier();
    }
    ln_store(n0 + ty, i0 + 4u * tx, a0, wid.z);
    ln_store(n0 + ty + 16u, i0 + 4u * tx, a1, wid.z);
    ln_store(n0 + ty + 32u, i0 + 4u * tx, a2, wid.z);
    ln_store(n0 + ty + 48u, i0 + 4u * tx, a3, wid.z);
}

fn ln_store(n: u32, i0: u32, acc: vec4<f32>, z: u32) {
    if (n >= ln_p.n) { return; }
    for (var c = 0u; c < 4u; c++) {
        let i = i0 + c;
        if (i < ln_p.i) {
            let j = n * ln_p.i + i;
            if (ln_p.split != 0u) { ln_part[z * ln_p.n * ln_p.i + j] = acc[c]; continue; }
            let g = ln_p.scale * acc[c];
            if (ln_p.accumulate != 0u) { ln_dx[j] = ln_dx[j] + g; } else { ln_dx[j] = g; }
        }
    }
}

// ============================================================================ relu^2 gating
struct GateParams { count: u32 };
@group(0) @binding(0) var<uniform> gt_p: GateParams;
@group(0) @binding(1) var<storage, read> gt_dh: array<f32>;
@group(0) @binding(2) var<storage, read> gt_g: array<f32>;
@group(0) @binding(3) var<storage, read> gt_u: array<f32>;
@group(0) @binding(4) var<storage, read_write> gt_dg: array<f32>;
@group(0) @binding(5) var<storage, read_write> gt_du: array<f32>;

@compute @workgroup_size(WG)
fn relu2_gating_backward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nw: vec3<u32>) {
    let k = (wid.x + wid.y * nw.x) * WG + lid.x;
    if (k >= gt_p.count) { return; }
    let a = max(gt_g[k], 0.0);
    let dh = gt_dh[k];
    gt_dg[k] = 2.0 * a * gt_u[k] * dh;
    gt_du[k] = a * a * dh;
}

// ============================================================================ rope
struct RopeParams { n: u32, t: u32, h: u32, d: u32 };
@group(0) @binding(0) var<uniform> rp_p: RopeParams;
@group(0) @binding(1) var<storage, read_write> rp_g: array<f32>;
@group(0) @binding(2) var<storage, read> rp_cos: array<f32>;
@group(0) @binding(3) var<storage, read> rp_sin: array<f32>;

@compute @workgroup_size(WG)
fn rope_backward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nw: vec3<u32>) {
    let half = rp_p.d / 2u;
    let k = (wid.x + wid.y * nw.x) * WG + lid.x;  // = (n * H + h) * D/2 + j
    if (k >= rp_p.n * rp_p.h * half) { return; }
    let j = k % half;
    let nh = k / half;
    let t = (nh / rp_p.h) % rp_p.t;
    let c = rp_cos[t * half + j];
    let s = rp_sin[t * half + j];
    let i0 = nh * rp_p.d + j;
    let a = rp_g[i0];
    let b = rp_g[i0 + half];
    rp_g[i0] = a * c + b * s;
    rp_g[i0 + half] = b * c - a * s;
}

// ============================================================================ attention
struct AttParams { b: u32, t: u32, h: u32, hkv: u32, d: u32, scale: f32 };
const WA: u32 = 64u;
const MAXD: u32 = 256u;
const NEG_BIG: f32 = -3.0e38;
var<workgroup> at_row0: array<f32, MAXD>;   // q_i (dq pass) or k_j (dkv pass)
var<workgroup> at_row1: array<f32, MAXD>;   // dout_i (dq pass) or v_j (dkv pass)
var<workgroup> at_ra: array<f32, WA>;
var<workgroup> at_rb: array<f32, WA>;

fn at_sum(lid: u32, v: f32) -> f32 {
    at_ra[lid] = v;
    workgroupBarrier();
    for (var s = WA / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) { at_ra[lid] += at_ra[lid + s]; }
        workgroupBarrier();
    }
    let total = at_ra[0];
    workgroupBarrier();
    return total;
}

@group(0) @binding(0) var<uniform> aq_p: AttParams;
@group(0) @binding(1) var<storage, read> aq_do: array<f32>;
@group(0) @binding(2) var<storage, read> aq_q: array<f32>;
@group(0) @binding(3) var<storage, read> aq_k: array<f32>;
@group(0) @binding(4) var<storage, read> aq_v: array<f32>;
@group(0) @binding(5) var<storage, read_write> aq_dq: array<f32>;
@group(0) @binding(6) var<storage, read_write> aq_stats: array<f32>;

fn aq_dot_k(row: u32, D: u32) -> f32 {   // q_i . k[row], q_i in at_row0
    var s = 0.0;
    for (var d = 0u; d < D; d++) { s += at_row0[d] * aq_k[row + d]; }
    return s;
}
fn aq_dot_v(row: u32, D: u32) -> f32 {   // dout_i . v[row], dout_i in at_row1
    var s = 0.0;
    for (var d = 0u; d < D; d++) { s += at_row1[d] * aq_v[row + d]; }
    return s;
}

@compute @workgroup_size(WA)
fn attention_backward_dq(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nw: vec3<u32>) {
    let p = aq_p;
    let lid = lid3.x;
    let D = p.d;
    let kidx = wid.x + wid.y * nw.x;      // = n * H + h
    if (kidx >= p.b * p.t * p.h) { return; }
    let n = kidx / p.h;
    let h = kidx % p.h;
    let t = n % p.t;
    let first = n - t;                    // row of position 0 of this sequence
    let g = h / (p.h / p.hkv);
    let qoff = kidx * D;                  // = n * H*D + h*D
    let kv_stride = p.hkv * D;
    let kv_col = g * D;
    for (var d = lid; d < D; d += WA) { at_row0[d] = aq_q[qoff + d]; at_row1[d] = aq_do[qoff + d]; }
    workgroupBarrier();

    // sweep 1: lse over keys 0..t (online max / sum per thread, then combine)
    var m = NEG_BIG;
    var l = 0.0;
    for (var j = lid; j <= t; j += WA) {
        let s = p.scale * aq_dot_k((first + j) * kv_stride + kv_col, D);
        if (s > m) { l = l * exp(m - s) + 1.0; m = s; } else { l += exp(s - m); }
    }
    at_ra[lid] = m;
    at_rb[lid] = l;
    workgroupBarrier();
    for (var s = WA / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let m1 = at_ra[lid];
            let m2 = at_ra[lid + s];
            let mm = max(m1, m2);
            at_rb[lid] = at_rb[lid] * exp(m1 - mm) + at_rb[lid + s] * exp(m2 - mm);
            at_ra[lid] = mm;
        }
        workgroupBarrier();
    }
    let lse = at_ra[0] + log(at_rb[0]);
    workgroupBarrier();

    // sweep 2: Dsum = sum_j P dP
    var di = 0.0;
    for (var j = lid; j <= t; j += WA) {
        let row = (first + j) * kv_stride + kv_col;
        di += exp(p.scale * aq_dot_k(row, D) - lse) * aq_dot_v(row, D);
    }
    let dsum = at_sum(lid, di);

    // sweep 3: dq = scale * sum_j dS_j k_j, 64 keys at a time; thread lid owns dims
    // lid + 64e (e < 4), its sums in named variables (a loop-indexed local array went
    // to memory on NVIDIA's Vulkan compiler)
    var acc0 = 0.0;
    var acc1 = 0.0;
    var acc2 = 0.0;
    var acc3 = 0.0;
    for (var j0 = 0u; j0 <= t; j0 += WA) {
        let j = j0 + lid;
        var ds = 0.0;
        if (j <= t) {
            let row = (first + j) * kv_stride + kv_col;
            let pr = exp(p.scale * aq_dot_k(row, D) - lse);
            ds = pr * (aq_dot_v(row, D) - dsum);
        }
        at_rb[lid] = ds;
        workgroupBarrier();
        let cnt = min(WA, t + 1u - j0);
        for (var jj = 0u; jj < cnt; jj++) {
            let w = at_rb[jj];
            let kb = (first + j0 + jj) * kv_stride + kv_col;
            acc0 += w * aq_k[kb + min(lid, D - 1u)];
            if (D > WA) { acc1 += w * aq_k[kb + min(lid + WA, D - 1u)]; }
            if (D > 2u * WA) {
                acc2 += w * aq_k[kb + min(lid + 2u * WA, D - 1u)];
                acc3 += w * aq_k[kb + min(lid + 3u * WA, D - 1u)];
            }
        }
        workgroupBarrier();
    }
    let accs = vec4<f32>(acc0, acc1, acc2, acc3);
    for (var e = 0u; e < 4u; e++) {
        let d = lid + e * WA;
        if (d < D) { aq_dq[qoff + d] = p.scale * accs[e]; }
    }
    if (lid == 0u) { aq_stats[2u * kidx] = lse; aq_stats[2u * kidx + 1u] = dsum; }
}

@group(0) @binding(0) var<uniform> ak_p: AttParams;
@group(0) @binding(1) var<storage, read> ak_do: array<f32>;
@group(0) @binding(2) var<storage, read> ak_q: array<f32>;
@group(0) @binding(3) var<storage, read> ak_k: array<f32>;
@group(0) @binding(4) var<storage, read> ak_v: array<f32>;
@group(0) @binding(5) var<storage, read> ak_stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> ak_dk: array<f32>;
@group(0) @binding(7) var<storage, read_write> ak_dv: array<f32>;

@compute @workgroup_size(WA)
fn attention_backward_dkv(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ak_p;
    let lid = lid3.x;
    let D = p.d;
    let kidx = wid.x + wid.y * nw.x;      // = n * Hkv + g   (n: the key's row)
    if (kidx >= p.b * p.t * p.hkv) { return; }
    let n = kidx / p.hkv;
    let g = kidx % p.hkv;
    let j = n % p.t;
    let first = n - j;
    let rep = p.h / p.hkv;
    let q_stride = p.h * D;
    let kvoff = kidx * D;
    for (var d = lid; d < D; d += WA) { at_row0[d] = ak_k[kvoff + d]; at_row1[d] = ak_v[kvoff + d]; }
    workgroupBarrier();

    var acck = vec4<f32>(0.0);   // dims lid + 64e; vectors, not loop-indexed arrays (see dq)
    var accv = vec4<f32>(0.0);
    for (var r = 0u; r < rep; r++) {
        let h = g * rep + r;
        for (var i0 = j; i0 < p.t; i0 += WA) {
            let i = i0 + lid;
            var pr = 0.0;
            var ds = 0.0;
            if (i < p.t) {
                let qrow = (first + i) * q_stride + h * D;
                var s = 0.0;
                var dp = 0.0;
                for (var d = 0u; d < D; d++) {
                    s += ak_q[qrow + d] * at_row0[d];
                    dp += ak_do[qrow + d] * at_row1[d];
                }
                let st = 2u * ((first + i) * p.h + h);
                pr = exp(p.scale * s - ak_stats[st]);
                ds = pr * (dp - ak_stats[st + 1u]);
            }
            at_ra[lid] = pr;
            at_rb[lid] = ds;
            workgroupBarrier();
            let cnt = min(WA, p.t - i0);
            let d0 = min(lid, D - 1u);
            let d1 = min(lid + WA, D - 1u);
            let d2 = min(lid + 2u * WA, D - 1u);
            let d3 = min(lid + 3u * WA, D - 1u);
            for (var ii = 0u; ii < cnt; ii++) {
                let qrow = (first + i0 + ii) * q_stride + h * D;
                let pa = at_ra[ii];
                let pb = at_rb[ii];
                accv.x += pa * ak_do[qrow + d0];
                acck.x += pb * ak_q[qrow + d0];
                if (D > WA) {
                    accv.y += pa * ak_do[qrow + d1];
                    acck.y += pb * ak_q[qrow + d1];
                }
                if (D > 2u * WA) {
                    accv.z += pa * ak_do[qrow + d2];
                    acck.z += pb * ak_q[qrow + d2];
                    accv.w += pa * ak_do[qrow + d3];
                    acck.w += pb * ak_q[qrow + d3];
                }
            }
            workgroupBarrier();
        }
    }
    for (var e = 0u; e < 4u; e++) {
        let d = lid + e * WA;
        if (d < D) { ak_dk[kvoff + d] = p.scale * acck[e]; ak_dv[kvoff + d] = accv[e]; }
    }
}
