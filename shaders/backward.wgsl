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
//     dispatch: one workgroup (256) per (sequence, block of 8 query rows, h):
//     B*ceil(T/8)*H workgroups split over x, y. Two sweeps over the key blocks up to
//     the diagonal: (lse, Dsum) by an online softmax, then dS and dq.
//   attention_backward_dkv:
//     0 params (same) | 1 dout read | 2 q read | 3 k read | 4 v read |
//     5 stats[N, H, 2] read | 6 dk[N, Hkv*D] write | 7 dv[N, Hkv*D] write
//     dispatch: one workgroup (256) per (sequence, block of 8 keys, kv head):
//     B*ceil(T/8)*Hkv workgroups split over x, y; it sweeps the group's heads and the
//     query blocks from the diagonal on.

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
// Tiles of AO owned rows (queries for dq, keys for dkv) x AS streamed rows: thread
// (o, s) = (lid / AS, lid % AS) computes one s and dP over 32-dim chunks of q, dout,
// k, v staged in workgroup memory (rows padded to 9 vec4s against bank conflicts);
// then P / dS of the tile go through workgroup memory and thread (o, s) updates owned
// row o's dims 4s + 128e .. +3 (e < 2; vec4 sums in named variables). Few owned rows
// keep the longest workgroup short (the causal triangle makes the work uneven).
struct AttParams { b: u32, t: u32, h: u32, hkv: u32, d: u32, scale: f32 };
const AO: u32 = 8u;           // owned rows per workgroup
const AS: u32 = 32u;          // streamed rows per tile (AO * AS = 256 threads)
const AC: u32 = 32u;          // head dims per staged chunk
const AP: u32 = 9u;           // vec4s per staged row (AC / 4 + 1 pad)
const NEG_BIG: f32 = -3.0e38;
var<workgroup> at_oa: array<vec4<f32>, 72>;    // [AO, AP] owned rows: q (dq) or k (dkv)
var<workgroup> at_ob: array<vec4<f32>, 72>;    //   dout (dq) or v (dkv)
var<workgroup> at_sa: array<vec4<f32>, 288>;   // [AS, AP] streamed rows: k (dq) or q (dkv)
var<workgroup> at_sb: array<vec4<f32>, 288>;   //   v (dq) or dout (dkv)
var<workgroup> at_p: array<f32, 256>;          // [AO, AS] P, or scratch
var<workgroup> at_ds: array<f32, 256>;         // dS, or scratch
var<workgroup> at_x: array<f32, 256>;          // scratch
var<workgroup> at_row: array<f32, 16>;         // lse, Dsum of the block's query rows (dq)

fn at_stage(e: u32, x: f32, dst: u32) {   // element e of a staged [rows, AC] chunk
    let i = (e / AC) * AP + (e % AC) / 4u;
    let c = e % 4u;
    if (dst == 0u) { at_oa[i][c] = x; } else if (dst == 1u) { at_ob[i][c] = x; }
    else if (dst == 2u) { at_sa[i][c] = x; } else { at_sb[i][c] = x; }
}

fn at_dots(o: u32, s: u32) -> vec2<f32> {   // (oa . sa, ob . sb) over the staged chunk
    var x = 0.0;
    var y = 0.0;
    for (var c = 0u; c < AC / 4u; c++) {
        x += dot(at_oa[o * AP + c], at_sa[s * AP + c]);
        y += dot(at_ob[o * AP + c], at_sb[s * AP + c]);
    }
    return vec2<f32>(x, y);
}

@group(0) @binding(0) var<uniform> aq_p: AttParams;
@group(0) @binding(1) var<storage, read> aq_do: array<f32>;
@group(0) @binding(2) var<storage, read> aq_q: array<f32>;
@group(0) @binding(3) var<storage, read> aq_k: array<f32>;
@group(0) @binding(4) var<storage, read> aq_v: array<f32>;
@group(0) @binding(5) var<storage, read_write> aq_dq: array<f32>;
@group(0) @binding(6) var<storage, read_write> aq_stats: array<f32>;

// (q_i . k_j, dout_i . v_j) for thread (o, s): query i = i0 + o, key j = j0 + s.
// qo, ko: offsets of the tiles' first rows; nq, nk: their valid rows (others read 0)
fn aq_scores(qo: u32, qs: u32, nq: u32, ko: u32, ks: u32, nk: u32, D: u32, lid: u32) -> vec2<f32> {
    var sd = vec2<f32>(0.0);
    for (var d0 = 0u; d0 < D; d0 += AC) {
        workgroupBarrier();   // the previous chunk (and tile) has been read
        for (var e = lid; e < AS * AC; e += AO * AS) {
            let r = e / AC;
            let d = d0 + e % AC;
            var a = 0.0;
            var b = 0.0;
            if (r < nk && d < D) { a = aq_k[ko + r * ks + d]; b = aq_v[ko + r * ks + d]; }
            at_stage(e, a, 2u);
            at_stage(e, b, 3u);
            if (e < AO * AC) {
                var c = 0.0;
                var w = 0.0;
                if (r < nq && d < D) { c = aq_q[qo + r * qs + d]; w = aq_do[qo + r * qs + d]; }
                at_stage(e, c, 0u);
                at_stage(e, w, 1u);
            }
        }
        workgroupBarrier();
        sd += at_dots(lid / AS, lid % AS);
    }
    return sd;
}

fn aq_k4(o: u32, D: u32) -> vec4<f32> {   // k[o .. o+3], clamped to the row's last dim (D: dims left)
    return vec4<f32>(aq_k[o], aq_k[o + min(1u, D - 1u)], aq_k[o + min(2u, D - 1u)], aq_k[o + min(3u, D - 1u)]);
}

@compute @workgroup_size(AO * AS)
fn attention_backward_dq(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nw: vec3<u32>) {
    let p = aq_p;
    let D = p.d;
    let nqb = (p.t + AO - 1u) / AO;
    let kidx = wid.x + wid.y * nw.x;      // = (b * nqb + block) * H + h
    if (kidx >= p.b * nqb * p.h) { return; }
    let h = kidx % p.h;
    let bq = kidx / p.h;
    let i0 = (nqb - 1u - bq % nqb) * AO;  // longest rows first
    let first = (bq / nqb) * p.t;         // row of position 0 of this sequence
    let nq = min(AO, p.t - i0);
    let g = h / (p.h / p.hkv);
    let HD = p.h * D;
    let KD = p.hkv * D;
    let qo = (first + i0) * HD + h * D;
    let o = lid / AS;                     // query row in the tile
    let s = lid % AS;                     // key in the tile; dims 4s + 128e when accumulating
    let i = i0 + o;
    let nkb = (i0 + nq + AS - 1u) / AS;   // key blocks up to the last row's diagonal

    // sweep 1: per thread an online (max m, sum l, sum u of P dP) over its keys
    var m = NEG_BIG;
    var l = 0.0;
    var u = 0.0;
    for (var kb = 0u; kb < nkb; kb++) {
        let j0 = kb * AS;
        let sd = aq_scores(qo, HD, nq, (first + j0) * KD + g * D, KD, min(AS, p.t - j0), D, lid);
        if (j0 + s <= i && i < p.t) {
            let sc = p.scale * sd.x;
            if (sc > m) { let c = exp(m - sc); l = l * c + 1.0; u = u * c + sd.y; m = sc; }
            else { let e = exp(sc - m); l += e; u += e * sd.y; }
        }
    }
    at_p[lid] = m;
    at_ds[lid] = l;
    at_x[lid] = u;
    workgroupBarrier();
    if (s == 0u) {   // combine row o's partials: lse = M + log L, Dsum = U / L
        var mm = NEG_BIG;
        for (var c = 0u; c < AS; c++) { mm = max(mm, at_p[lid + c]); }
        var ll = 0.0;
        var uu = 0.0;
        for (var c = 0u; c < AS; c++) {
            let f = exp(at_p[lid + c] - mm);
            ll += at_ds[lid + c] * f;
            uu += at_x[lid + c] * f;
        }
        at_row[o] = mm + log(max(ll, 1e-30));
        at_row[AO + o] = uu / max(ll, 1e-30);
    }
    workgroupBarrier();
    let lse = at_row[o];
    let dsum = at_row[AO + o];

    // sweep 2: dS tile by tile, dq_i += dS_ij k_j
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    let d0 = min(4u * s, D - 1u);         // clamped: sums past D are computed, never written
    let d1 = min(4u * s + 128u, D - 1u);
    for (var kb = 0u; kb < nkb; kb++) {
        let j0 = kb * AS;
        let nk = min(AS, p.t - j0);
        let sd = aq_scores(qo, HD, nq, (first + j0) * KD + g * D, KD, nk, D, lid);
        var ds = 0.0;
        if (j0 + s <= i && i < p.t) { ds = exp(p.scale * sd.x - lse) * (sd.y - dsum); }
        at_ds[lid] = ds;
        workgroupBarrier();
        let last = min(nk, i0 + nq - j0);   // keys past the block's last row have dS = 0
        for (var jj = 0u; jj < last; jj++) {
            let w = at_ds[o * AS + jj];
            let ko = (first + j0 + jj) * KD + g * D;
            acc0 += w * aq_k4(ko + d0, D - d0);
            if (D > 128u) { acc1 += w * aq_k4(ko + d1, D - d1); }
        }
    }
    if (i < p.t) {
        let r = (first + i) * HD + h * D;
        for (var c = 0u; c < 4u; c++) {
            if (4u * s + c < D) { aq_dq[r + 4u * s + c] = p.scale * acc0[c]; }
            if (4u * s + 128u + c < D) { aq_dq[r + 4u * s + 128u + c] = p.scale * acc1[c]; }
        }
        if (s == 0u) { aq_stats[2u * ((first + i) * p.h + h)] = lse; aq_stats[2u * ((first + i) * p.h + h) + 1u] = dsum; }
    }
}

@group(0) @binding(0) var<uniform> ak_p: AttParams;
@group(0) @binding(1) var<storage, read> ak_do: array<f32>;
@group(0) @binding(2) var<storage, read> ak_q: array<f32>;
@group(0) @binding(3) var<storage, read> ak_k: array<f32>;
@group(0) @binding(4) var<storage, read> ak_v: array<f32>;
@group(0) @binding(5) var<storage, read> ak_stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> ak_dk: array<f32>;
@group(0) @binding(7) var<storage, read_write> ak_dv: array<f32>;

// (k_j . q_i, v_j . dout_i) for thread (o, s): key j = j0 + o, query i = i0 + s
fn ak_scores(qo: u32, qs: u32, nq: u32, ko: u32, ks: u32, nk: u32, D: u32, lid: u32) -> vec2<f32> {
    var sd = vec2<f32>(0.0);
    for (var d0 = 0u; d0 < D; d0 += AC) {
        workgroupBarrier();
        for (var e = lid; e < AS * AC; e += AO * AS) {
            let r = e / AC;
            let d = d0 + e % AC;
            var a = 0.0;
            var b = 0.0;
            if (r < nq && d < D) { a = ak_q[qo + r * qs + d]; b = ak_do[qo + r * qs + d]; }
            at_stage(e, a, 2u);
            at_stage(e, b, 3u);
            if (e < AO * AC) {
                var c = 0.0;
                var w = 0.0;
                if (r < nk && d < D) { c = ak_k[ko + r * ks + d]; w = ak_v[ko + r * ks + d]; }
                at_stage(e, c, 0u);
                at_stage(e, w, 1u);
            }
        }
        workgroupBarrier();
        sd += at_dots(lid / AS, lid % AS);
    }
    return sd;
}

fn ak_q4(o: u32, D: u32) -> vec4<f32> {
    return vec4<f32>(ak_q[o], ak_q[o + min(1u, D - 1u)], ak_q[o + min(2u, D - 1u)], ak_q[o + min(3u, D - 1u)]);
}
fn ak_do4(o: u32, D: u32) -> vec4<f32> {
    return vec4<f32>(ak_do[o], ak_do[o + min(1u, D - 1u)], ak_do[o + min(2u, D - 1u)], ak_do[o + min(3u, D - 1u)]);
}

@compute @workgroup_size(AO * AS)
fn attention_backward_dkv(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ak_p;
    let D = p.d;
    let nkb = (p.t + AO - 1u) / AO;
    let kidx = wid.x + wid.y * nw.x;      // = (b * nkb + block) * Hkv + g
    if (kidx >= p.b * nkb * p.hkv) { return; }
    let g = kidx % p.hkv;
    let bk = kidx / p.hkv;
    let j0 = (bk % nkb) * AO;             // first blocks have the most queries: they go first
    let first = (bk / nkb) * p.t;
    let nk = min(AO, p.t - j0);
    let rep = p.h / p.hkv;
    let HD = p.h * D;
    let KD = p.hkv * D;
    let ko = (first + j0) * KD + g * D;
    let o = lid / AS;                     // key in the tile
    let s = lid % AS;                     // query in the tile; dims 4s + 128e when accumulating
    let j = j0 + o;

    var acck0 = vec4<f32>(0.0);
    var acck1 = vec4<f32>(0.0);
    var accv0 = vec4<f32>(0.0);
    var accv1 = vec4<f32>(0.0);
    let d0 = min(4u * s, D - 1u);         // clamped: sums past D are computed, never written
    let d1 = min(4u * s + 128u, D - 1u);
    for (var r = 0u; r < rep; r++) {
        let h = g * rep + r;
        for (var i0 = j0; i0 < p.t; i0 += AS) {   // query blocks from the diagonal on
            let nq = min(AS, p.t - i0);
            let sd = ak_scores((first + i0) * HD + h * D, HD, nq, ko, KD, nk, D, lid);
            let i = i0 + s;
            var pr = 0.0;
            var ds = 0.0;
            if (j <= i && i < p.t) {
                let st = 2u * ((first + i) * p.h + h);
                pr = exp(p.scale * sd.x - ak_stats[st]);
                ds = pr * (sd.y - ak_stats[st + 1u]);
            }
            at_p[lid] = pr;
            at_ds[lid] = ds;
            workgroupBarrier();
            for (var ii = 0u; ii < nq; ii++) {
                let pa = at_p[o * AS + ii];
                let pb = at_ds[o * AS + ii];
                let qo = (first + i0 + ii) * HD + h * D;
                accv0 += pa * ak_do4(qo + d0, D - d0);
                acck0 += pb * ak_q4(qo + d0, D - d0);
                if (D > 128u) { accv1 += pa * ak_do4(qo + d1, D - d1); acck1 += pb * ak_q4(qo + d1, D - d1); }
            }
        }
    }
    if (j < p.t) {
        let r = ko + o * KD;
        for (var c = 0u; c < 4u; c++) {
            if (4u * s + c < D) { ak_dk[r + 4u * s + c] = p.scale * acck0[c]; ak_dv[r + 4u * s + c] = accv0[c]; }
            if (4u * s + 128u + c < D) {
                ak_dk[r + 4u * s + 128u + c] = p.scale * acck1[c];
                ak_dv[r + 4u * s + 128u + c] = accv1[c];
            }
        }
    }
}
