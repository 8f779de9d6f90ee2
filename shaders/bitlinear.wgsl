// bitlinear.wgsl — BitNet b1.58's BitLinear forward, y = actquant(x) (t * scale)^T,
// in two passes so one quantised input feeds several projections (q, k, v; gate, up).
//
// actquant_forward   per-token absmax int8 quantisation (HF ActQuant):
//   s[n] = 127 / max(max_i |x[n, i]|, 1e-5),  xq[n, i] = clamp(round(x[n, i] * s[n]), -128, 127)
//   WGSL round() rounds half to even, like torch.round. xq holds the integers as f32.
//   0 params {N, I} | 1 x[N, I] read | 2 xq[N, I] write | 3 s[N] write
//   dispatch: one workgroup (256) per row: N workgroups split over x, y
//
// bitlinear_forward   y[n, o] (= or +=) (sum_i xq[n, i] t[o, i]) * scale / s[n]
//   The dot products of integers are exact in f32 (|sum| < 2^24 for I < 131072), so
//   every tiling gives the same bits.
//   t from w_packed[O, ceil(I/16)] u32 (formats/tensors.py: weight (o, i) is code
//   (word >> 2*(i%16)) & 3 of word o*ceil(I/16) + i/16, t = code - 1); never expanded.
//   accumulate = 1 adds into y (o_proj and down_proj write into the residual stream).
//   0 params {N, I, O, scale, accumulate, kw, split} | 1 xq[N, I] read | 2 s[N] read |
//   3 w_packed[O, ceil(I/16)] u32 read | 4 y[N, O] read_write
//   Split-K (splitk.wgsl): workgroup z sums words [z*kw, (z+1)*kw) only (kw a multiple
//   of 4); with split = 1 it writes the raw integer sums to part[z, N, O] and
//   splitk_reduce finishes (same bits). 5 part (bound, unused, when split = 0).
//   dispatch: groups (ceil(O/64), ceil(N/64), slices); a 16x16 workgroup owns a 64 x 64 tile of
//   y, thread (tx, ty) rows ty + 16a and outputs tx + 16b (a, b < 4), 16 sums in
//   registers. xq is staged through workgroup memory 64 columns (4 words) at a time and
//   read back as vec4; each thread decodes its four outputs' words into vec4s of
//   ternary weights, so one x load feeds 16 multiply-adds (a load per multiply-add made
//   the simpler kernel below several times slower on every backend measured).
//   The sums are named variables, not a function-local array: an array indexed in a
//   loop lives in memory on NVIDIA's Vulkan compiler, and this kernel ran 1.7-1.9x
//   slower on an H200 that way (scripts/bench_matmul.py; backward.wgsl's input
//   gradient: 6.5x).
//
// bitlinear_forward_rows   the same for a few rows (decoding: N = batch size):
//   dispatch: groups (ceil(O/64), ceil(N/8)); a workgroup (64) owns 64 outputs x 8 rows,
//   a thread one output for 8 rows; xq is staged through workgroup memory 256 columns
//   (16 words) at a time.

const WG: u32 = 256u;
struct QuantParams { n: u32, i: u32 };
@group(0) @binding(0) var<uniform> qp: QuantParams;
@group(0) @binding(1) var<storage, read> q_x: array<f32>;
@group(0) @binding(2) var<storage, read_write> q_xq: array<f32>;
@group(0) @binding(3) var<storage, read_write> q_s: array<f32>;
var<workgroup> q_sh: array<f32, WG>;

@compute @workgroup_size(WG)
fn actquant_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= qp.n) { return; }
    let base = n * qp.i;
    var m = 0.0;
    for (var i = lid; i < qp.i; i += WG) { m = max(m, abs(q_x[base + i])); }
    q_sh[lid] = m;
    workgroupBarrier();
    for (var st = WG / 2u; st > 0u; st = st >> 1u) {
        if (lid < st) { q_sh[lid] = max(q_sh[lid], q_sh[lid + st]); }
        workgroupBarrier();
    }
    let s = 127.0 / max(q_sh[0], 1e-5);
    for (var i = lid; i < qp.i; i += WG) { q_xq[base + i] = clamp(round(q_x[base + i] * s), -128.0, 127.0); }
    if (lid == 0u) { q_s[n] = s; }
}

const TO: u32 = 64u;   // outputs per workgroup (one per thread)
const TN: u32 = 8u;    // rows per workgroup
const KW: u32 = 16u;   // packed words per staged chunk (256 columns)
struct LinParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, kw: u32, split: u32 };
@group(0) @binding(0) var<uniform> lp: LinParams;
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
                    let t = f32((word >> (2u * k)) & 3u) - 1.0;
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

fn ternary_quad(word: u32, q: u32) -> vec4<f32> {      // weights of columns 4q .. 4q+3 of a word
    let b = word >> (8u * q);
    return vec4<f32>(vec4<u32>(b & 3u, (b >> 2u) & 3u, (b >> 4u) & 3u, (b >> 6u) & 3u)) - 1.0;
}

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
