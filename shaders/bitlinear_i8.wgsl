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
//   0 params BitlinearI8Params {N, I, O, scale, accumulate, kw, split} |
//   1 xq8[N, 4*ceil(I/16)] u32 read (seen as vec4: one per packed weight word) |
//   2 s[N] read | 3 w_packed[O, ceil(I/16)] u32 read | 4 y[N, O] read_write |
//   5 part[slices, N, O] read_write
//   Split-K as bitlinear_forward (splitk.wgsl): workgroup z sums words [z*kw, (z+1)*kw)
//   only; with split = 1 it writes the integer sums, as f32, to part[z, N, O].
//   dispatch: groups (ceil(O/64), ceil(N/64), slices); a 16x16 workgroup owns a 64 x 64
//   tile of y, thread (tx, ty) rows ty + 16a and outputs tx + 16b (a, b < 4), the 16 sums
//   in named variables (an array indexed in a loop lives in memory on NVIDIA's Vulkan
//   compiler). Per I8_KC words the workgroup stages the tile's activations and its
//   weights, the weights decoded once into int8 lanes (i8_ternary); then each thread's
//   16 sums take 64 dot4I8Packed per word (4 vec4 loads of xq8, 4 of weights).
//
// Decoding a packed weight word w (16 two-bit codes c, t = c - 1): lane j of
//   (w >> 2k) & 0x03030303 is the code of column 4j + k, in 0..2. Adding 0x7f to a byte
//   below 0x80 never carries, and (c + 0x7f) ^ 0x80 is c - 1 as a two's-complement byte:
//   four words of int8 weights from 15 integer operations, once per workgroup and word.
//
// Measured on an H200 (bench/matmul.py, 256 rows): 3-4x the f32 kernel at 2B-4T widths (1.9x
// for k, v: 640 outputs), 5-6x at 1024 rows; other tiles (bench/i8_variants.wgsl: 8 rows
// or 8 outputs per thread, 16 words per chunk, weights decoded per thread) were within
// 3 % or slower.

const I8_KC: u32 = 8u;   // packed words (16 columns each) per staged chunk

struct BitlinearI8Params { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, kw: u32, split: u32 };
@group(0) @binding(0) var<uniform> ip: BitlinearI8Params;
@group(0) @binding(1) var<storage, read> i8_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> i8_s: array<f32>;
@group(0) @binding(3) var<storage, read> i8_w: array<u32>;
@group(0) @binding(4) var<storage, read_write> i8_y: array<f32>;
@group(0) @binding(5) var<storage, read_write> i8_part: array<f32>;   // split: [z, N, O] integer sums
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

@compute @workgroup_size(16, 16)
fn bitlinear_forward_i8(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = ip.n;
    let O = ip.o;
    let G = (ip.i + 15u) / 16u;     // packed words per weight row = xq8 vec4s per row
    let n0 = wid.y * 64u;
    let o0 = wid.x * 64u;
    let wend = min(G, (wid.z + 1u) * ip.kw);
    var acc0 = vec4<i32>(0);
    var acc1 = vec4<i32>(0);
    var acc2 = vec4<i32>(0);
    var acc3 = vec4<i32>(0);
    for (var w0 = wid.z * ip.kw; w0 < wend; w0 += I8_KC) {
        for (var e = lid; e < 64u * I8_KC; e += 256u) {
            let r = e / I8_KC;
            let wi = w0 + e % I8_KC;
            var xv = vec4<u32>(0u);   // zero activations past the edges: their weights never count
            if (n0 + r < N && wi < wend) { xv = i8_x[(n0 + r) * G + wi]; }
            i8_xs[e % I8_KC][r] = xv;
            var wv = 0x55555555u;
            if (o0 + r < O && wi < wend) { wv = i8_w[(o0 + r) * G + wi]; }
            i8_ts[e % I8_KC][r] = i8_ternary(wv);
        }
        workgroupBarrier();
        for (var k = 0u; k < I8_KC; k++) {
            let t0 = i8_ts[k][tx];
            let t1 = i8_ts[k][tx + 16u];
            let t2 = i8_ts[k][tx + 32u];
            let t3 = i8_ts[k][tx + 48u];
            acc0 += i8_dots(i8_xs[k][ty], t0, t1, t2, t3);
            acc1 += i8_dots(i8_xs[k][ty + 16u], t0, t1, t2, t3);
            acc2 += i8_dots(i8_xs[k][ty + 32u], t0, t1, t2, t3);
            acc3 += i8_dots(i8_xs[k][ty + 48u], t0, t1, t2, t3);
        }
        workgroupBarrier();
    }
    i8_store(n0 + ty, o0 + tx, acc0, wid.z);
    i8_store(n0 + ty + 16u, o0 + tx, acc1, wid.z);
    i8_store(n0 + ty + 32u, o0 + tx, acc2, wid.z);
    i8_store(n0 + ty + 48u, o0 + tx, acc3, wid.z);
}

fn i8_store(n: u32, o: u32, acc: vec4<i32>, z: u32) {   // outputs o + 16b of row n
    if (n >= ip.n) { return; }
    for (var b = 0u; b < 4u; b++) {
        let oo = o + 16u * b;
        if (oo < ip.o) {
            let idx = n * ip.o + oo;
            if (ip.split != 0u) { i8_part[z * ip.n * ip.o + idx] = f32(acc[b]); continue; }
            let v = f32(acc[b]) * ip.scale / i8_s[n];
            if (ip.accumulate != 0u) { i8_y[idx] = i8_y[idx] + v; } else { i8_y[idx] = v; }
        }
    }
}
