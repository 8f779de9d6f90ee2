// prelude.wgsl — what several kernel files share, written once. The shader reader
// (gpu/device.py read_shader) appends this file to every module it compiles, after
// the backend's directives and the kernel file itself: WGSL declarations may come in
// any order, so a kernel file uses these names as if it had declared them, and
// compiler line numbers stay the file's own. Unused declarations cost nothing (an
// entry point gets workgroup memory only for the variables it reaches).
//
// Bindings: none (a binding here would collide with the files' own).

const WG: u32 = 256u;           // the usual workgroup size: a row per workgroup, or 256 elements
const NEG_BIG: f32 = -3.0e38;   // start of a running max: finite, so exp(NEG_BIG - m) is 0, never NaN

// ---------------------------------------------------------------- workgroup reductions
// Tree reductions over invocations 0..n-1 (n a power of two <= WG, at most the
// workgroup size): every invocation passes its x and gets the total. Call in uniform
// control flow. The tree is fixed — stage s (n/2, n/4, .., 1) adds the value at l + s
// into l — so results are reproducible bit for bit on every backend. For n = 64, 128 or
// 256 it is evaluated in two barriers instead of one a stage (H200: ~0.14 against ~0.63
// us a reduction, bench/latency_probe.py): invocation l < 32 adds its column l, l + 32,
// .. down to stage 32, then every invocation adds the last 32 values itself, the same
// pairs in straight-line code (no loop-indexed arrays: NVIDIA puts those in memory).
var<workgroup> wg_red: array<f32, WG>;
var<workgroup> wg_red32: array<vec4<f32>, 8>;   // stage 32's values l at [l / 4][l % 4]

fn wg_op(a: f32, b: f32, take_max: bool) -> f32 {
    if (take_max) { return max(a, b); }
    return a + b;
}

fn wg_op4(a: vec4<f32>, b: vec4<f32>, take_max: bool) -> vec4<f32> {
    if (take_max) { return max(a, b); }
    return a + b;
}

fn wg_reduce(lid: u32, x: f32, n: u32, take_max: bool) -> f32 {
    wg_red[lid] = x;
    workgroupBarrier();
    if (n < 64u) {   // stage by stage
        for (var s = n / 2u; s > 0u; s = s >> 1u) {
            if (lid < s) { wg_red[lid] = wg_op(wg_red[lid], wg_red[lid + s], take_max); }
            workgroupBarrier();
        }
        let total = wg_red[0];
        workgroupBarrier();
        return total;
    }
    if (lid < 32u) {   // column lid down to stage 32
        var c: f32;
        if (n == 64u) {
            c = wg_op(wg_red[lid], wg_red[lid + 32u], take_max);
        } else if (n == 128u) {
            c = wg_op(wg_op(wg_red[lid], wg_red[lid + 64u], take_max),
                      wg_op(wg_red[lid + 32u], wg_red[lid + 96u], take_max), take_max);
        } else {   // 256
            let a = wg_op(wg_op(wg_red[lid], wg_red[lid + 128u], take_max),
                          wg_op(wg_red[lid + 64u], wg_red[lid + 192u], take_max), take_max);
            let b = wg_op(wg_op(wg_red[lid + 32u], wg_red[lid + 160u], take_max),
                          wg_op(wg_red[lid + 96u], wg_red[lid + 224u], take_max), take_max);
            c = wg_op(a, b, take_max);
        }
        wg_red32[lid / 4u][lid % 4u] = c;
    }
    workgroupBarrier();
    // stages 16, 8, 4, 2, 1: values l and l + 16 are [l / 4] and [l / 4 + 4], and so on
    let e0 = wg_op4(wg_op4(wg_red32[0], wg_red32[4], take_max), wg_op4(wg_red32[2], wg_red32[6], take_max), take_max);
    let e1 = wg_op4(wg_op4(wg_red32[1], wg_red32[5], take_max), wg_op4(wg_red32[3], wg_red32[7], take_max), take_max);
    let f = wg_op4(e0, e1, take_max);
    return wg_op(wg_op(f.x, f.z, take_max), wg_op(f.y, f.w, take_max), take_max);
}

fn wg_sum(lid: u32, x: f32, n: u32) -> f32 { return wg_reduce(lid, x, n, false); }

fn wg_max(lid: u32, x: f32, n: u32) -> f32 { return wg_reduce(lid, x, n, true); }

// A row's sum of squares four columns a turn (the norms: their loads issued together)
fn sum_sq4(acc: f32, v: vec4<f32>) -> f32 {   // acc + v.x^2 + .. + v.w^2, added one after another
    var a = acc;
    a += v.x * v.x;
    a += v.y * v.y;
    a += v.z * v.z;
    a += v.w * v.w;
    return a;
}

// ---------------------------------------------------------------- MLP gating
// h = act(g) * u, act relu^2 or SiLU (relu2.wgsl; matvec.wgsl's norm fuses it when decoding).
const GATE_RELU2: u32 = 1u;
const GATE_SILU: u32 = 2u;

fn sigmoid(x: f32) -> f32 {   // without overflow: exp of a non-positive number only
    let e = exp(-abs(x));
    return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= 0.0);
}

fn gating(act: u32, g: f32, u: f32) -> f32 {
    if (act == GATE_SILU) { return g * sigmoid(g) * u; }
    let r = max(g, 0.0);
    return r * r * u;
}

// ---------------------------------------------------------------- hashing
// PCG output permutation of one LCG step: a good 32-bit integer hash (LoRA dropout masks,
// the sampler's random numbers).
fn pcg(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

// ---------------------------------------------------------------- bf16
// Element e of a bf16 array stored two per u32, low half first (word = array[e >> 1]):
// a bf16 is the top half of an f32, so widening is a shift. No shader-f16 needed.
fn bf16_at(word: u32, e: u32) -> f32 {
    return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (e & 1u) == 1u));
}

// ---------------------------------------------------------------- packed ternary weights
// w_packed[O, ceil(I/16)] u32 (formats/tensors.py): weight (o, i) is code
// (word >> 2*(i%16)) & 3 of word o*ceil(I/16) + i/16, and t = code - 1 in {-1, 0, 1}.
// 0x55555555 is a word of zero weights.
fn ternary_at(word: u32, k: u32) -> f32 {          // weight of column k (< 16) of a word
    return f32((word >> (2u * k)) & 3u) - 1.0;
}

fn ternary_quad(word: u32, q: u32) -> vec4<f32> {   // weights of columns 4q .. 4q+3 of a word
    let b = word >> (8u * q);
    return vec4<f32>(vec4<u32>(b & 3u, (b >> 2u) & 3u, (b >> 4u) & 3u, (b >> 6u) & 3u)) - 1.0;
}

// ---------------------------------------------------------------- int8 activations
// BitLinear's per-token activation quantiser (HF ActQuant): q = clamp(round(v * s), -128, 127)
// with s = 127 / max|row|; WGSL round() rounds half to even, like torch.round.
fn quant_i8(v: f32, s: f32) -> f32 {
    return clamp(round(v * s), -128.0, 127.0);
}

// Packed int8 activations, the GPU's input to bitlinear_i8.wgsl: xq8[N, 4*ceil(I/16)] u32.
// Per 16 columns (one packed ternary word) four words; byte j of word k holds column
// 16g + 4j + k of group g as a two's-complement int8, so word k lines up with the
// weight bits (w >> 2k) & 0x03030303 (bitlinear_i8.wgsl). Columns past I are 0.
fn pack_i8(q: vec4<f32>) -> u32 {                  // q: 4 integers in [-128, 127], byte j = q[j]
    let b = bitcast<vec4<u32>>(vec4<i32>(q)) & vec4<u32>(0xffu);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

// ---------------------------------------------------------------- 64 x 128 tile products
// The inner loop of the f32 matmuls that tile their output in 64 rows x 128 columns over
// 16 x 16 threads, the reduction staged 16 indices (k) at a time in workgroup memory:
//   mt_a[r][q]   row r of the tile, k = 4q .. 4q+3 of the chunk
//   mt_b[k][c]   k of the chunk, columns 4c .. 4c+3 (one vec4 of padding a row: a warp's
//                stores of a transposed chunk, 8 columns x 4 k, meet two-way bank
//                conflicts, not four-way)
// Thread (tx, ty) keeps rows ty + 16a (a < 4) x column quads tx, tx + 16 as 8 vec4 sums,
// MtSums (named vectors: registers), and mt_quad adds the products of k quad q, k in
// order. Per quad a thread reads 4 vec4s of mt_a (two addresses a warp: broadcasts) and
// 8 of mt_b for 128 multiply-adds. Users: bitlinear_backward_input (dy; ternary W
// decoded), linear_forward (x; W transposed), linear_backward_input (dy; W).
var<workgroup> mt_a: array<array<vec4<f32>, 4>, 64>;
var<workgroup> mt_b: array<array<vec4<f32>, 33>, 16>;

// a<a><b>: rows ty + 16a, column quad tx + 16b
struct MtSums { a00: vec4<f32>, a01: vec4<f32>, a10: vec4<f32>, a11: vec4<f32>,
                a20: vec4<f32>, a21: vec4<f32>, a30: vec4<f32>, a31: vec4<f32> };

// The products of k quad q of the staged chunk (k = 4q .. 4q+3, in order). Called with
// q = 0, 1, 2, 3 spelled out rather than in a loop: constant indices after inlining, 2-8 %
// faster on the H200 at N = 1024 (the same bits).
fn mt_quad(acc: MtSums, q: u32, ty: u32, tx: u32) -> MtSums {
    var s = acc;
    let d0 = mt_a[ty][q];
    let d1 = mt_a[ty + 16u][q];
    let d2 = mt_a[ty + 32u][q];
    let d3 = mt_a[ty + 48u][q];
    var w0 = mt_b[q * 4u][tx];
    var w1 = mt_b[q * 4u][tx + 16u];
    s.a00 += d0.x * w0; s.a01 += d0.x * w1; s.a10 += d1.x * w0; s.a11 += d1.x * w1;
    s.a20 += d2.x * w0; s.a21 += d2.x * w1; s.a30 += d3.x * w0; s.a31 += d3.x * w1;
    w0 = mt_b[q * 4u + 1u][tx];
    w1 = mt_b[q * 4u + 1u][tx + 16u];
    s.a00 += d0.y * w0; s.a01 += d0.y * w1; s.a10 += d1.y * w0; s.a11 += d1.y * w1;
    s.a20 += d2.y * w0; s.a21 += d2.y * w1; s.a30 += d3.y * w0; s.a31 += d3.y * w1;
    w0 = mt_b[q * 4u + 2u][tx];
    w1 = mt_b[q * 4u + 2u][tx + 16u];
    s.a00 += d0.z * w0; s.a01 += d0.z * w1; s.a10 += d1.z * w0; s.a11 += d1.z * w1;
    s.a20 += d2.z * w0; s.a21 += d2.z * w1; s.a30 += d3.z * w0; s.a31 += d3.z * w1;
    w0 = mt_b[q * 4u + 3u][tx];
    w1 = mt_b[q * 4u + 3u][tx + 16u];
    s.a00 += d0.w * w0; s.a01 += d0.w * w1; s.a10 += d1.w * w0; s.a11 += d1.w * w1;
    s.a20 += d2.w * w0; s.a21 += d2.w * w1; s.a30 += d3.w * w0; s.a31 += d3.w * w1;
    return s;
}

// ---------------------------------------------------------------- CPU register tiles
// The CPU matmul variants (bitlinear.wgsl, linear.wgsl: *_cpu) keep an invocation's
// 16 outputs of a row as one mat4x4 (column b = outputs 4b .. 4b+3) and the weights of
// 4 columns for 16 outputs as four mat4x4 (m_b's column k = output 4b+k's 4 weights).
// x * m is the vector of the four dot products, so a row's 64 multiply-adds are one line.
fn row_dots16(x: vec4<f32>, m0: mat4x4<f32>, m1: mat4x4<f32>, m2: mat4x4<f32>, m3: mat4x4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(x * m0, x * m1, x * m2, x * m3);
}

// R8: 32 floats in eight named vec4s (32 dims of a row, 32 outputs of a row, or 4
// values of 8 rows), which CPU compilers keep in registers where a function-local
// array indexed in a loop would live in memory (attention.wgsl, bitlinear.wgsl *_d32 / *_cpu).
struct R8 { a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>, e: vec4<f32>, f: vec4<f32>, g: vec4<f32>, h: vec4<f32> };

fn r8_dot(x: R8, y: R8) -> f32 {
    let s = x.a * y.a + x.b * y.b + x.c * y.c + x.d * y.d + x.e * y.e + x.f * y.f + x.g * y.g + x.h * y.h;
    return s.x + s.y + s.z + s.w;
}

fn r8_axpby(x: R8, a: f32, y: R8, b: f32) -> R8 {   // a x + b y
    return R8(a * x.a + b * y.a, a * x.b + b * y.b, a * x.c + b * y.c, a * x.d + b * y.d,
              a * x.e + b * y.e, a * x.f + b * y.f, a * x.g + b * y.g, a * x.h + b * y.h);
}

fn r8_fma(x: R8, s: f32, y: R8) -> R8 {   // x + s y
    return R8(x.a + s * y.a, x.b + s * y.b, x.c + s * y.c, x.d + s * y.d,
              x.e + s * y.e, x.f + s * y.f, x.g + s * y.g, x.h + s * y.h);
}

fn r8_scale(x: R8, s: f32) -> R8 {
    return R8(s * x.a, s * x.b, s * x.c, s * x.d, s * x.e, s * x.f, s * x.g, s * x.h);
}

// An 8-row x 32-column register tile of the CPU matmuls (bitlinear.wgsl, linear.wgsl *_cpu).
struct T8 { r0: R8, r1: R8, r2: R8, r3: R8, r4: R8, r5: R8, r6: R8, r7: R8 };   // 8 rows x 32 columns
struct U8 { a: vec4<u32>, b: vec4<u32> };   // offsets of 8 rows

fn r8_add(x: R8, y: R8) -> R8 {
    return R8(x.a + y.a, x.b + y.b, x.c + y.c, x.d + y.d, x.e + y.e, x.f + y.f, x.g + y.g, x.h + y.h);
}

fn r8_dot4(d: vec4<f32>, t0: R8, t1: R8, t2: R8, t3: R8) -> R8 {   // d.x t0 + d.y t1 + d.z t2 + d.w t3
    return R8(d.x * t0.a + d.y * t1.a + d.z * t2.a + d.w * t3.a, d.x * t0.b + d.y * t1.b + d.z * t2.b + d.w * t3.b,
              d.x * t0.c + d.y * t1.c + d.z * t2.c + d.w * t3.c, d.x * t0.d + d.y * t1.d + d.z * t2.d + d.w * t3.d,
              d.x * t0.e + d.y * t1.e + d.z * t2.e + d.w * t3.e, d.x * t0.f + d.y * t1.f + d.z * t2.f + d.w * t3.f,
              d.x * t0.g + d.y * t1.g + d.z * t2.g + d.w * t3.g, d.x * t0.h + d.y * t1.h + d.z * t2.h + d.w * t3.h);
}

// row r += x_r . (t0, t1, t2, t3) (x: a vec4 of each of the 8 rows): four products summed,
// then added to the tile (fewer sums in flight than four updates)
fn t8_dot4(a: T8, x: R8, t0: R8, t1: R8, t2: R8, t3: R8) -> T8 {
    return T8(r8_add(a.r0, r8_dot4(x.a, t0, t1, t2, t3)), r8_add(a.r1, r8_dot4(x.b, t0, t1, t2, t3)),
              r8_add(a.r2, r8_dot4(x.c, t0, t1, t2, t3)), r8_add(a.r3, r8_dot4(x.d, t0, t1, t2, t3)),
              r8_add(a.r4, r8_dot4(x.e, t0, t1, t2, t3)), r8_add(a.r5, r8_dot4(x.f, t0, t1, t2, t3)),
              r8_add(a.r6, r8_dot4(x.g, t0, t1, t2, t3)), r8_add(a.r7, r8_dot4(x.h, t0, t1, t2, t3)));
}

// ---------------------------------------------------------------- optimizer state
// The 16-word state buffer that grad_norm.wgsl fills and adamw.wgsl reads:
//   sumsq f32 | norm f32 | clip f32 | gmul f32 | skip u32 | skipped u32 | step u32 |
//   step_size f32 | bc2_sqrt f32 | pad x7
struct State {
    sumsq: f32, norm: f32, clip: f32, gmul: f32,
    skip: u32, skipped: u32, step: u32, step_size: f32,
    bc2_sqrt: f32, pad0: u32, pad1: u32, pad2: u32, pad3: u32, pad4: u32, pad5: u32, pad6: u32,
};
