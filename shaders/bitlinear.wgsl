// bitlinear.wgsl — BitNet b1.58's BitLinear, y = actquant(x) (t * scale)^T, forward
// in two passes so one quantised input feeds several projections (q, k, v; gate, up),
// and its input gradient. The frozen ternary weight gets no weight gradient.
// t comes from w_packed[O, ceil(I/16)] u32, decoded on the fly by the prelude's
// ternary_at / ternary_quad (layout there); it is never expanded in memory.
//
// actquant_forward   per-token absmax int8 quantisation (HF ActQuant):
//   s[n] = 127 / max(max_i |x[n, i]|, 1e-5),  xq[n, i] = clamp(round(x[n, i] * s[n]), -128, 127)
//   WGSL round() rounds half to even, like torch.round. xq holds the integers as f32.
//   0 params ActQuantParams {N, I} | 1 x[N, I] read | 2 xq[N, I] write | 3 s[N] write
//   dispatch: one workgroup (256) per row: N workgroups split over x, y
//
// actquant_forward_i8   the same, xq written packed (prelude: xq8[N, 4*ceil(I/16)] u32,
//   for bitlinear_i8.wgsl): a thread quantises the 4 columns of each word it owns.
//   0 params ActQuantParams {N, I} | 1 x[N, I] read | 2 xq8 write | 3 s[N] write
//   dispatch: as actquant_forward
//
// bitlinear_forward   y[n, o] (= or +=) (sum_i xq[n, i] t[o, i]) * scale / s[n]
//   The dot products of integers are exact in f32 (|sum| < 2^24 for I < 131072), so
//   every tiling gives the same bits.
//   accumulate = 1 adds into y (o_proj and down_proj write into the residual stream).
//   0 params BitlinearParams {N, I, O, scale, accumulate, kw, split} | 1 xq[N, I] read |
//   2 s[N] read | 3 w_packed[O, ceil(I/16)] u32 read | 4 y[N, O] read_write |
//   5 part[slices, N, O] read_write
//   Split-K (splitk.wgsl): workgroup z sums words [z*kw, (z+1)*kw) only (kw a multiple
//   of 4); with split = 1 it writes the raw integer sums to part[z, N, O] and
//   splitk_reduce finishes (same bits). part is bound, unused, when split = 0.
//   dispatch: groups (ceil(O/64), ceil(N/64), slices); a 16x16 workgroup owns a 64 x 64 tile of
//   y, thread (tx, ty) rows ty + 16a and outputs tx + 16b (a, b < 4), 16 sums in
//   registers. xq is staged through workgroup memory 64 columns (4 words) at a time and
//   read back as vec4; each thread decodes its four outputs' words into vec4s of
//   ternary weights, so one x load feeds 16 multiply-adds (a load per multiply-add made
//   the simpler kernel below several times slower on every backend measured).
//   The sums are named variables, not a function-local array: an array indexed in a
//   loop lives in memory on NVIDIA's Vulkan compiler, and this kernel ran 1.7-1.9x
//   slower on an H200 that way (bench/matmul.py; the input gradient: 6.5x).
//
// bitlinear_forward_rows   the same for a few rows (decoding: N = batch size), no split:
//   bindings 0-4 as bitlinear_forward.
//   dispatch: groups (ceil(O/64), ceil(N/8)); a workgroup (64) owns 64 outputs x 8 rows,
//   a thread one output for 8 rows; xq is staged through workgroup memory 256 columns
//   (16 words) at a time.
//
// bitlinear_backward_input   dx (= or +=) dy Wq, Wq = t[O, I] * scale
//   Straight-through estimator at both quantisers (HF's ActQuant / WeightQuant
//   backward return the gradient unchanged), so dx = dy Wq = scale * dy t.
//   0 params BitlinearBackwardParams {N, I, O, scale, accumulate, ko, split} |
//   1 dy[N, O] read | 2 w_packed[O, ceil(I/16)] u32 read | 3 dx[N, I] read_write |
//   4 part[slices, N, I] read_write
//   Split-K: workgroup z sums o in [z*ko, (z+1)*ko) only (ko a multiple of 16); with
//   split = 1 it writes its raw sums to part[z, N, I] and splitk_reduce scales and adds
//   them (part is bound, unused, when split = 0).
//   dispatch: groups (ceil(ceil(I/16) / 8), ceil(N/64), slices); a 16x16 workgroup owns
//   64 rows x 8 words (128 columns) of dx; per 16 o the words are decoded once into
//   workgroup memory as vec4s of ternary weights, and thread (tx, ty) keeps rows
//   ty + 16a x column quads tx, tx + 16 (8 vec4 sums in named variables, as above).

struct ActQuantParams { n: u32, i: u32 };
@group(0) @binding(0) var<uniform> qp: ActQuantParams;
@group(0) @binding(1) var<storage, read> q_x: array<f32>;
@group(0) @binding(2) var<storage, read_write> q_xq: array<f32>;
@group(0) @binding(3) var<storage, read_write> q_s: array<f32>;

@compute @workgroup_size(WG)
fn actquant_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= qp.n) { return; }
    let base = n * qp.i;
    var m = 0.0;
    for (var i = lid; i < qp.i; i += WG) { m = max(m, abs(q_x[base + i])); }
    let s = 127.0 / max(wg_max(lid, m, WG), 1e-5);
    for (var i = lid; i < qp.i; i += WG) { q_xq[base + i] = clamp(round(q_x[base + i] * s), -128.0, 127.0); }
    if (lid == 0u) { q_s[n] = s; }
}

@group(0) @binding(0) var<uniform> q8_p: ActQuantParams;
@group(0) @binding(1) var<storage, read> q8_x: array<f32>;
@group(0) @binding(2) var<storage, read_write> q8_xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> q8_s: array<f32>;

fn q8_at(base: u32, c: u32, s: f32) -> f32 {   // column c of the row at base, quantised (0 past I)
    if (c >= q8_p.i) { return 0.0; }
    return quant_i8(q8_x[base + c], s);
}

@compute @workgroup_size(WG)
fn actquant_forward_i8(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= q8_p.n) { return; }
    let base = n * q8_p.i;
    var m = 0.0;
    for (var i = lid; i < q8_p.i; i += WG) { m = max(m, abs(q8_x[base + i])); }
    let s = 127.0 / max(wg_max(lid, m, WG), 1e-5);
    let words = 4u * ((q8_p.i + 15u) / 16u);
    for (var e = lid; e < words; e += WG) {
        let c = (e / 4u) * 16u + e % 4u;   // byte j: column c + 4j
        q8_xq[n * words + e] = pack_i8(vec4<f32>(q8_at(base, c, s), q8_at(base, c + 4u, s),
                                                 q8_at(base, c + 8u, s), q8_at(base, c + 12u, s)));
    }
    if (lid == 0u) { q8_s[n] = s; }
}

const TO: u32 = 64u;   // outputs per workgroup (one per thread)
const TN: u32 = 8u;    // rows per workgroup
const KW: u32 = 16u;   // packed words per staged chunk (256 columns)
struct BitlinearParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, kw: u32, split: u32 };
@group(0) @binding(0) var<uniform> lp: BitlinearParams;
@group(0) @binding(1) var<storage, read> l_xq: array<f32>;
@group(0) @binding(2) var<storage, read> l_s: array<f32>;
@group(0) @binding(3) var<storage, read> l_w: array<u32>;
@group(0) @binding(4) var<storage, read_write> l_y: array<f32>;
@group(0) @binding(5) var<storage, read_write> l_part: array<f32>;   // split: [z, N, O] raw sums
var<workgroup> l_xsh: array<array<f32, 256>, TN>;  // [row][column in chunk]

@compute @workgroup_size(TO)
fn bitlinear_forward_rows(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let o = wid.x * TO + lid;
    let n0 = wid.y * TN;
    let words = (lp.i + 15u) / 16u;
    var acc: array<f32, TN>;
    for (var r = 0u; r < TN; r++) { acc[r] = 0.0; }
    for (var w0 = 0u; w0 < words; w0 += KW) {
        // stage xq[n0 .. n0+TN, 16*w0 .. 16*w0 + 256] (zeros past the edges)
        for (var e = lid; e < TN * 256u; e += TO) {
            let r = e / 256u;
            let col = w0 * 16u + e % 256u;
            var v = 0.0;
            if (n0 + r < lp.n && col < lp.i) { v = l_xq[(n0 + r) * lp.i + col]; }
            l_xsh[r][e % 256u] = v;
        }
        workgroupBarrier();
        if (o < lp.o) {
            let wend = min(w0 + KW, words);
            for (var w = w0; w < wend; w++) {
                let word = l_w[o * words + w];
                let cb = (w - w0) * 16u;
                for (var k = 0u; k < 16u; k++) {
                    let t = ternary_at(word, k);
                    for (var r = 0u; r < TN; r++) { acc[r] += l_xsh[r][cb + k] * t; }
                }
            }
        }
        workgroupBarrier();
    }
    if (o >= lp.o) { return; }
    for (var r = 0u; r < TN; r++) {
        let n = n0 + r;
        if (n < lp.n) {
            let v = acc[r] * lp.scale / l_s[n];
            let a = n * lp.o + o;
            if (lp.accumulate != 0u) { l_y[a] = l_y[a] + v; } else { l_y[a] = v; }
        }
    }
}

var<workgroup> l_xt: array<array<vec4<f32>, 16>, 64>;  // [row][column quad], 64 columns

@compute @workgroup_size(16, 16)
fn bitlinear_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = lp.n;
    let I = lp.i;
    let O = lp.o;
    let words = (I + 15u) / 16u;
    let n0 = wid.y * 64u;
    let o0 = wid.x * 64u;
    let wend = min(words, (wid.z + 1u) * lp.kw);
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let ob0 = (o0 + tx) * words;
    let ob1 = (o0 + tx + 16u) * words;
    let ob2 = (o0 + tx + 32u) * words;
    let ob3 = (o0 + tx + 48u) * words;
    let ok0 = o0 + tx < O;
    let ok1 = o0 + tx + 16u < O;
    let ok2 = o0 + tx + 32u < O;
    let ok3 = o0 + tx + 48u < O;
    for (var w0 = wid.z * lp.kw; w0 < wend; w0 += 4u) {
        for (var m = 0u; m < 16u; m++) {
            let e = lid + 256u * m;
            let r = e / 64u;
            let c = w0 * 16u + e % 64u;
            var v = 0.0;
            if (n0 + r < N && c < I) { v = l_xq[(n0 + r) * I + c]; }
            l_xt[r][(e % 64u) / 4u][e % 4u] = v;
        }
        workgroupBarrier();
        for (var wd = 0u; wd < 4u; wd++) {
            let wi = w0 + wd;
            let inb = wi < wend;
            let w_0 = select(0x55555555u, l_w[ob0 + min(wi, words - 1u)], inb && ok0);
            let w_1 = select(0x55555555u, l_w[ob1 + min(wi, words - 1u)], inb && ok1);
            let w_2 = select(0x55555555u, l_w[ob2 + min(wi, words - 1u)], inb && ok2);
            let w_3 = select(0x55555555u, l_w[ob3 + min(wi, words - 1u)], inb && ok3);
            for (var q = 0u; q < 4u; q++) {
                let t0 = ternary_quad(w_0, q);
                let t1 = ternary_quad(w_1, q);
                let t2 = ternary_quad(w_2, q);
                let t3 = ternary_quad(w_3, q);
                let c = wd * 4u + q;
                let x0 = l_xt[ty][c];
                let x1 = l_xt[ty + 16u][c];
                let x2 = l_xt[ty + 32u][c];
                let x3 = l_xt[ty + 48u][c];
                acc0 += vec4<f32>(dot(x0, t0), dot(x0, t1), dot(x0, t2), dot(x0, t3));
                acc1 += vec4<f32>(dot(x1, t0), dot(x1, t1), dot(x1, t2), dot(x1, t3));
                acc2 += vec4<f32>(dot(x2, t0), dot(x2, t1), dot(x2, t2), dot(x2, t3));
                acc3 += vec4<f32>(dot(x3, t0), dot(x3, t1), dot(x3, t2), dot(x3, t3));
            }
        }
        workgroupBarrier();
    }
    bl_forward_store(n0 + ty, o0 + tx, acc0, wid.z);
    bl_forward_store(n0 + ty + 16u, o0 + tx, acc1, wid.z);
    bl_forward_store(n0 + ty + 32u, o0 + tx, acc2, wid.z);
    bl_forward_store(n0 + ty + 48u, o0 + tx, acc3, wid.z);
}

fn bl_forward_store(n: u32, o: u32, acc: vec4<f32>, z: u32) {
    if (n >= lp.n) { return; }
    for (var b = 0u; b < 4u; b++) {
        let oo = o + 16u * b;
        if (oo < lp.o) {
            let idx = n * lp.o + oo;
            if (lp.split != 0u) { l_part[z * lp.n * lp.o + idx] = acc[b]; continue; }
            let v = acc[b] * lp.scale / l_s[n];
            if (lp.accumulate != 0u) { l_y[idx] = l_y[idx] + v; } else { l_y[idx] = v; }
        }
    }
}

// ---------------------------------------------------------------------------- backward
struct BitlinearBackwardParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, ko: u32, split: u32 };
@group(0) @binding(0) var<uniform> bl_p: BitlinearBackwardParams;
@group(0) @binding(1) var<storage, read> bl_dy: array<f32>;
@group(0) @binding(2) var<storage, read> bl_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> bl_dx: array<f32>;
@group(0) @binding(4) var<storage, read_write> bl_part: array<f32>;   // split: [z, N, I] raw sums
var<workgroup> bl_dy_sh: array<array<vec4<f32>, 4>, 64>;  // [row][o quad], 16 o
var<workgroup> bl_w_sh: array<array<vec4<f32>, 32>, 16>;   // [o][column quad], 128 columns, decoded

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

// ---------------------------------------------------------------------------- CPU variants
// For WebGPU on a CPU (Device.kind "cpu": lavapipe, SwiftShader, ...), where a workgroup
// is a loop on one thread, SIMD across invocations: no workgroup memory, no barriers, no
// split-K; each invocation keeps an 8 x 16 tile in registers (eight mat4x4, see the
// prelude's row_dots16), so every loaded word or activation feeds 8 or 16
// multiply-adds. Rows and columns past the edges are clamped on load (padding weights
// are 0) and skipped on store.
//
// bitlinear_forward_cpu   as bitlinear_forward (same bits); bindings 0-4 as there (no part;
//   kw and split unused).
//   dispatch: groups (ceil(O / (CPU_WG*16)), ceil(N/8)); invocation j of workgroup (gx, gy)
//   owns rows 8gy .. 8gy+7 and outputs 16(gx*CPU_WG + j) .. +15.
//
// bitlinear_backward_input_cpu   as bitlinear_backward_input (f32 sums in another order);
//   bindings 0-3 as there (no part; ko and split unused).
//   dispatch: groups (ceil(ceil(I/16) / CPU_WG), ceil(N/8)); invocation j owns rows
//   8gy .. 8gy+7 and the 16 columns of packed word gx*CPU_WG + j.

// Override constants, per adapter (ops/bitlinear.py CPU_TILES; the defaults are lavapipe's):
// CPU_WG   invocations per workgroup (8 to 32 measured alike on lavapipe; SwiftShader, 4
//   lanes wide: 4 (-5%), 16 and 32 slower, and 4 or fewer rows per invocation slower too).
// CPU_FWD_COLUMNS   bitlinear_forward_cpu's inner product: false (lavapipe's), per column
//   quad four dot products per row (row_dots16); true (SwiftShader's: -22% there), per
//   column a scalar x times the column's 16 weights (one multiply-add per weight and row).
//   Integer sums, exact either way: the same bits.
override CPU_WG: u32 = 8u;
override CPU_FWD_COLUMNS: bool = false;
@group(0) @binding(0) var<uniform> cf_p: BitlinearParams;
@group(0) @binding(1) var<storage, read> cf_xq: array<f32>;
@group(0) @binding(2) var<storage, read> cf_s: array<f32>;
@group(0) @binding(3) var<storage, read> cf_w: array<u32>;
@group(0) @binding(4) var<storage, read_write> cf_y: array<f32>;

fn cf_x4(row: u32, c: u32) -> vec4<f32> {   // xq[row, c .. c+3], columns clamped to I-1 (their weights are 0)
    let b = min(row, cf_p.n - 1u) * cf_p.i;
    let im = cf_p.i - 1u;
    return vec4<f32>(cf_xq[b + min(c, im)], cf_xq[b + min(c + 1u, im)], cf_xq[b + min(c + 2u, im)],
                     cf_xq[b + min(c + 3u, im)]);
}

fn cf_x(row: u32, c: u32) -> f32 { return cf_xq[min(row, cf_p.n - 1u) * cf_p.i + c]; }

fn cf_col(w0: u32, w1: u32, w2: u32, w3: u32, k: u32) -> vec4<f32> {   // column k's weights of 4 outputs' words
    return vec4<f32>((vec4<u32>(w0, w1, w2, w3) >> vec4<u32>(2u * k)) & vec4<u32>(3u)) - 1.0;
}

fn cf_quads(w0: u32, w1: u32, w2: u32, w3: u32, q: u32) -> mat4x4<f32> {   // column quad q of 4 outputs' words
    return mat4x4<f32>(ternary_quad(w0, q), ternary_quad(w1, q), ternary_quad(w2, q), ternary_quad(w3, q));
}

@compute @workgroup_size(CPU_WG)
fn bitlinear_forward_cpu(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let words = (cf_p.i + 15u) / 16u;
    let n0 = wid.y * 8u;
    let o0 = (wid.x * CPU_WG + lid3.x) * 16u;
    var ob: array<u32, 16>;                           // word offsets of the 16 outputs' rows
    for (var b = 0u; b < 16u; b++) { ob[b] = min(o0 + b, cf_p.o - 1u) * words; }
    var a0 = mat4x4<f32>(); var a1 = mat4x4<f32>(); var a2 = mat4x4<f32>(); var a3 = mat4x4<f32>();
    var a4 = mat4x4<f32>(); var a5 = mat4x4<f32>(); var a6 = mat4x4<f32>(); var a7 = mat4x4<f32>();
    for (var w = 0u; w < words; w++) {
        var wd: array<u32, 16>;
        for (var b = 0u; b < 16u; b++) { wd[b] = cf_w[ob[b] + w]; }
        if (CPU_FWD_COLUMNS) {
            for (var k = 0u; k < 16u; k++) {
                let t = mat4x4<f32>(cf_col(wd[0], wd[1], wd[2], wd[3], k), cf_col(wd[4], wd[5], wd[6], wd[7], k),
                                    cf_col(wd[8], wd[9], wd[10], wd[11], k), cf_col(wd[12], wd[13], wd[14], wd[15], k));
                let c = min(w * 16u + k, cf_p.i - 1u);
                a0 += cf_x(n0, c) * t;      a1 += cf_x(n0 + 1u, c) * t; a2 += cf_x(n0 + 2u, c) * t;
                a3 += cf_x(n0 + 3u, c) * t; a4 += cf_x(n0 + 4u, c) * t; a5 += cf_x(n0 + 5u, c) * t;
                a6 += cf_x(n0 + 6u, c) * t; a7 += cf_x(n0 + 7u, c) * t;
            }
            continue;
        }
        for (var q = 0u; q < 4u; q++) {
            let m0 = cf_quads(wd[0], wd[1], wd[2], wd[3], q);
            let m1 = cf_quads(wd[4], wd[5], wd[6], wd[7], q);
            let m2 = cf_quads(wd[8], wd[9], wd[10], wd[11], q);
            let m3 = cf_quads(wd[12], wd[13], wd[14], wd[15], q);
            let c = w * 16u + q * 4u;
            a0 += row_dots16(cf_x4(n0, c), m0, m1, m2, m3);
            a1 += row_dots16(cf_x4(n0 + 1u, c), m0, m1, m2, m3);
            a2 += row_dots16(cf_x4(n0 + 2u, c), m0, m1, m2, m3);
            a3 += row_dots16(cf_x4(n0 + 3u, c), m0, m1, m2, m3);
            a4 += row_dots16(cf_x4(n0 + 4u, c), m0, m1, m2, m3);
            a5 += row_dots16(cf_x4(n0 + 5u, c), m0, m1, m2, m3);
            a6 += row_dots16(cf_x4(n0 + 6u, c), m0, m1, m2, m3);
            a7 += row_dots16(cf_x4(n0 + 7u, c), m0, m1, m2, m3);
        }
    }
    cf_store(n0, o0, a0); cf_store(n0 + 1u, o0, a1); cf_store(n0 + 2u, o0, a2); cf_store(n0 + 3u, o0, a3);
    cf_store(n0 + 4u, o0, a4); cf_store(n0 + 5u, o0, a5); cf_store(n0 + 6u, o0, a6); cf_store(n0 + 7u, o0, a7);
}

fn cf_store(n: u32, o0: u32, acc: mat4x4<f32>) {   // outputs o0 .. o0+15 of row n
    if (n >= cf_p.n) { return; }
    for (var b = 0u; b < 16u; b++) {
        let o = o0 + b;
        if (o < cf_p.o) {
            let v = acc[b / 4u][b % 4u] * cf_p.scale / cf_s[n];
            let a = n * cf_p.o + o;
            if (cf_p.accumulate != 0u) { cf_y[a] = cf_y[a] + v; } else { cf_y[a] = v; }
        }
    }
}

@group(0) @binding(0) var<uniform> cb_p: BitlinearBackwardParams;
@group(0) @binding(1) var<storage, read> cb_dy: array<f32>;
@group(0) @binding(2) var<storage, read> cb_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> cb_dx: array<f32>;

@compute @workgroup_size(CPU_WG)
fn bitlinear_backward_input_cpu(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let W = (cb_p.i + 15u) / 16u;
    let O = cb_p.o;
    let wi = wid.x * CPU_WG + lid3.x;                 // this invocation's word: columns 16wi .. 16wi+15
    let wc = min(wi, W - 1u);
    let n0 = wid.y * 8u;
    let d0 = min(n0, cb_p.n - 1u) * O;      let d1 = min(n0 + 1u, cb_p.n - 1u) * O;
    let d2 = min(n0 + 2u, cb_p.n - 1u) * O; let d3 = min(n0 + 3u, cb_p.n - 1u) * O;
    let d4 = min(n0 + 4u, cb_p.n - 1u) * O; let d5 = min(n0 + 5u, cb_p.n - 1u) * O;
    let d6 = min(n0 + 6u, cb_p.n - 1u) * O; let d7 = min(n0 + 7u, cb_p.n - 1u) * O;
    var a0 = mat4x4<f32>(); var a1 = mat4x4<f32>(); var a2 = mat4x4<f32>(); var a3 = mat4x4<f32>();
    var a4 = mat4x4<f32>(); var a5 = mat4x4<f32>(); var a6 = mat4x4<f32>(); var a7 = mat4x4<f32>();
    for (var o = 0u; o < O; o++) {
        let wd = cb_w[o * W + wc];
        let t = cf_quads(wd, wd >> 8u, wd >> 16u, wd >> 24u, 0u);   // the word's 16 weights
        a0 += cb_dy[d0 + o] * t; a1 += cb_dy[d1 + o] * t; a2 += cb_dy[d2 + o] * t; a3 += cb_dy[d3 + o] * t;
        a4 += cb_dy[d4 + o] * t; a5 += cb_dy[d5 + o] * t; a6 += cb_dy[d6 + o] * t; a7 += cb_dy[d7 + o] * t;
    }
    cb_store(n0, wi, a0); cb_store(n0 + 1u, wi, a1); cb_store(n0 + 2u, wi, a2); cb_store(n0 + 3u, wi, a3);
    cb_store(n0 + 4u, wi, a4); cb_store(n0 + 5u, wi, a5); cb_store(n0 + 6u, wi, a6); cb_store(n0 + 7u, wi, a7);
}

fn cb_store(n: u32, wi: u32, acc: mat4x4<f32>) {   // columns 16wi .. 16wi+15 of row n
    if (n >= cb_p.n) { return; }
    for (var k = 0u; k < 16u; k++) {
        let i = wi * 16u + k;
        if (i < cb_p.i) {
            let j = n * cb_p.i + i;
            let g = cb_p.scale * acc[k / 4u][k % 4u];
            if (cb_p.accumulate != 0u) { cb_dx[j] = cb_dx[j] + g; } else { cb_dx[j] = g; }
        }
    }
}

// ---------------------------------------------------------------------------- actquant, CPU variant
// actquant_forward_rows   actquant_forward for CPUs (Device.kind "cpu", I % 4 == 0): the
//   same bindings seen as vec4 (s[N] stays scalar); one row per invocation, AQR rows per
//   workgroup, no barriers: ceil(N / AQR) workgroups split over x, y. The max is exact:
//   the same s and xq as actquant_forward.
const AQR: u32 = 16u;  // rows (invocations) per workgroup

@group(0) @binding(0) var<uniform> aq_p: ActQuantParams;
@group(0) @binding(1) var<storage, read> aq_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> aq_xq: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> aq_s: array<f32>;

@compute @workgroup_size(AQR)
fn actquant_forward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n = gid.x + gid.y * nw.x * AQR;
    if (n >= aq_p.n) { return; }
    let I4 = aq_p.i / 4u;
    let base = n * I4;
    var m4 = vec4<f32>(0.0);
    for (var i = 0u; i < I4; i++) { m4 = max(m4, abs(aq_x[base + i])); }
    let s = 127.0 / max(max(max(m4.x, m4.y), max(m4.z, m4.w)), 1e-5);
    for (var i = 0u; i < I4; i++) { aq_xq[base + i] = clamp(round(aq_x[base + i] * s), vec4<f32>(-128.0), vec4<f32>(127.0)); }
    aq_s[n] = s;
}
