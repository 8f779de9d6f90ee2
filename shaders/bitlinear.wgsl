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
//   4 part[slices, N, I] read_write | 5 dy again, as vec4s, read (where O % 4 == 0; a spare
//   16-byte buffer otherwise)
//   Split-K: workgroup z sums o in [z*ko, (z+1)*ko) only (ko a multiple of 16); with
//   split = 1 it writes its raw sums to part[z, N, I] and splitk_reduce scales and adds
//   them (part is bound, unused, when split = 0).
//   dispatch: groups (ceil(ceil(I/16) / 8), ceil(N/64), slices); a 16x16 workgroup owns
//   64 rows x 8 words (128 columns) of dx; per 16 o the words are decoded once into
//   workgroup memory as vec4s of ternary weights, and thread (tx, ty) keeps rows
//   ty + 16a x column quads tx, tx + 16 (the prelude's 64 x 128 tile products, mt_*).
//   The next 16 o's dy values and weight words are loaded into registers while the
//   current ones are multiplied (software pipelining: the global loads' latency is no
//   longer exposed at every chunk): on an H200 at 2B-4T widths, N = 1024, 20-28 % faster
//   (1024x2560x6912 1.84 -> 1.43 ms, 9.8 -> 12.7 TMAC/s; bench/matmul.py with
//   bench/bwd_variants.wgsl), the same order of sums (the same bits). Where O % 4 == 0 a
//   thread loads its chunk of dy as one vec4 (row lid/4, o quad lid%4) and stages it with
//   one store, not four scalars: 6-13 % faster again on the H200 (1024x2560x6912 1.60 ->
//   1.39 ms), the same bits. A 128 x 128 tile of
//   8 rows x 2 column quads per thread with dy staged transposed ran slower (bwd_t88).

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
@group(0) @binding(5) var<storage, read> bl_dy4: array<vec4<f32>>;     // dy, read as vec4s when O % 4 == 0

@compute @workgroup_size(16, 16)
fn bitlinear_backward_input(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let wq0 = wid.x * 8u;
    let obeg = wid.z * bl_p.ko;
    let oend = min(bl_p.o, (wid.z + 1u) * bl_p.ko);
    // this thread's staging slots: dy (row lid/4, o quad lid%4), w (o (lid + 256m)/32, quad lid%32)
    let sr = lid / 4u;
    let sq = lid % 4u;
    let wo0 = lid / 32u;
    let wq = lid % 32u;
    let wi = wq0 + wq / 4u;
    var p = bl_dy_quad(n0 + sr, obeg + 4u * sq, oend);
    var pw0 = bl_w_at(obeg + wo0, wi, oend); var pw1 = bl_w_at(obeg + wo0 + 8u, wi, oend);
    var acc = MtSums();
    for (var o0 = obeg; o0 < oend; o0 += 16u) {
        mt_a[sr][sq] = p;
        mt_b[wo0][wq] = ternary_quad(pw0, wq % 4u);
        mt_b[wo0 + 8u][wq] = ternary_quad(pw1, wq % 4u);
        workgroupBarrier();
        let o1 = o0 + 16u;
        p = bl_dy_quad(n0 + sr, o1 + 4u * sq, oend);
        pw0 = bl_w_at(o1 + wo0, wi, oend); pw1 = bl_w_at(o1 + wo0 + 8u, wi, oend);
        acc = mt_quad(acc, 0u, ty, tx);
        acc = mt_quad(acc, 1u, ty, tx);
        acc = mt_quad(acc, 2u, ty, tx);
        acc = mt_quad(acc, 3u, ty, tx);
        workgroupBarrier();
    }
    let c0 = (wq0 * 4u + tx) * 4u;
    let c1 = (wq0 * 4u + tx + 16u) * 4u;
    bl_store(n0 + ty, c0, acc.a00, wid.z); bl_store(n0 + ty, c1, acc.a01, wid.z);
    bl_store(n0 + ty + 16u, c0, acc.a10, wid.z); bl_store(n0 + ty + 16u, c1, acc.a11, wid.z);
    bl_store(n0 + ty + 32u, c0, acc.a20, wid.z); bl_store(n0 + ty + 32u, c1, acc.a21, wid.z);
    bl_store(n0 + ty + 48u, c0, acc.a30, wid.z); bl_store(n0 + ty + 48u, c1, acc.a31, wid.z);
}

fn bl_dy_quad(n: u32, o: u32, oend: u32) -> vec4<f32> {   // dy[n, o .. o+3], 0 past the edges of the tile's slice
    if (n >= bl_p.n) { return vec4<f32>(0.0); }
    let at = n * bl_p.o + o;
    if (bl_p.o % 4u == 0u && o + 3u < oend) { return bl_dy4[at / 4u]; }
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (o + c < oend) { v[c] = bl_dy[at + c]; }
    }
    return v;
}

fn bl_w_at(o: u32, wi: u32, oend: u32) -> u32 {   // word wi of w_packed row o, zeros (code 1) past the edges
    if (o < oend && wi < (bl_p.i + 15u) / 16u) { return bl_w[o * ((bl_p.i + 15u) / 16u) + wi]; }
    return 0x55555555u;
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
// split-K. A load costs a CPU rasteriser far more than arithmetic (lavapipe: a loop over
// the lanes with a bounds check each), so an invocation keeps a tile of 32 columns in
// registers (the prelude's T8: 8 rows x 32 columns), so each loaded value of xq or dy
// feeds 32 multiply-adds and each packed word 8 x 16. Weights are decoded without shifts by a variable amount
// (SwiftShader emulates those lane by lane): column k of a half word h is
// t = f32(h & (3 << 2k)) * 4^-k - 1, exact.
// Invocation g (gid.x + gid.y * nw.x * CPU_WG) owns tile g % tiles of row block g / tiles,
// so the lanes of a workgroup cover several row blocks when a row has few tiles.
// Rows, columns and outputs past the edges are clamped on load (padding weights are 0)
// and skipped on store.
//
// bitlinear_matmul_cpu   y[n, c] (= or +=) (sum_k a[n, k] t[k, c]) * scale (/ s[n] where divide = 1),
//   t from packed words wt[K, ceil(C/16)] u32 (ternary_at's layout with c for i). Both
//   ternary matmuls on a CPU are this one kernel (one pipeline to compile):
//   forward        a = xq[N, I], wt = the weights transposed (ternary_transpose), C = O,
//                  divide = 1: the same bits as bitlinear_forward (integer sums; acc * scale / s[n])
//   input gradient a = dy[N, O], wt = w_packed itself, K = O, C = I, divide = 0: f32 sums
//                  over o (in order with CPU_STEP 1; in fours, then added, with CPU_STEP 4)
//   Why the forward reads transposed weights: a step of the reduction then decodes 2 whole
//   words (32 columns, constant shifts), where reading w_packed[O, I/16] it picks one
//   column out of 32 words: on SwiftShader 1.4x faster, on lavapipe 1.1-1.3x.
//   0 params CpuMatmulParams {N, K, C, scale, accumulate, divide} | 1 a[N, K] read |
//   2 s[N] read (bound, unused, where divide = 0) | 3 wt[K, ceil(C/16)] u32 read | 4 y[N, C] read_write |
//   5 a again, read as vec4s where CPU_QUADS (a spare 16-byte buffer where not)
//   dispatch: ceil(ceil(N/8) * ceil(ceil(C/16) / 2) / CPU_WG) workgroups split over x, y;
//   an invocation owns rows 8b .. 8b+7 and the 32 columns of packed words 2j, 2j+1.
//
// bitlinear_forward_cpu   the forward from w_packed itself (a model too large to keep its
//   weights transposed too: ops/bitlinear.py CPU_TRANSPOSE_MAX_BYTES), for I % 4 == 0:
//   4 rows x 32 outputs per invocation (T4), one column of 32 words per step.
//   bindings 0-4 as bitlinear_forward with xq seen as vec4 (no part; kw and split unused).
//   dispatch: ceil(ceil(N/4) * ceil(O/32) / CPU_WG) workgroups split over x, y; an
//   invocation owns rows 4b .. 4b+3 and outputs 32j .. 32j+31.

// Override constants, per adapter where one differs (ops/bitlinear.py CPU_TILES; none now):
// CPU_WG     invocations per workgroup.
// CPU_STEP   reduction steps per update of the 256 sums of bitlinear_matmul_cpu: 4 (four
//            products summed, then added: LLVM keeps fewer sums in flight) or 1. Measured
//            2026-12-05 (bench/cpu_matmul.py, Chromium 156): 4 is faster on both, lavapipe
//            1.2-1.6x, SwiftShader 1.2-1.5x (an earlier kernel ran 4 1.2x slower there).
// CPU_CODES  true: bitlinear_matmul_cpu sums a * (code * 4^j), code = f32(h & (3 << 2j))
//            in {0, 1, 2} (the decode's multiply and subtract gone: 2 operations a weight
//            instead of 4), and subtracts the row sum of a at the end: sum a (code - 1) =
//            4^-j sum a code 4^j - sum a, the power-of-two scalings exact. The forward's
//            sums are integers below 2^24: the same bits; the input gradient's f32 sums
//            round differently. With CPU_STEP 4: lavapipe 1.0-1.16x faster on both matmuls,
//            SwiftShader ~1.1x on the input gradient and ~0.93x on the forward.
// CPU_QUADS  K % 4 == 0 (the op sets it): with CPU_STEP 4 a row's four a values are one vec4
//            load (binding 5) instead of four: lavapipe 1.1-1.3x faster, SwiftShader
//            1.0-1.2x (the same bits; an override, not a run-time `if`: see linear.wgsl).
override CPU_WG: u32 = 8u;
override CPU_STEP: u32 = 4u;
override CPU_CODES: bool = true;
override CPU_QUADS: bool = false;

struct W32 { a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32>, e: vec4<u32>, f: vec4<u32>, g: vec4<u32>, h: vec4<u32> };   // a word of 32 outputs

fn tern4(w: vec4<u32>, m: vec4<u32>, f: vec4<f32>) -> vec4<f32> {   // f32(w & m) * f - 1: see above
    return vec4<f32>(bitcast<vec4<i32>>(w & m)) * f - 1.0;
}

// masks and factors of columns 0..3 (M0, F0) and 4..7 (M1, F1) of a half word
const M0 = vec4<u32>(0x3u, 0xcu, 0x30u, 0xc0u);
const M1 = vec4<u32>(0x300u, 0xc00u, 0x3000u, 0xc000u);
const F0 = vec4<f32>(1.0, 0x1p-2, 0x1p-4, 0x1p-6);
const F1 = vec4<f32>(0x1p-8, 0x1p-10, 0x1p-12, 0x1p-14);

fn w32_col(w: W32, m: u32, f: f32) -> R8 {   // one column's weights of 32 outputs' (half) words
    let mv = vec4<u32>(m);
    let fv = vec4<f32>(f);
    return R8(tern4(w.a, mv, fv), tern4(w.b, mv, fv), tern4(w.c, mv, fv), tern4(w.d, mv, fv),
              tern4(w.e, mv, fv), tern4(w.f, mv, fv), tern4(w.g, mv, fv), tern4(w.h, mv, fv));
}

fn w32_hi(w: W32) -> W32 {   // the high half words
    let s = vec4<u32>(16u);
    return W32(w.a >> s, w.b >> s, w.c >> s, w.d >> s, w.e >> s, w.f >> s, w.g >> s, w.h >> s);
}

@group(0) @binding(0) var<uniform> cf_p: BitlinearParams;
@group(0) @binding(1) var<storage, read> cf_xq: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> cf_s: array<f32>;
@group(0) @binding(3) var<storage, read> cf_w: array<u32>;
@group(0) @binding(4) var<storage, read_write> cf_y: array<f32>;

fn cf_w4(ob: vec4<u32>, w: u32) -> vec4<u32> { return vec4<u32>(cf_w[ob.x + w], cf_w[ob.y + w], cf_w[ob.z + w], cf_w[ob.w + w]); }

fn w32_pick(a: W32, b: W32, c: bool) -> W32 {   // c ? b : a
    return W32(select(a.a, b.a, c), select(a.b, b.b, c), select(a.c, b.c, c), select(a.d, b.d, c),
               select(a.e, b.e, c), select(a.f, b.f, c), select(a.g, b.g, c), select(a.h, b.h, c));
}

struct T4 { r0: R8, r1: R8, r2: R8, r3: R8 };   // the forward's tile: 4 rows x 32 outputs

fn t4_fma(a: T4, x: vec4<f32>, t: R8) -> T4 {   // row r += x[r] * t
    return T4(r8_fma(a.r0, x.x, t), r8_fma(a.r1, x.y, t), r8_fma(a.r2, x.z, t), r8_fma(a.r3, x.w, t));
}

// 4 columns of a half word h (0..3 if lo, else 4..7) for rows whose xq quads are x0..x3
fn cf_quad(a: T4, h: W32, lo: bool, x0: vec4<f32>, x1: vec4<f32>, x2: vec4<f32>, x3: vec4<f32>) -> T4 {
    let m = select(M1, M0, lo);
    let f = select(F1, F0, lo);
    var t = t4_fma(a, vec4<f32>(x0.x, x1.x, x2.x, x3.x), w32_col(h, m.x, f.x));
    t = t4_fma(t, vec4<f32>(x0.y, x1.y, x2.y, x3.y), w32_col(h, m.y, f.y));
    t = t4_fma(t, vec4<f32>(x0.z, x1.z, x2.z, x3.z), w32_col(h, m.z, f.z));
    return t4_fma(t, vec4<f32>(x0.w, x1.w, x2.w, x3.w), w32_col(h, m.w, f.w));
}

@compute @workgroup_size(CPU_WG)
fn bitlinear_forward_cpu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let tiles = (cf_p.o + 31u) / 32u;
    let g = gid.x + gid.y * nw.x * CPU_WG;
    if (g >= (cf_p.n + 3u) / 4u * tiles) { return; }
    let words = (cf_p.i + 15u) / 16u;
    let I4 = cf_p.i / 4u;
    let n0 = g / tiles * 4u;
    let o0 = g % tiles * 32u;
    let xb = min(vec4<u32>(n0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(cf_p.n - 1u)) * I4;   // the 4 rows' xq offsets
    let om = vec4<u32>(cf_p.o - 1u);
    let ob = W32(min(vec4<u32>(o0) + vec4<u32>(0u, 1u, 2u, 3u), om) * words, min(vec4<u32>(o0) + vec4<u32>(4u, 5u, 6u, 7u), om) * words,
                 min(vec4<u32>(o0) + vec4<u32>(8u, 9u, 10u, 11u), om) * words, min(vec4<u32>(o0) + vec4<u32>(12u, 13u, 14u, 15u), om) * words,
                 min(vec4<u32>(o0) + vec4<u32>(16u, 17u, 18u, 19u), om) * words, min(vec4<u32>(o0) + vec4<u32>(20u, 21u, 22u, 23u), om) * words,
                 min(vec4<u32>(o0) + vec4<u32>(24u, 25u, 26u, 27u), om) * words, min(vec4<u32>(o0) + vec4<u32>(28u, 29u, 30u, 31u), om) * words);
    let cm = I4 - 1u;
    var a = T4();
    for (var w = 0u; w < words; w++) {
        let lo = W32(cf_w4(ob.a, w), cf_w4(ob.b, w), cf_w4(ob.c, w), cf_w4(ob.d, w),
                     cf_w4(ob.e, w), cf_w4(ob.f, w), cf_w4(ob.g, w), cf_w4(ob.h, w));
        let hi = w32_hi(lo);
        for (var q = 0u; q < 4u; q++) {   // a loop, not four copies: a quarter of the code to compile
            let c = min(4u * w + q, cm);
            a = cf_quad(a, w32_pick(hi, lo, q < 2u), (q & 1u) == 0u, cf_xq[xb.x + c], cf_xq[xb.y + c], cf_xq[xb.z + c],
                        cf_xq[xb.w + c]);
        }
    }
    cf_store(n0, o0, a.r0); cf_store(n0 + 1u, o0, a.r1); cf_store(n0 + 2u, o0, a.r2); cf_store(n0 + 3u, o0, a.r3);
}

fn cf_store4(n: u32, o0: u32, acc: vec4<f32>) {   // outputs o0 .. o0+3 of row n
    for (var b = 0u; b < 4u; b++) {
        let o = o0 + b;
        if (o < cf_p.o) {
            let v = acc[b] * cf_p.scale / cf_s[n];
            let a = n * cf_p.o + o;
            if (cf_p.accumulate != 0u) { cf_y[a] = cf_y[a] + v; } else { cf_y[a] = v; }
        }
    }
}

fn cf_store(n: u32, o0: u32, acc: R8) {   // outputs o0 .. o0+31 of row n
    if (n >= cf_p.n) { return; }
    cf_store4(n, o0, acc.a); cf_store4(n, o0 + 4u, acc.b); cf_store4(n, o0 + 8u, acc.c); cf_store4(n, o0 + 12u, acc.d);
    cf_store4(n, o0 + 16u, acc.e); cf_store4(n, o0 + 20u, acc.f); cf_store4(n, o0 + 24u, acc.g); cf_store4(n, o0 + 28u, acc.h);
}

struct CpuMatmulParams { n: u32, k: u32, c: u32, scale: f32, accumulate: u32, divide: u32 };
@group(0) @binding(0) var<uniform> cm_p: CpuMatmulParams;
@group(0) @binding(1) var<storage, read> cm_a: array<f32>;
@group(0) @binding(2) var<storage, read> cm_s: array<f32>;
@group(0) @binding(3) var<storage, read> cm_t: array<u32>;
@group(0) @binding(4) var<storage, read_write> cm_y: array<f32>;
@group(0) @binding(5) var<storage, read> cm_a4v: array<vec4<f32>>;   // a again (CPU_QUADS)

fn code4(w: vec4<u32>, m: vec4<u32>) -> vec4<f32> { return vec4<f32>(bitcast<vec4<i32>>(w & m)); }   // code * 4^j

fn cm_t32(k: u32, wb: vec2<u32>) -> R8 {   // the 32 weights of reduction step k in words wb (columns 0-15, 16-31)
    let W = (cm_p.c + 15u) / 16u;
    let w0 = vec4<u32>(cm_t[k * W + wb.x]);
    let w1 = vec4<u32>(cm_t[k * W + wb.y]);
    let s = vec4<u32>(16u);
    if (CPU_CODES) {   // the codes scaled by 4^j (see CPU_CODES)
        return R8(code4(w0, M0), code4(w0, M1), code4(w0 >> s, M0), code4(w0 >> s, M1),
                  code4(w1, M0), code4(w1, M1), code4(w1 >> s, M0), code4(w1 >> s, M1));
    }
    return R8(tern4(w0, M0, F0), tern4(w0, M1, F1), tern4(w0 >> s, M0, F0), tern4(w0 >> s, M1, F1),
              tern4(w1, M0, F0), tern4(w1, M1, F1), tern4(w1 >> s, M0, F0), tern4(w1 >> s, M1, F1));
}

fn cm_fin(x: R8, r: f32) -> R8 {   // CPU_CODES: sums of a * code * 4^j, row sum r -> sums of a * t
    if (!CPU_CODES) { return x; }
    return R8(x.a * F0 - r, x.b * F1 - r, x.c * F0 - r, x.d * F1 - r, x.e * F0 - r, x.f * F1 - r, x.g * F0 - r, x.h * F1 - r);
}

fn sum4(v: vec4<f32>) -> f32 { return (v.x + v.y) + (v.z + v.w); }

fn cm_a4(b: u32, k: u32) -> vec4<f32> {   // a[row at b, k .. k+3]: b = row * K, or row * K / 4 where CPU_QUADS (k % 4 == 0)
    if (CPU_QUADS) { return cm_a4v[b + k / 4u]; }
    return vec4<f32>(cm_a[b + k], cm_a[b + k + 1u], cm_a[b + k + 2u], cm_a[b + k + 3u]);
}

@compute @workgroup_size(CPU_WG)
fn bitlinear_matmul_cpu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let W = (cm_p.c + 15u) / 16u;
    let tiles = (W + 1u) / 2u;
    let g = gid.x + gid.y * nw.x * CPU_WG;
    if (g >= (cm_p.n + 7u) / 8u * tiles) { return; }
    let K = cm_p.k;
    let n0 = g / tiles * 8u;
    let wb = vec2<u32>(g % tiles * 2u, min(g % tiles * 2u + 1u, W - 1u));
    let nm = vec4<u32>(cm_p.n - 1u);
    let db = U8(min(vec4<u32>(n0) + vec4<u32>(0u, 1u, 2u, 3u), nm) * K, min(vec4<u32>(n0) + vec4<u32>(4u, 5u, 6u, 7u), nm) * K);
    let sh = vec4<u32>(select(0u, 2u, CPU_QUADS));
    let da = U8(db.a >> sh, db.b >> sh);   // the rows' offsets as cm_a4 takes them (in quads where CPU_QUADS)
    var a = T8();
    var r0 = vec4<f32>(0.0); var r1 = vec4<f32>(0.0);   // CPU_CODES: the 8 rows' sums of a
    var k = 0u;
    if (CPU_STEP == 4u) {
        for (var q = 0u; q < K / 4u; q++) {
            k = 4u * q;
            let t0 = cm_t32(k, wb);
            let t1 = cm_t32(k + 1u, wb);
            let t2 = cm_t32(k + 2u, wb);
            let t3 = cm_t32(k + 3u, wb);
            let e = R8(cm_a4(da.a.x, k), cm_a4(da.a.y, k), cm_a4(da.a.z, k), cm_a4(da.a.w, k),
                       cm_a4(da.b.x, k), cm_a4(da.b.y, k), cm_a4(da.b.z, k), cm_a4(da.b.w, k));   // the 8 rows' a quads
            if (CPU_CODES) {
                r0 += vec4<f32>(sum4(e.a), sum4(e.b), sum4(e.c), sum4(e.d));
                r1 += vec4<f32>(sum4(e.e), sum4(e.f), sum4(e.g), sum4(e.h));
            }
            a = t8_dot4(a, e, t0, t1, t2, t3);
        }
        k = K / 4u * 4u;
    }
    for (; k < K && !(CPU_QUADS && CPU_STEP == 4u); k++) {   // the rest (none where CPU_QUADS: K % 4 == 0)
        let t = cm_t32(k, wb);
        let d0 = vec4<f32>(cm_a[db.a.x + k], cm_a[db.a.y + k], cm_a[db.a.z + k], cm_a[db.a.w + k]);
        let d1 = vec4<f32>(cm_a[db.b.x + k], cm_a[db.b.y + k], cm_a[db.b.z + k], cm_a[db.b.w + k]);
        if (CPU_CODES) { r0 += d0; r1 += d1; }
        a = T8(r8_fma(a.r0, d0.x, t), r8_fma(a.r1, d0.y, t), r8_fma(a.r2, d0.z, t), r8_fma(a.r3, d0.w, t),
               r8_fma(a.r4, d1.x, t), r8_fma(a.r5, d1.y, t), r8_fma(a.r6, d1.z, t), r8_fma(a.r7, d1.w, t));
    }
    let c0 = wb.x * 16u;
    cm_store(n0, c0, cm_fin(a.r0, r0.x)); cm_store(n0 + 1u, c0, cm_fin(a.r1, r0.y));
    cm_store(n0 + 2u, c0, cm_fin(a.r2, r0.z)); cm_store(n0 + 3u, c0, cm_fin(a.r3, r0.w));
    cm_store(n0 + 4u, c0, cm_fin(a.r4, r1.x)); cm_store(n0 + 5u, c0, cm_fin(a.r5, r1.y));
    cm_store(n0 + 6u, c0, cm_fin(a.r6, r1.z)); cm_store(n0 + 7u, c0, cm_fin(a.r7, r1.w));
}

fn cm_put(i: u32, c: u32, v: f32) {   // y[i] (= or +=) v where column c < C
    // a select, not an if: SwiftShader runs both sides of a branch (masked), and this
    // one load and store ran its K = 64 / 128 calls 4-16 % faster than the if / else
    if (c < cm_p.c) { cm_y[i] = select(v, cm_y[i] + v, cm_p.accumulate != 0u); }
}

fn cm_put4(i: u32, c: u32, w: vec4<f32>) {   // y[i .. i+3] of columns c .. c+3
    cm_put(i, c, w.x); cm_put(i + 1u, c + 1u, w.y); cm_put(i + 2u, c + 2u, w.z); cm_put(i + 3u, c + 3u, w.w);
}

fn cm_store(n: u32, c0: u32, acc: R8) {   // columns c0 .. c0+31 of row n: acc * scale (/ s[n])
    if (n >= cm_p.n) { return; }
    let s = select(1.0, cm_s[n], cm_p.divide != 0u);   // s loaded once per row; x / 1 is x
    let f = cm_p.scale;
    let i = n * cm_p.c + c0;
    cm_put4(i, c0, acc.a * f / s); cm_put4(i + 4u, c0 + 4u, acc.b * f / s);
    cm_put4(i + 8u, c0 + 8u, acc.c * f / s); cm_put4(i + 12u, c0 + 12u, acc.d * f / s);
    cm_put4(i + 16u, c0 + 16u, acc.e * f / s); cm_put4(i + 20u, c0 + 20u, acc.f * f / s);
    cm_put4(i + 24u, c0 + 24u, acc.g * f / s); cm_put4(i + 28u, c0 + 28u, acc.h * f / s);
}

// ternary_transpose   w[O, ceil(I/16)] -> wt[I, ceil(O/16)] u32, the same codes (outputs past O: 1, a zero weight)
//   0 params TransposeParams {O, I} | 1 w read | 2 wt write
//   dispatch: ceil(I * ceil(O/16) / 64) workgroups split over x, y; an invocation writes one word of wt.
struct TransposeParams { o: u32, i: u32 };
@group(0) @binding(0) var<uniform> tt_p: TransposeParams;
@group(0) @binding(1) var<storage, read> tt_w: array<u32>;
@group(0) @binding(2) var<storage, read_write> tt_wt: array<u32>;

@compute @workgroup_size(64)
fn ternary_transpose(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let WO = (tt_p.o + 15u) / 16u;
    let e = gid.x + gid.y * nw.x * 64u;
    if (e >= tt_p.i * WO) { return; }
    let i = e / WO;
    let o0 = e % WO * 16u;
    let WI = (tt_p.i + 15u) / 16u;
    var word = 0u;
    for (var j = 0u; j < 16u; j++) {
        var code = 1u;
        if (o0 + j < tt_p.o) { code = (tt_w[(o0 + j) * WI + i / 16u] >> (2u * (i % 16u))) & 3u; }
        word |= code << (2u * j);
    }
    tt_wt[e] = word;
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
