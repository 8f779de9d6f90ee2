// bitlinear_i8.wgsl — BitLinear's forward matmul on int8 dot products: the same
// y = (xq t^T) * scale / s as bitlinear.wgsl's bitlinear_forward, bit for bit, reading
// the activations packed four int8 to a u32 (prelude: xq8) and accumulating with WGSL's
// dot4I8Packed. A file of its own because a module that names dot4I8Packed does not
// compile where the adapter lacks the language feature packed_4x8_integer_dot_product
// (Device.int8_dot says whether it has it; ops/bitlinear.py picks this kernel then).
//
// bitlinear_forward_i8   y[n, o] (= or +=) (sum_i xq[n, i] t[o, i]) * scale / s[n]
//   The sums are exact 32-bit integers (|xq| <= 128, |t| <= 1, I < 2^17 keeps them below
//   2^24, so their f32 is exact too): the same bits as bitlinear_forward in every tiling.
//   Up to three projections of one input (q, k, v; gate, up) in one dispatch: part p has
//   O_p outputs (O_0 = O; O_1, O_2 = o1, o2, 0 where absent), its weights w_p at word
//   base_p of w (base_0 = 0), its scale_p and its y_p; a tile's outputs lie in one part.
//   0 params BitlinearI8Params {N, I, O, scale, accumulate, kw, split, o1, o2, base1,
//   base2, scale1, scale2} | 1 xq8[N, 4*ceil(I/16)] u32 read (seen as vec4: one per packed
//   weight word) | 2 s[N] read | 3 w: w_p[O_p, ceil(I/16)] u32 read | 4 y0[N, O_0] |
//   5 part[slices, N, O_0 + O_1 + O_2] | 6 y1[N, O_1] | 7 y2[N, O_2] read_write (distinct
//   buffers: an absent part's is a spare)
//   Split-K as bitlinear_forward (splitk.wgsl): workgroup z sums words [z*kw, (z+1)*kw)
//   only; with split = 1 it writes the integer sums, as f32, to part[z, N, :], the parts'
//   outputs side by side (splitk_reduce_parts adds and scales them into each y_p).
//   dispatch: groups (sum_p ceil(O_p/64), ceil(N/I8_ROWS), slices); a 16x16 workgroup owns an
//   I8_ROWS x 64 tile of y, thread (tx, ty) rows ty + 16a (a < I8_ROWS / 16) and outputs
//   tx + 16b (b < 4), the sums in named variables (an array indexed in a loop lives in memory on NVIDIA's Vulkan
//   compiler). Per I8_KC words the workgroup stages the tile's activations and its
//   weights, the weights decoded once into int8 lanes (i8_ternary); then each thread's
//   16 sums take 64 dot4I8Packed per word (4 vec4 loads of xq8, 4 of weights). The next
//   chunk's global loads are issued into registers before this chunk is multiplied (a
//   workgroup of a short prompt has only a few chunks, each a memory latency otherwise).
//
// Decoding a packed weight word w (16 two-bit codes c, t = c - 1): lane j of
//   (w >> 2k) & 0x03030303 is the code of column 4j + k, in 0..2. Adding 0x7f to a byte
//   below 0x80 never carries, and (c + 0x7f) ^ 0x80 is c - 1 as a two's-complement byte:
//   four words of int8 weights from 15 integer operations, once per workgroup and word.
//
// I8_ROWS (override) is 64, or 32 for a few rows (a short prompt: ops/bitlinear.py
// i8_rows), where a 64-row tile would multiply as many zero rows as real ones.
//
// Measured on an H200 (bench/matmul.py, 256 rows): 3-4x the f32 kernel at 2B-4T widths (1.9x
// for k, v: 640 outputs), 5-6x at 1024 rows; other tiles (bench/i8_variants.wgsl: 8 rows
// or 8 outputs per thread, 16 words per chunk, weights decoded per thread) were within
// 3 % or slower.

const I8_KC: u32 = 8u;   // packed words (16 columns each) per staged chunk
override I8_ROWS: u32 = 64u;   // rows of a tile: 64 or 32

struct BitlinearI8Params {
    n: u32, i: u32, o: u32, scale: f32, accumulate: u32, kw: u32, split: u32,
    o1: u32, o2: u32, base1: u32, base2: u32, scale1: f32, scale2: f32,
};
@group(0) @binding(0) var<uniform> ip: BitlinearI8Params;
@group(0) @binding(1) var<storage, read> i8_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> i8_s: array<f32>;
@group(0) @binding(3) var<storage, read> i8_w: array<u32>;
@group(0) @binding(4) var<storage, read_write> i8_y0: array<f32>;
@group(0) @binding(5) var<storage, read_write> i8_part: array<f32>;   // split: [z, N, sum O_p] integer sums
@group(0) @binding(6) var<storage, read_write> i8_y1: array<f32>;
@group(0) @binding(7) var<storage, read_write> i8_y2: array<f32>;
// [word][row] and [word][output]: a half-warp's 16 threads read 16 consecutive vec4 of a
// word's row (no bank conflicts; [output][word] put them 128 bytes apart: 1.7x slower on an H200)
var<workgroup> i8_xs: array<array<vec4<u32>, 64>, I8_KC>;   // the tile's activations
var<workgroup> i8_ts: array<array<vec4<u32>, 64>, I8_KC>;   // its weights as int8 lanes

fn i8_ternary(w: u32) -> vec4<u32> {   // word k: lane j = t of column 4j + k
    let c = (vec4<u32>(w) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(0x03030303u);
    return (c + vec4<u32>(0x7f7f7f7fu)) ^ vec4<u32>(0x80808080u);
}

fn i8_dot16(x: vec4<u32>, t: vec4<u32>) -> i32 {   // 16 columns of one row and one output
    return dot4I8Packed(x.x, t.x) + dot4I8Packed(x.y, t.y) + dot4I8Packed(x.z, t.z) + dot4I8Packed(x.w, t.w);
}

fn i8_dots(x: vec4<u32>, t0: vec4<u32>, t1: vec4<u32>, t2: vec4<u32>, t3: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(i8_dot16(x, t0), i8_dot16(x, t1), i8_dot16(x, t2), i8_dot16(x, t3));
}

// o-tile t -> (part, the tile's first output in the part, the part's outputs, its first weight word)
fn i8_locate(t: u32) -> vec4<u32> {
    let t1 = (ip.o + 63u) / 64u;
    let t2 = t1 + (ip.o1 + 63u) / 64u;
    if (t < t1) { return vec4<u32>(0u, 64u * t, ip.o, 0u); }
    if (t < t2) { return vec4<u32>(1u, 64u * (t - t1), ip.o1, ip.base1); }
    return vec4<u32>(2u, 64u * (t - t2), ip.o2, ip.base2);
}

@compute @workgroup_size(16, 16)
fn bitlinear_forward_i8(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = ip.n;
    let at = i8_locate(wid.x);
    let O = at.z;
    let G = (ip.i + 15u) / 16u;     // packed words per weight row = xq8 vec4s per row
    let n0 = wid.y * I8_ROWS;
    let o0 = at.y;
    let wend = min(G, (wid.z + 1u) * ip.kw);
    var acc0 = vec4<i32>(0);
    var acc1 = vec4<i32>(0);
    var acc2 = vec4<i32>(0);
    var acc3 = vec4<i32>(0);
    // thread lid stages element lid and lid + 256 of a chunk: rows / outputs sr and sr + 32 of
    // word sk (lid = 8 sr + sk); the next chunk's are loaded before this one is multiplied
    let sr = lid / I8_KC;
    let sk = lid % I8_KC;
    var w0 = wid.z * ip.kw;
    var xa = i8_load_x(n0 + sr, w0 + sk, wend, G);
    var xb = vec4<u32>(0u);
    if (I8_ROWS == 64u) { xb = i8_load_x(n0 + sr + 32u, w0 + sk, wend, G); }
    var wa = i8_load_w(at, o0 + sr, w0 + sk, wend, G);
    var wb = i8_load_w(at, o0 + sr + 32u, w0 + sk, wend, G);
    for (; w0 < wend; w0 += I8_KC) {
        i8_xs[sk][sr] = xa;
        if (I8_ROWS == 64u) { i8_xs[sk][sr + 32u] = xb; }
        i8_ts[sk][sr] = i8_ternary(wa);
        i8_ts[sk][sr + 32u] = i8_ternary(wb);
        workgroupBarrier();
        let wn = w0 + I8_KC + sk;
        xa = i8_load_x(n0 + sr, wn, wend, G);
        if (I8_ROWS == 64u) { xb = i8_load_x(n0 + sr + 32u, wn, wend, G); }
        wa = i8_load_w(at, o0 + sr, wn, wend, G);
        wb = i8_load_w(at, o0 + sr + 32u, wn, wend, G);
        for (var k = 0u; k < I8_KC; k++) {
            let t0 = i8_ts[k][tx];
            let t1 = i8_ts[k][tx + 16u];
            let t2 = i8_ts[k][tx + 32u];
            let t3 = i8_ts[k][tx + 48u];
            acc0 += i8_dots(i8_xs[k][ty], t0, t1, t2, t3);
            acc1 += i8_dots(i8_xs[k][ty + 16u], t0, t1, t2, t3);
            if (I8_ROWS == 64u) {
                acc2 += i8_dots(i8_xs[k][ty + 32u], t0, t1, t2, t3);
                acc3 += i8_dots(i8_xs[k][ty + 48u], t0, t1, t2, t3);
            }
        }
        workgroupBarrier();
    }
    i8_store(n0 + ty, o0 + tx, acc0, wid.z, at);
    i8_store(n0 + ty + 16u, o0 + tx, acc1, wid.z, at);
    if (I8_ROWS == 64u) {
        i8_store(n0 + ty + 32u, o0 + tx, acc2, wid.z, at);
        i8_store(n0 + ty + 48u, o0 + tx, acc3, wid.z, at);
    }
}

fn i8_load_x(n: u32, wi: u32, wend: u32, G: u32) -> vec4<u32> {   // row n's word wi (zeros past the edges)
    if (n < ip.n && wi < wend) { return i8_x[n * G + wi]; }
    return vec4<u32>(0u);   // zero activations: their weights never count
}

fn i8_load_w(at: vec4<u32>, o: u32, wi: u32, wend: u32, G: u32) -> u32 {   // output o's word wi of part at.x
    if (o < at.z && wi < wend) { return i8_w[at.w + o * G + wi]; }
    return 0x55555555u;   // codes 1: t = 0
}

fn i8_store(n: u32, o: u32, acc: vec4<i32>, z: u32, at: vec4<u32>) {   // outputs o + 16b of row n in part at.x
    if (n >= ip.n) { return; }
    let part = at.x;
    let O = at.z;
    let total = ip.o + ip.o1 + ip.o2;
    var col = 0u;      // the part's first column in part[z, n, :]
    var scale = ip.scale;
    if (part == 1u) { col = ip.o; scale = ip.scale1; }
    if (part == 2u) { col = ip.o + ip.o1; scale = ip.scale2; }
    for (var b = 0u; b < 4u; b++) {
        let oo = o + 16u * b;
        if (oo < O) {
            if (ip.split != 0u) { i8_part[(z * ip.n + n) * total + col + oo] = f32(acc[b]); continue; }
            let idx = n * O + oo;
            var v = f32(acc[b]) * scale / i8_s[n];
            if (ip.accumulate != 0u) { v = i8_get(part, idx) + v; }
            i8_put(part, idx, v);
        }
    }
}

fn i8_get(part: u32, i: u32) -> f32 {   // y_part[i]
    if (part == 1u) { return i8_y1[i]; }
    if (part == 2u) { return i8_y2[i]; }
    return i8_y0[i];
}

fn i8_put(part: u32, i: u32, v: f32) {   // y_part[i] = v
    if (part == 0u) { i8_y0[i] = v; }
    if (part == 1u) { i8_y1[i] = v; }
    if (part == 2u) { i8_y2[i] = v; }
}
