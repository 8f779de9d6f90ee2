// lora.wgsl — the LoRA branch of one adapted projection, as PEFT computes it:
//   y[N, O] += scale * B( A( dropout(x) ) ),  scale = alpha / R,
//   A[R, I], B[O, R] trainable f32; x[N, I] is the layer input BEFORE the BitLinear
//   activation quantiser.
// Forward keeps u[N, R] = dropout(x) A^T for the backward.
//
// Dropout (PEFT's nn.Dropout on the branch input only): element (n, i) is kept when
//   hash(seed, step, n * I + i) >= keep_threshold,   keep_threshold = floor(p * 2^32)
// and a kept element is multiplied by keep_scale = 1 / (1 - p). The hash is counter
// based (below, `dropout_hash`), so forward and backward regenerate the same mask on
// the GPU from two u32s, and nothing random is uploaded. The caller makes `seed`
// differ per (run, layer, module) and `step` per micro-batch. `step` is read from a
// buffer (`stream[0]`, written by the host each step), not the uniform, so a recorded
// step replays unchanged (gpu/device.py Program). p = 0: threshold 0, keep_scale 1,
// every element kept (`step` is read but unused).
//
// Backward (dy[N, O] is the gradient of the projection's output):
//   dB[O, R] += scale * dy^T u                       (lora_grad_b)
//   du[N, R]  = scale * dy B                         (lora_grad_u, overwrite)
//   dA[R, I] += du^T dropout(x)                      (lora_grad_a)
//   dx[N, I] += keep(n, i) * keep_scale * (du A)     (lora_grad_x: adds into the layer
//                                                     input gradient, base path included)
// Trainable-parameter gradients accumulate (micro-batches) where params.acc = 1; with
// acc = 0 (a step's first micro-batch) dA, dB are written, not read: the optimizer then
// need not zero them. Every output element has exactly one writer, no atomics; on GPUs
// the sums over N are split in slices (lora_grad_b_split, lora_grad_axb and their
// reduces, below).
//
// Entry points (all: 0 params uniform LoraParams, shared by the wrapper):
//   params {N, I, O, R, scale, keep_threshold, keep_scale, seed, per (rows per slice,
//   the split kernels), acc (dA, dB: 1 +=, 0 =)}
// The three that apply dropout (lora_down, lora_grad_a, lora_grad_x and their *_rows)
// also bind 4 stream[1] u32 read: the dropout stream `step`.
// lora_down:   1 x[N, I] read | 2 a[R, I] read | 3 u[N, R] write
//              one workgroup (64) per (n, r): N*R workgroups split over x, y
// lora_up:     1 u[N, R] read | 2 b[O, R] read | 3 y[N, O] read_write (+=)
//              one invocation per (n, o): ceil(N*O / 256) workgroups
// lora_grad_b: 1 dy[N, O] read | 2 u[N, R] read | 3 db[O, R] read_write (+= or =)
//              one invocation per (r, o), loops over n: ceil(R*O / 256) workgroups
// lora_grad_u: 1 dy[N, O] read | 2 b[O, R] read | 3 du[N, R] write
//              one workgroup (64) per (n, r): N*R workgroups
// lora_grad_a: 1 du[N, R] read | 2 x[N, I] read | 3 da[R, I] read_write (+= or =)
//              one invocation per (r, i), loops over n: ceil(R*I / 256) workgroups
// lora_grad_x: 1 du[N, R] read | 2 a[R, I] read | 3 dx[N, I] read_write (+=)
//              one invocation per (n, i): ceil(N*I / 256) workgroups
// On GPUs, lora_down, lora_up, lora_grad_u and lora_grad_x run as tiles (*_tile, below:
// loads shared between rows, ranks or columns; the same bits) where widths allow.
//
// CPU variants *_rows (Device.kind "cpu"): a CPU runs a workgroup as a loop on one thread,
// SIMD across invocations, so: no barriers, no workgroup memory, LR invocations per
// workgroup (ceil(invocations / LR) workgroups split over x, y), vec4 where the row
// layout allows. Bindings as the GPU kernel's, the named ones seen as vec4.
// lora_down_rows   (I % 4 == 0) x, a vec4; one (n..n+3, r..r+3) per invocation, private vec4 sums
// lora_grad_a_rows (I % 4 == 0) x, da vec4; one (r..r+3, i..i+3) per invocation
// lora_grad_u_rows (O % 4 == 0, R % 4 == 0) dy, b, du vec4; one (n, r..r+3) per invocation
// lora_up_rows     (O % 4 == 0, R % 4 == 0) u, b, y vec4; one (n..n+3, o..o+3) per invocation
// lora_grad_b_rows (O % 4 == 0, R % 4 == 0) dy, u, db vec4; one (o..o+3, r..r+3) per invocation
// lora_grad_x_rows (I % 4 == 0, R % 4 == 0) du, a, dx vec4; one (n..n+3, i..i+3) per invocation
// (n..n+3: rows past N-1 are clamped on load, skipped on store.) Four rows per invocation
// share each loaded vec4 of a or b: SwiftShader ran down / up / grad_x 1.5-2x faster than
// with one row (each element's sum is the same expression: the same bits).
// The dropout mask of an element is made once per 4 r (down, grad_a: rows of a past R
// repeat row R-1 and are not stored). A vec4 load costs a CPU rasteriser about what a
// float does, so each loaded vec4 feeds 4 to 16 multiply-adds. The sums run in
// another order than the GPU kernels' (f32 rounding differs).

struct LoraParams {
    n: u32, i: u32, o: u32, r: u32,
    scale: f32, keep_threshold: u32, keep_scale: f32, seed: u32,
    per: u32, acc: u32,
};

const WR: u32 = 256u;  // workgroup of the reductions over I or O (H200: 64 lanes left lora_down_tile
                       // 1.6-2.3x slower at 2B-4T widths, N = 1024)

fn dropout_hash(seed: u32, step: u32, idx: u32) -> u32 {
    return pcg(idx ^ pcg(seed ^ pcg(step)));
}

// dropout(x)[n, i] / x[n, i]: 0 or keep_scale
fn keep_factor(p: LoraParams, step: u32, idx: u32) -> f32 {
    if (p.keep_threshold == 0u) { return 1.0; }
    return select(0.0, p.keep_scale, dropout_hash(p.seed, step, idx) >= p.keep_threshold);
}

// ---------------------------------------------------------------------------- forward
@group(0) @binding(0) var<uniform> p_down: LoraParams;
@group(0) @binding(1) var<storage, read> down_x: array<f32>;
@group(0) @binding(2) var<storage, read> down_a: array<f32>;
@group(0) @binding(3) var<storage, read_write> down_u: array<f32>;
@group(0) @binding(4) var<storage, read> down_stream: array<u32>;

@compute @workgroup_size(WR)
fn lora_down(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
             @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_down;
    let step = down_stream[0];
    let k = wid.x + wid.y * nw.x;  // = n * R + r
    if (k >= p.n * p.r) { return; }
    let n = k / p.r;
    let r = k % p.r;
    var acc = 0.0;
    for (var i = lid3.x; i < p.i; i += WR) {
        let idx = n * p.i + i;
        acc += down_x[idx] * keep_factor(p, step, idx) * down_a[r * p.i + i];
    }
    let total = wg_sum(lid3.x, acc, WR);
    if (lid3.x == 0u) { down_u[k] = total; }
}

@group(0) @binding(0) var<uniform> p_up: LoraParams;
@group(0) @binding(1) var<storage, read> up_u: array<f32>;
@group(0) @binding(2) var<storage, read> up_b: array<f32>;
@group(0) @binding(3) var<storage, read_write> up_y: array<f32>;

@compute @workgroup_size(WG)
fn lora_up(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
           @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_up;
    let k = (wid.x + wid.y * nw.x) * WG + lid3.x;  // = n * O + o
    if (k >= p.n * p.o) { return; }
    let n = k / p.o;
    let o = k % p.o;
    var acc = 0.0;
    for (var r = 0u; r < p.r; r++) { acc += up_u[n * p.r + r] * up_b[o * p.r + r]; }
    up_y[k] = up_y[k] + p.scale * acc;
}

// ---------------------------------------------------------------------------- backward
@group(0) @binding(0) var<uniform> p_gb: LoraParams;
@group(0) @binding(1) var<storage, read> gb_dy: array<f32>;
@group(0) @binding(2) var<storage, read> gb_u: array<f32>;
@group(0) @binding(3) var<storage, read_write> gb_db: array<f32>;

@compute @workgroup_size(WG)
fn lora_grad_b(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_gb;
    let k = (wid.x + wid.y * nw.x) * WG + lid3.x;  // = r * O + o (o fastest: dy reads coalesce)
    if (k >= p.r * p.o) { return; }
    let r = k / p.o;
    let o = k % p.o;
    var acc = 0.0;
    for (var n = 0u; n < p.n; n++) { acc += gb_dy[n * p.o + o] * gb_u[n * p.r + r]; }
    let j = o * p.r + r;
    var old = 0.0;
    if (p.acc != 0u) { old = gb_db[j]; }
    gb_db[j] = old + p.scale * acc;
}

@group(0) @binding(0) var<uniform> p_gu: LoraParams;
@group(0) @binding(1) var<storage, read> gu_dy: array<f32>;
@group(0) @binding(2) var<storage, read> gu_b: array<f32>;
@group(0) @binding(3) var<storage, read_write> gu_du: array<f32>;

@compute @workgroup_size(WR)
fn lora_grad_u(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_gu;
    let k = wid.x + wid.y * nw.x;  // = n * R + r
    if (k >= p.n * p.r) { return; }
    let n = k / p.r;
    let r = k % p.r;
    var acc = 0.0;
    for (var o = lid3.x; o < p.o; o += WR) { acc += gu_dy[n * p.o + o] * gu_b[o * p.r + r]; }
    let total = wg_sum(lid3.x, acc, WR);
    if (lid3.x == 0u) { gu_du[k] = p.scale * total; }
}

@group(0) @binding(0) var<uniform> p_ga: LoraParams;
@group(0) @binding(1) var<storage, read> ga_du: array<f32>;
@group(0) @binding(2) var<storage, read> ga_x: array<f32>;
@group(0) @binding(3) var<storage, read_write> ga_da: array<f32>;
@group(0) @binding(4) var<storage, read> ga_stream: array<u32>;

@compute @workgroup_size(WG)
fn lora_grad_a(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_ga;
    let step = ga_stream[0];
    let k = (wid.x + wid.y * nw.x) * WG + lid3.x;  // = r * I + i
    if (k >= p.r * p.i) { return; }
    let r = k / p.i;
    let i = k % p.i;
    var acc = 0.0;
    for (var n = 0u; n < p.n; n++) {
        let idx = n * p.i + i;
        acc += ga_du[n * p.r + r] * ga_x[idx] * keep_factor(p, step, idx);
    }
    var old = 0.0;
    if (p.acc != 0u) { old = ga_da[k]; }
    ga_da[k] = old + acc;
}

@group(0) @binding(0) var<uniform> p_gx: LoraParams;
@group(0) @binding(1) var<storage, read> gx_du: array<f32>;
@group(0) @binding(2) var<storage, read> gx_a: array<f32>;
@group(0) @binding(3) var<storage, read_write> gx_dx: array<f32>;
@group(0) @binding(4) var<storage, read> gx_stream: array<u32>;

@compute @workgroup_size(WG)
fn lora_grad_x(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_gx;
    let step = gx_stream[0];
    let k = (wid.x + wid.y * nw.x) * WG + lid3.x;  // = n * I + i
    if (k >= p.n * p.i) { return; }
    let n = k / p.i;
    let i = k % p.i;
    let f = keep_factor(p, step, k);
    if (f == 0.0) { return; }
    var acc = 0.0;
    for (var r = 0u; r < p.r; r++) { acc += gx_du[n * p.r + r] * gx_a[r * p.i + i]; }
    gx_dx[k] = gx_dx[k] + f * acc;
}

// ---------------------------------------------------------------------------- split sums (GPU)
// The dA, dB sums over N cut into slices of `per` rows (grid z), so that a big GPU gets
// enough workgroups (one invocation per (r, column) looping over all N rows left
// ~160 workgroups on 132 SMs at 2B-4T widths). Invocation: one column c and ranks
// r0 .. r0+3 of one slice (dy or x read once for 4 ranks, the dropout hash once);
// raw slice sums go to part[z * count + e] in the gradient's own layout, and a reduce
// adds the slices in order, scales (dB: by scale) and writes (= or +=): splitk_reduce for
// dA, lora_grad_axb's third part for dB.
// lora_grad_b_split: 1 dy[N, O] read | 2 u[N, R] read | 3 part[slices, O*R] read_write   (e = o*R + r)
//   dispatch: (ceil(O / 256), ceil(R / 4), slices)
// dA's split sum (e = r*I + i) is a part of lora_grad_axb (below), as is dB's reduce.

@group(0) @binding(0) var<uniform> p_gbs: LoraParams;
@group(0) @binding(1) var<storage, read> gbs_dy: array<f32>;
@group(0) @binding(2) var<storage, read> gbs_u: array<f32>;
@group(0) @binding(3) var<storage, read_write> gbs_part: array<f32>;

fn gbs_u4(b: u32, last: u32) -> vec4<f32> {   // u[b .. b+3], clamped to the buffer's last float
    return vec4<f32>(gbs_u[min(b, last)], gbs_u[min(b + 1u, last)], gbs_u[min(b + 2u, last)], gbs_u[min(b + 3u, last)]);
}

@compute @workgroup_size(WG)
fn lora_grad_b_split(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let p = p_gbs;
    let o = wid.x * WG + lid3.x;
    if (o >= p.o) { return; }
    let r0 = wid.y * 4u;
    let last = p.n * p.r - 1u;       // u reads past rank R-1 are clamped inside the buffer, their sums unused
    let n1 = min(p.n, (wid.z + 1u) * p.per);
    var acc = vec4<f32>(0.0);
    var n = wid.z * p.per;
    for (; n + 4u <= n1; n += 4u) {   // four rows' loads issued together, added in order
        let d0 = gbs_dy[n * p.o + o];
        let d1 = gbs_dy[(n + 1u) * p.o + o];
        let d2 = gbs_dy[(n + 2u) * p.o + o];
        let d3 = gbs_dy[(n + 3u) * p.o + o];
        let u0 = gbs_u4(n * p.r + r0, last);
        let u1 = gbs_u4((n + 1u) * p.r + r0, last);
        let u2 = gbs_u4((n + 2u) * p.r + r0, last);
        let u3 = gbs_u4((n + 3u) * p.r + r0, last);
        acc += d0 * u0;
        acc += d1 * u1;
        acc += d2 * u2;
        acc += d3 * u3;
    }
    for (; n < n1; n++) { acc += gbs_dy[n * p.o + o] * gbs_u4(n * p.r + r0, last); }
    let base = wid.z * p.o * p.r + o * p.r + r0;
    for (var k = 0u; k < 4u && r0 + k < p.r; k++) { gbs_part[base + k] = acc[k]; }
}

// ---------------------------------------------------------------------------- GPU tiles
// The same sums as lora_down, lora_grad_u, lora_up and lora_grad_x, added in the same
// order (the same bits), with the loads shared: the kernels above re-read x or dy once
// per rank (and hash the mask once per rank), and read b[O, R] R floats apart between
// neighbouring invocations, one (row, rank) or (row, column) each.
// lora_down_tile:   bindings as lora_down. One workgroup (WR) per TRD rows x TK ranks:
//   lane l adds x[n, i] * keep * a[r, i] over i = l, l+WR, ... for all TRD x TK pairs (x
//   read and hashed once per rank block), then each pair's WR lane sums go through
//   wg_sum's tree. dispatch: (ceil(N / TRD), ceil(R / TK))
// lora_grad_u_tile (R % 4 == 0): 1 dy[N, O] read | 2 b[O, R] read, vec4 | 3 du[N, R] write;
//   as lora_down_tile over o, b[o, r0 ..] as vec4s. dispatch: (ceil(N / TRD), ceil(R / TK))
// Both keep the plain kernel's one WR-lane chain per (row, rank), so they pay only with
// enough workgroups (ops/lora.py TILE_MIN_GROUPS; on an H200 at N = 256, 64 workgroups of
// 4 rows ran 2x slower than lora_down's N*R with 64 lanes, 1.2-1.3x with 256; at N = 1024
// 256 workgroups ran 1.3-3x faster with 64 lanes, 1.4-5.5x with 256).
// lora_up_tile     (O % 4 == 0, R % 4 == 0): bindings as lora_up_rows. Invocation: columns
//   o..o+3 of TQ blocks of TR rows, one block a turn: b[o..o+3, :] read once for TR rows
//   (vec4s along r), each output's sum over r in order.
//   dispatch: ceil(ceil(N / (TR*TQ)) * O/4 / WT) split over x, y
// lora_grad_x's tile (I % 4 == 0) is a part of lora_grad_axb (below): as lora_up_tile over i,
//   a[r, i..i+3] one vec4, the mask of 4 elements hashed once.
const TK: u32 = 16u;   // ranks per workgroup of lora_down_tile / lora_grad_u_tile
const TRD: u32 = 4u;   // rows per workgroup of lora_down_tile / lora_grad_u_tile
const TR: u32 = 4u;    // rows a turn of lora_up_tile / lora_grad_axb's dx
override TQ: u32 = 1u; // turns (row blocks of TR) per invocation of lora_up_tile / lora_grad_axb's dx
                       // (ops/lora.py TQ): with more, b or a is read from memory once per TQ blocks
                       // (a cache hit after the first); the same bits at any TQ. 1 until timed
                       // on a GPU (bench/lora_kernels.py --tq)
const WT: u32 = 64u;   // workgroup of lora_up_tile (ops/lora.py WT)
const WRP: u32 = WR;   // a rank's row of lane sums in tile_red: unpadded, so that TK * WR floats
                       // fit WebGPU's default 16 KiB (tests/test_shader_limits.py); the tree's
                       // last stages then read rows 1 KiB apart, in one bank (16 values a row)
// The sums are named vec4 variables (row j, rank quad q: sjq), not a function-local array
// (which NVIDIA's Vulkan compiler keeps in memory: bitlinear.wgsl). A vec4 sum adds
// component by component: each (row, rank) pair's sum is the plain kernel's.

var<workgroup> tile_red: array<f32, TK * WRP>;

// One row's lane sums of ranks r0 .. r0+15 (q0..q3: four ranks each) through wg_sum's tree
// (the pairs wg_sum adds: the same bits), evaluated as wg_reduce does for WR = 256 lanes (the
// only width tile_col32 spells out): lane l adds rank l / 16's columns c = l % 16 and c + 16
// down to stage 32, adds those two (stage 16) and leaves the value in a slot only it read;
// then lane k < TK adds rank k's 16 values in straight-line code. Three barriers a row and no
// division, where a stage at a time took ten barriers and a divide per element (lavapipe,
// running lora_down_tile at 1024 x 2560, r 16: 2.3x faster). Lane k < TK gets rank k's
// total. Call in uniform control flow.
fn tile_row_sum(l: u32, q0: vec4<f32>, q1: vec4<f32>, q2: vec4<f32>, q3: vec4<f32>) -> f32 {
    for (var c = 0u; c < 4u; c++) {
        tile_red[c * WRP + l] = q0[c];
        tile_red[(4u + c) * WRP + l] = q1[c];
        tile_red[(8u + c) * WRP + l] = q2[c];
        tile_red[(12u + c) * WRP + l] = q3[c];
    }
    workgroupBarrier();
    let at = (l >> 4u) * WRP + (l & 15u);   // rank l / 16, column l % 16
    tile_red[at] = tile_col32(at) + tile_col32(at + 16u);
    workgroupBarrier();
    var total = 0.0;
    if (l < TK) {   // stages 8, 4, 2, 1 of rank l's 16 values, in wg_reduce's pairs
        let b = l * WRP;
        let f = (tile_quad(b) + tile_quad(b + 8u)) + (tile_quad(b + 4u) + tile_quad(b + 12u));
        total = (f.x + f.z) + (f.y + f.w);
    }
    workgroupBarrier();
    return total;
}

fn tile_col32(at: u32) -> f32 {   // stages 128, 64, 32 of one column: wg_reduce's pairs for 256 lanes
    let a = (tile_red[at] + tile_red[at + 128u]) + (tile_red[at + 64u] + tile_red[at + 192u]);
    let b = (tile_red[at + 32u] + tile_red[at + 160u]) + (tile_red[at + 96u] + tile_red[at + 224u]);
    return a + b;
}

fn tile_quad(at: u32) -> vec4<f32> {
    return vec4<f32>(tile_red[at], tile_red[at + 1u], tile_red[at + 2u], tile_red[at + 3u]);
}

fn down_a4(p: LoraParams, r: u32, i: u32) -> vec4<f32> {   // a[r .. r+3, i], rows past R-1 repeat row R-1
    let last = p.r - 1u;
    return vec4<f32>(down_a[min(r, last) * p.i + i], down_a[min(r + 1u, last) * p.i + i],
                     down_a[min(r + 2u, last) * p.i + i], down_a[min(r + 3u, last) * p.i + i]);
}

@compute @workgroup_size(WR)
fn lora_down_tile(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let p = p_down;
    let step = down_stream[0];
    let l = lid3.x;
    let n0 = wid.x * TRD;
    let r0 = wid.y * TK;
    let kq = (min(TK, p.r - r0) + 3u) / 4u;   // rank quads of this block
    let m0 = n0 * p.i;                        // rows n0 .. n0+3 of x, past N-1 repeating row N-1 (not stored)
    let m1 = min(n0 + 1u, p.n - 1u) * p.i;
    let m2 = min(n0 + 2u, p.n - 1u) * p.i;
    let m3 = min(n0 + 3u, p.n - 1u) * p.i;
    var s00 = vec4<f32>(0.0); var s01 = vec4<f32>(0.0); var s02 = vec4<f32>(0.0); var s03 = vec4<f32>(0.0);
    var s10 = vec4<f32>(0.0); var s11 = vec4<f32>(0.0); var s12 = vec4<f32>(0.0); var s13 = vec4<f32>(0.0);
    var s20 = vec4<f32>(0.0); var s21 = vec4<f32>(0.0); var s22 = vec4<f32>(0.0); var s23 = vec4<f32>(0.0);
    var s30 = vec4<f32>(0.0); var s31 = vec4<f32>(0.0); var s32 = vec4<f32>(0.0); var s33 = vec4<f32>(0.0);
    for (var i = l; i < p.i; i += WR) {
        let x0 = down_x[m0 + i] * keep_factor(p, step, m0 + i);
        let x1 = down_x[m1 + i] * keep_factor(p, step, m1 + i);
        let x2 = down_x[m2 + i] * keep_factor(p, step, m2 + i);
        let x3 = down_x[m3 + i] * keep_factor(p, step, m3 + i);
        if (kq > 0u) { let a = down_a4(p, r0, i); s00 += x0 * a; s10 += x1 * a; s20 += x2 * a; s30 += x3 * a; }
        if (kq > 1u) { let a = down_a4(p, r0 + 4u, i); s01 += x0 * a; s11 += x1 * a; s21 += x2 * a; s31 += x3 * a; }
        if (kq > 2u) { let a = down_a4(p, r0 + 8u, i); s02 += x0 * a; s12 += x1 * a; s22 += x2 * a; s32 += x3 * a; }
        if (kq > 3u) { let a = down_a4(p, r0 + 12u, i); s03 += x0 * a; s13 += x1 * a; s23 += x2 * a; s33 += x3 * a; }
    }
    let t0 = tile_row_sum(l, s00, s01, s02, s03);
    let t1 = tile_row_sum(l, s10, s11, s12, s13);
    let t2 = tile_row_sum(l, s20, s21, s22, s23);
    let t3 = tile_row_sum(l, s30, s31, s32, s33);
    if (l < TK && r0 + l < p.r) {   // u[n0 + j, r0 + l] for the rows below N
        let t = vec4<f32>(t0, t1, t2, t3);
        for (var j = 0u; j < TRD && n0 + j < p.n; j++) { down_u[(n0 + j) * p.r + r0 + l] = t[j]; }
    }
}

@compute @workgroup_size(WR)
fn lora_grad_u_tile(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let p = p_gu;
    let l = lid3.x;
    let n0 = wid.x * TRD;
    let r0 = wid.y * TK;
    let kq = min(TK, p.r - r0) / 4u;   // R % 4 == 0
    let R4 = p.r / 4u;
    let m0 = n0 * p.o;
    let m1 = min(n0 + 1u, p.n - 1u) * p.o;
    let m2 = min(n0 + 2u, p.n - 1u) * p.o;
    let m3 = min(n0 + 3u, p.n - 1u) * p.o;
    var s00 = vec4<f32>(0.0); var s01 = vec4<f32>(0.0); var s02 = vec4<f32>(0.0); var s03 = vec4<f32>(0.0);
    var s10 = vec4<f32>(0.0); var s11 = vec4<f32>(0.0); var s12 = vec4<f32>(0.0); var s13 = vec4<f32>(0.0);
    var s20 = vec4<f32>(0.0); var s21 = vec4<f32>(0.0); var s22 = vec4<f32>(0.0); var s23 = vec4<f32>(0.0);
    var s30 = vec4<f32>(0.0); var s31 = vec4<f32>(0.0); var s32 = vec4<f32>(0.0); var s33 = vec4<f32>(0.0);
    for (var o = l; o < p.o; o += WR) {
        let d0 = gu_dy[m0 + o]; let d1 = gu_dy[m1 + o]; let d2 = gu_dy[m2 + o]; let d3 = gu_dy[m3 + o];
        let b = o * R4 + r0 / 4u;   // b[o, r0 ..] as vec4s
        if (kq > 0u) { let v = gur_b[b]; s00 += d0 * v; s10 += d1 * v; s20 += d2 * v; s30 += d3 * v; }
        if (kq > 1u) { let v = gur_b[b + 1u]; s01 += d0 * v; s11 += d1 * v; s21 += d2 * v; s31 += d3 * v; }
        if (kq > 2u) { let v = gur_b[b + 2u]; s02 += d0 * v; s12 += d1 * v; s22 += d2 * v; s32 += d3 * v; }
        if (kq > 3u) { let v = gur_b[b + 3u]; s03 += d0 * v; s13 += d1 * v; s23 += d2 * v; s33 += d3 * v; }
    }
    let t0 = tile_row_sum(l, s00, s01, s02, s03);
    let t1 = tile_row_sum(l, s10, s11, s12, s13);
    let t2 = tile_row_sum(l, s20, s21, s22, s23);
    let t3 = tile_row_sum(l, s30, s31, s32, s33);
    if (l < TK && r0 + l < p.r) {
        let t = vec4<f32>(t0, t1, t2, t3);
        for (var j = 0u; j < TRD && n0 + j < p.n; j++) { gu_du[(n0 + j) * p.r + r0 + l] = p.scale * t[j]; }
    }
}

@compute @workgroup_size(WT)
fn lora_up_tile(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nw: vec3<u32>) {
    let O4 = p_upr.o / 4u;
    let k = (wid.x + wid.y * nw.x) * WT + lid3.x;   // = n/(TR*TQ) * O/4 + o/4
    if (k >= (p_upr.n + TR * TQ - 1u) / (TR * TQ) * O4) { return; }
    let nb = k / O4 * (TR * TQ);
    for (var q = 0u; q < TQ && nb + q * TR < p_upr.n; q++) { up_tile_rows(nb + q * TR, k % O4); }
}

fn up_tile_rows(n0: u32, o4: u32) {   // rows n0 .. n0+3 of lora_up_tile's block
    let p = p_upr;
    let R4 = p.r / 4u;
    let j = 4u * o4 * R4;                            // b[o, 0..3] for o = 4 o4
    let u0 = n0 * R4;                                // rows n0 .. n0+3 of u, past N-1: row N-1 (not stored)
    let u1 = min(n0 + 1u, p.n - 1u) * R4;
    let u2 = min(n0 + 2u, p.n - 1u) * R4;
    let u3 = min(n0 + 3u, p.n - 1u) * R4;
    var acc0 = vec4<f32>(0.0); var acc1 = vec4<f32>(0.0); var acc2 = vec4<f32>(0.0); var acc3 = vec4<f32>(0.0);
    for (var r4 = 0u; r4 < R4; r4++) {
        let b0 = upr_b[j + r4]; let b1 = upr_b[j + R4 + r4]; let b2 = upr_b[j + 2u * R4 + r4]; let b3 = upr_b[j + 3u * R4 + r4];
        let c0 = vec4<f32>(b0.x, b1.x, b2.x, b3.x);  // b[o..o+3, r] for r = 4 r4 .. 4 r4 + 3: added in r's order
        let c1 = vec4<f32>(b0.y, b1.y, b2.y, b3.y);
        let c2 = vec4<f32>(b0.z, b1.z, b2.z, b3.z);
        let c3 = vec4<f32>(b0.w, b1.w, b2.w, b3.w);
        let v0 = upr_u[u0 + r4]; let v1 = upr_u[u1 + r4]; let v2 = upr_u[u2 + r4]; let v3 = upr_u[u3 + r4];
        acc0 += v0.x * c0; acc0 += v0.y * c1; acc0 += v0.z * c2; acc0 += v0.w * c3;
        acc1 += v1.x * c0; acc1 += v1.y * c1; acc1 += v1.z * c2; acc1 += v1.w * c3;
        acc2 += v2.x * c0; acc2 += v2.y * c1; acc2 += v2.z * c2; acc2 += v2.w * c3;
        acc3 += v3.x * c0; acc3 += v3.y * c1; acc3 += v3.z * c2; acc3 += v3.w * c3;
    }
    up_store(n0, o4, acc0); up_store(n0 + 1u, o4, acc1); up_store(n0 + 2u, o4, acc2); up_store(n0 + 3u, o4, acc3);
}

// ---------------------------------------------------------------------------- split matmul (GPU)
// lora_down_mm: u = dropout(x) a^T as a small matmul, N rows x I x R, split over I. The
// tile above reduces each (row, rank) pair over 256 lanes and a tree, so a workgroup of 4
// rows reads all of a and pushes 64 pairs x 256 lane sums through workgroup memory. Here a
// workgroup owns MMR rows x 16 ranks of one slice of I (grid z, `per` values of i each, a
// multiple of MMK) and stages MMK values of i at a time: the rows' x times its dropout
// factor, v[MMR][MMK], and the ranks' weights m[MMK][16] = a[r, i]; thread (tx, ty) adds
// rank r0 + tx of rows n0 + ty and n0 + ty + 16 over its slice's i in order, and the next
// chunk's global loads are issued before this one is multiplied. The raw slice sums go to
// part[z, N, R], and splitk_reduce adds the slices in order into u; with one slice (grid
// z = 1) the kernel writes u itself (binding 3 is then u).
// Each pair's sum runs over i in order within a slice, then slices in order: another order
// than lora_down's and its tile's (f32 rounding differs; bounded in the tests).
// H100, 1024 rows, r 16, with its reduce (bench/lora_kernels.py): 0.029 ms at 2560 inputs
// (the tile 0.030), 0.043 at 6912 (0.050); in B's step 4.4 ms + 2.1 of reduces against the
// tile's 8.6. At 256 rows it is slower (0.025 against lora_down's 0.021): ops/lora.py
// MM_MIN_ROWS. (A lora_grad_u_mm of the same shape lost to lora_grad_u_tile: 0.028 against
// 0.023 ms at 2560 outputs.)
// lora_down_mm (I % 4 == 0): 1 x[N, I] read, vec4 | 2 a[R, I] read, vec4 |
//   3 part[slices, N, R] (or u[N, R]) read_write | 4 stream
//   dispatch: (ceil(N / MMR), ceil(R / 16), slices)   (ops/lora.py mm_plan)
const MMR: u32 = 32u;   // rows of a tile
const MMK: u32 = 32u;   // values of i a staged chunk
var<workgroup> mm_v: array<array<vec4<f32>, 8>, MMR>;   // [row][i quad] of the chunk
var<workgroup> mm_m: array<array<f32, 17>, MMK>;        // [i][rank], one float of padding a row:
                                                         // the transposed stores of a hit 32 banks

// The products of the staged chunk: thread (tx, ty)'s two sums, i in order
fn mm_chunk(acc: vec2<f32>, tx: u32, ty: u32) -> vec2<f32> {
    var s = acc;
    for (var q = 0u; q < 8u; q++) {
        let v0 = mm_v[ty][q];
        let v1 = mm_v[ty + 16u][q];
        let m0 = mm_m[4u * q][tx];
        let m1 = mm_m[4u * q + 1u][tx];
        let m2 = mm_m[4u * q + 2u][tx];
        let m3 = mm_m[4u * q + 3u][tx];
        s.x += v0.x * m0; s.y += v1.x * m0;
        s.x += v0.y * m1; s.y += v1.y * m1;
        s.x += v0.z * m2; s.y += v1.z * m2;
        s.x += v0.w * m3; s.y += v1.w * m3;
    }
    return s;
}

fn mm_index(p: LoraParams, z: u32, n: u32, r: u32) -> u32 {   // (z, n, r)'s index in binding 3, or NONE past N, R
    if (n >= p.n || r >= p.r) { return NONE; }
    return (z * p.n + n) * p.r + r;
}

@group(0) @binding(0) var<uniform> p_dmm: LoraParams;
@group(0) @binding(1) var<storage, read> dmm_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> dmm_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dmm_part: array<f32>;
@group(0) @binding(4) var<storage, read> dmm_stream: array<u32>;

fn dmm_load_x(n: u32, i: u32, iend: u32, base: u32) -> vec4<f32> {   // dropout(x)[n, i .. i+3], 0 past the edges
    if (n >= p_dmm.n || i >= iend) { return vec4<f32>(0.0); }
    let e = n * p_dmm.i + i;
    return dmm_x[e / 4u] * keep4_at(p_dmm, base, e);
}

fn dmm_load_a(r: u32, i: u32, iend: u32) -> vec4<f32> {   // a[r, i .. i+3], 0 past the edges
    if (r >= p_dmm.r || i >= iend) { return vec4<f32>(0.0); }
    return dmm_a[(r * p_dmm.i + i) / 4u];
}

@compute @workgroup_size(16, 16)
fn lora_down_mm(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let p = p_dmm;
    let base = keep_base(p, dmm_stream[0]);
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.x * MMR;
    let r0 = wid.y * 16u;
    let ibeg = wid.z * p.per;
    let iend = min(p.i, ibeg + p.per);
    // staging slots: x row lid / 8, quad lid % 8; a (lid < 128) rank lid / 8, quad lid % 8
    let sr = lid / 8u;
    let sq = lid % 8u;
    var px = dmm_load_x(n0 + sr, ibeg + 4u * sq, iend, base);
    var pa = vec4<f32>(0.0);
    if (lid < 128u) { pa = dmm_load_a(r0 + sr, ibeg + 4u * sq, iend); }
    var acc = vec2<f32>(0.0);
    for (var i0 = ibeg; i0 < iend; i0 += MMK) {
        mm_v[sr][sq] = px;
        if (lid < 128u) {
            mm_m[4u * sq][sr] = pa.x; mm_m[4u * sq + 1u][sr] = pa.y;
            mm_m[4u * sq + 2u][sr] = pa.z; mm_m[4u * sq + 3u][sr] = pa.w;
        }
        workgroupBarrier();
        px = dmm_load_x(n0 + sr, i0 + MMK + 4u * sq, iend, base);
        if (lid < 128u) { pa = dmm_load_a(r0 + sr, i0 + MMK + 4u * sq, iend); }
        acc = mm_chunk(acc, tx, ty);
        workgroupBarrier();
    }
    let e0 = mm_index(p, wid.z, n0 + ty, r0 + tx);   // one slice: z = 0 and binding 3 is u
    let e1 = mm_index(p, wid.z, n0 + ty + 16u, r0 + tx);
    if (e0 != NONE) { dmm_part[e0] = acc.x; }
    if (e1 != NONE) { dmm_part[e1] = acc.y; }
}

// ---------------------------------------------------------------------------- backward parts in one dispatch (GPU)
// lora_grad_axb: the three independent parts of a projection's backward that follow du,
// each workgroup one part's (g = its index, x + y * nx), so that they run side by side
// instead of one dispatch (and one pipeline barrier) each:
//   g < ga            dA's split sum: workgroup (g % cx, g / cx % cy, g / (cx cy)) of a
//                     (ceil(I / WG) = cx, ceil(R / 4) = cy, slices) grid; invocation: column
//                     i, ranks r0 .. r0+3 of one slice of `per` rows (x read and its mask
//                     hashed once for 4 ranks); raw sums to part[z * R*I + r*I + i], which
//                     splitk_reduce then adds in slice order into dA
//   ga <= g < ga+gx   dx += keep * (du A), lora_grad_x's tile: invocation k = (g - ga) * WG + l
//                     takes columns 4(k % (I/4)) .. +3 of TQ blocks of TR rows (I % 4 == 0)
//   ga+gx <= g < +gb  dB's reduce: db[e] (= or +=) scale * (sum_z part[boff + z * O*R + e]),
//                     the slices of lora_grad_b_split added in order, as splitk_reduce adds them
// Any part may have no workgroups (ga, gx, gb = 0: ops/lora.py dispatches them apart to time
// them so). Each sum is the one its own kernel made: the same bits.
// 0 params LoraAxbParams (LoraParams' fields, then ga, gx, gb, boff, bslices) | 1 du[N, R]
// read | 2 x[N, I] read | 3 part read_write (dA's slices from 0, dB's from boff) | 4 stream |
// 5 a[R, I] read, vec4 | 6 dx[N, I] read_write, vec4 | 7 db[O, R] read_write
// dispatch: ga + gx + gb workgroups, split over x, y
struct LoraAxbParams {
    n: u32, i: u32, o: u32, r: u32,
    scale: f32, keep_threshold: u32, keep_scale: f32, seed: u32,
    per: u32, acc: u32, ga: u32, gx: u32, gb: u32, boff: u32, bslices: u32,
};
@group(0) @binding(0) var<uniform> p_axb: LoraAxbParams;
@group(0) @binding(1) var<storage, read> axb_du: array<f32>;
@group(0) @binding(2) var<storage, read> axb_x: array<f32>;
@group(0) @binding(3) var<storage, read_write> axb_part: array<f32>;
@group(0) @binding(4) var<storage, read> axb_stream: array<u32>;
@group(0) @binding(5) var<storage, read> axb_a: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> axb_dx: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> axb_db: array<f32>;

fn axb_lora_params() -> LoraParams {
    let q = p_axb;
    return LoraParams(q.n, q.i, q.o, q.r, q.scale, q.keep_threshold, q.keep_scale, q.seed, q.per, q.acc);
}

@compute @workgroup_size(WG)
fn lora_grad_axb(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nw: vec3<u32>) {
    let p = axb_lora_params();
    let g = wid.x + wid.y * nw.x;
    let l = lid3.x;
    if (g < p_axb.ga) {
        axb_grad_a(p, g, l);
    } else if (g < p_axb.ga + p_axb.gx) {
        axb_grad_x(p, (g - p_axb.ga) * WG + l);
    } else if (g < p_axb.ga + p_axb.gx + p_axb.gb) {
        axb_reduce_b(p, (g - p_axb.ga - p_axb.gx) * WG + l);
    }
}

fn axb_du4(b: u32, last: u32) -> vec4<f32> {   // du[b .. b+3], clamped to the buffer's last float
    return vec4<f32>(axb_du[min(b, last)], axb_du[min(b + 1u, last)], axb_du[min(b + 2u, last)],
                     axb_du[min(b + 3u, last)]);
}

fn axb_grad_a(p: LoraParams, g: u32, l: u32) {   // dA's split sum, workgroup g of its grid
    let cx = (p.i + WG - 1u) / WG;
    let cy = (p.r + 3u) / 4u;
    let i = (g % cx) * WG + l;
    if (i >= p.i) { return; }
    let z = g / (cx * cy);
    let r0 = (g / cx % cy) * 4u;
    let step = axb_stream[0];
    let last = p.n * p.r - 1u;   // du reads past rank R-1 are clamped inside the buffer, their sums unused
    let n1 = min(p.n, (z + 1u) * p.per);
    var acc = vec4<f32>(0.0);
    var n = z * p.per;
    for (; n + 4u <= n1; n += 4u) {   // four rows' loads issued together, added in order
        let x0 = axb_x[n * p.i + i];
        let x1 = axb_x[(n + 1u) * p.i + i];
        let x2 = axb_x[(n + 2u) * p.i + i];
        let x3 = axb_x[(n + 3u) * p.i + i];
        let e0 = axb_du4(n * p.r + r0, last);
        let e1 = axb_du4((n + 1u) * p.r + r0, last);
        let e2 = axb_du4((n + 2u) * p.r + r0, last);
        let e3 = axb_du4((n + 3u) * p.r + r0, last);
        acc += e0 * (x0 * keep_factor(p, step, n * p.i + i));
        acc += e1 * (x1 * keep_factor(p, step, (n + 1u) * p.i + i));
        acc += e2 * (x2 * keep_factor(p, step, (n + 2u) * p.i + i));
        acc += e3 * (x3 * keep_factor(p, step, (n + 3u) * p.i + i));
    }
    for (; n < n1; n++) { acc += axb_du4(n * p.r + r0, last) * (axb_x[n * p.i + i] * keep_factor(p, step, n * p.i + i)); }
    let base = z * p.r * p.i + r0 * p.i + i;
    for (var k = 0u; k < 4u && r0 + k < p.r; k++) { axb_part[base + k * p.i] = acc[k]; }
}

fn axb_grad_x(p: LoraParams, k: u32) {   // invocation k (= n/(TR*TQ) * I/4 + i/4) of dx's tile
    let I4 = p.i / 4u;
    if (k >= (p.n + TR * TQ - 1u) / (TR * TQ) * I4) { return; }
    let base = keep_base(p, axb_stream[0]);
    let nb = k / I4 * (TR * TQ);
    for (var q = 0u; q < TQ && nb + q * TR < p.n; q++) { axb_grad_x_rows(p, nb + q * TR, k % I4, base); }
}

fn axb_grad_x_rows(p: LoraParams, n0: u32, i4: u32, base: u32) {   // rows n0 .. n0+3 of a block
    let I4 = p.i / 4u;
    let d0 = n0 * p.r;                              // rows n0 .. n0+3 of du, past N-1: row N-1 (not stored)
    let d1 = min(n0 + 1u, p.n - 1u) * p.r;
    let d2 = min(n0 + 2u, p.n - 1u) * p.r;
    let d3 = min(n0 + 3u, p.n - 1u) * p.r;
    var acc0 = vec4<f32>(0.0); var acc1 = vec4<f32>(0.0); var acc2 = vec4<f32>(0.0); var acc3 = vec4<f32>(0.0);
    for (var r = 0u; r < p.r; r++) {
        let a = axb_a[r * I4 + i4];
        acc0 += axb_du[d0 + r] * a; acc1 += axb_du[d1 + r] * a; acc2 += axb_du[d2 + r] * a; acc3 += axb_du[d3 + r] * a;
    }
    axb_dx_store(p, n0, i4, acc0, base); axb_dx_store(p, n0 + 1u, i4, acc1, base);
    axb_dx_store(p, n0 + 2u, i4, acc2, base); axb_dx_store(p, n0 + 3u, i4, acc3, base);
}

fn axb_dx_store(p: LoraParams, n: u32, i4: u32, acc: vec4<f32>, base: u32) {
    if (n >= p.n) { return; }
    let e = n * (p.i / 4u) + i4;
    let f = keep4_at(p, base, 4u * e);
    let dx = axb_dx[e];
    axb_dx[e] = select(dx + f * acc, dx, f == vec4<f32>(0.0));   // dropped: left as it was, as lora_grad_x leaves it
}

fn axb_reduce_b(p: LoraParams, e: u32) {   // db[e] from lora_grad_b_split's slices
    let count = p.o * p.r;
    if (e >= count) { return; }
    var acc = 0.0;
    for (var z = 0u; z < p_axb.bslices; z++) { acc += axb_part[p_axb.boff + z * count + e]; }
    let v = acc * p.scale;
    if (p.acc != 0u) { axb_db[e] = axb_db[e] + v; } else { axb_db[e] = v; }
}

// ---------------------------------------------------------------------------- CPU variants
const LR: u32 = 16u;  // invocations per workgroup

@group(0) @binding(0) var<uniform> p_dr: LoraParams;
@group(0) @binding(1) var<storage, read> dr_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> dr_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> dr_u: array<f32>;
@group(0) @binding(4) var<storage, read> dr_stream: array<u32>;

fn down4(x: vec4<f32>, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) -> mat4x4<f32> {   // x * a_r, r < 4
    return mat4x4<f32>(x * a0, x * a1, x * a2, x * a3);
}

fn hsum4(s: mat4x4<f32>) -> vec4<f32> {   // the four sums of a row's u[r0 .. r0+3]
    return vec4<f32>((s[0].x + s[0].y) + (s[0].z + s[0].w), (s[1].x + s[1].y) + (s[1].z + s[1].w),
                     (s[2].x + s[2].y) + (s[2].z + s[2].w), (s[3].x + s[3].y) + (s[3].z + s[3].w));
}

@compute @workgroup_size(LR)
fn lora_down_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_dr;
    let step = dr_stream[0];
    let RB = (p.r + 3u) / 4u;
    let k = gid.x + gid.y * nw.x * LR;  // = n/4 * ceil(R/4) + r/4
    if (k >= (p.n + 3u) / 4u * RB) { return; }
    let n0 = k / RB * 4u;
    let r0 = (k % RB) * 4u;
    let I4 = p.i / 4u;
    let base = keep_base(p, step);
    let a0 = r0 * I4;                                   // rows r0 .. r0+3 of a, clamped to R-1
    let a1 = min(r0 + 1u, p.r - 1u) * I4;
    let a2 = min(r0 + 2u, p.r - 1u) * I4;
    let a3 = min(r0 + 3u, p.r - 1u) * I4;
    let n1 = min(n0 + 1u, p.n - 1u);                    // rows n0 .. n0+3 of x, clamped to N-1
    let n2 = min(n0 + 2u, p.n - 1u);
    let n3 = min(n0 + 3u, p.n - 1u);
    var s0 = mat4x4<f32>(); var s1 = mat4x4<f32>(); var s2 = mat4x4<f32>(); var s3 = mat4x4<f32>();
    for (var i = 0u; i < I4; i++) {
        let w0 = dr_a[a0 + i]; let w1 = dr_a[a1 + i]; let w2 = dr_a[a2 + i]; let w3 = dr_a[a3 + i];
        s0 += down4(dr_x[n0 * I4 + i] * keep4_at(p, base, n0 * p.i + 4u * i), w0, w1, w2, w3);
        s1 += down4(dr_x[n1 * I4 + i] * keep4_at(p, base, n1 * p.i + 4u * i), w0, w1, w2, w3);
        s2 += down4(dr_x[n2 * I4 + i] * keep4_at(p, base, n2 * p.i + 4u * i), w0, w1, w2, w3);
        s3 += down4(dr_x[n3 * I4 + i] * keep4_at(p, base, n3 * p.i + 4u * i), w0, w1, w2, w3);
    }
    down_store(n0, r0, hsum4(s0)); down_store(n0 + 1u, r0, hsum4(s1));
    down_store(n0 + 2u, r0, hsum4(s2)); down_store(n0 + 3u, r0, hsum4(s3));
}

fn down_store(n: u32, r0: u32, u: vec4<f32>) {
    if (n >= p_dr.n) { return; }
    for (var j = 0u; j < 4u; j++) { if (r0 + j < p_dr.r) { dr_u[n * p_dr.r + r0 + j] = u[j]; } }
}

@group(0) @binding(0) var<uniform> p_gur: LoraParams;
@group(0) @binding(1) var<storage, read> gur_dy: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> gur_b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> gur_du: array<vec4<f32>>;

@compute @workgroup_size(LR)
fn lora_grad_u_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_gur;
    let R4 = p.r / 4u;
    let O4 = p.o / 4u;
    let k = gid.x + gid.y * nw.x * LR;  // = n * R/4 + r/4
    if (k >= p.n * R4) { return; }
    let n = k / R4;
    var acc = vec4<f32>(0.0);
    for (var o4 = 0u; o4 < O4; o4++) {
        let d = gur_dy[n * O4 + o4];
        let j = 4u * o4 * R4 + k % R4;   // b[o, r..r+3] for o = 4 o4
        acc += d.x * gur_b[j] + d.y * gur_b[j + R4] + d.z * gur_b[j + 2u * R4] + d.w * gur_b[j + 3u * R4];
    }
    gur_du[k] = p.scale * acc;
}

@group(0) @binding(0) var<uniform> p_upr: LoraParams;
@group(0) @binding(1) var<storage, read> upr_u: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> upr_b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> upr_y: array<vec4<f32>>;

fn up4(u: vec4<f32>, b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(dot(u, b0), dot(u, b1), dot(u, b2), dot(u, b3));
}

@compute @workgroup_size(LR)
fn lora_up_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_upr;
    let R4 = p.r / 4u;
    let O4 = p.o / 4u;
    let k = gid.x + gid.y * nw.x * LR;  // = n/4 * O/4 + o/4
    if (k >= (p.n + 3u) / 4u * O4) { return; }
    let n0 = k / O4 * 4u;
    let o4 = k % O4;
    let u1 = min(n0 + 1u, p.n - 1u) * R4;   // rows n0 .. n0+3 of u, clamped to N-1
    let u2 = min(n0 + 2u, p.n - 1u) * R4;
    let u3 = min(n0 + 3u, p.n - 1u) * R4;
    let j = 4u * o4 * R4;               // b[o, 0..3] for o = 4 o4
    var acc0 = vec4<f32>(0.0); var acc1 = vec4<f32>(0.0); var acc2 = vec4<f32>(0.0); var acc3 = vec4<f32>(0.0);
    for (var r4 = 0u; r4 < R4; r4++) {
        let b0 = upr_b[j + r4]; let b1 = upr_b[j + R4 + r4]; let b2 = upr_b[j + 2u * R4 + r4]; let b3 = upr_b[j + 3u * R4 + r4];
        acc0 += up4(upr_u[n0 * R4 + r4], b0, b1, b2, b3);
        acc1 += up4(upr_u[u1 + r4], b0, b1, b2, b3);
        acc2 += up4(upr_u[u2 + r4], b0, b1, b2, b3);
        acc3 += up4(upr_u[u3 + r4], b0, b1, b2, b3);
    }
    up_store(n0, o4, acc0); up_store(n0 + 1u, o4, acc1); up_store(n0 + 2u, o4, acc2); up_store(n0 + 3u, o4, acc3);
}

fn up_store(n: u32, o4: u32, acc: vec4<f32>) {
    if (n >= p_upr.n) { return; }
    let k = n * (p_upr.o / 4u) + o4;
    upr_y[k] = upr_y[k] + p_upr.scale * acc;
}

@group(0) @binding(0) var<uniform> p_gbr: LoraParams;
@group(0) @binding(1) var<storage, read> gbr_dy: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> gbr_u: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> gbr_db: array<vec4<f32>>;

@compute @workgroup_size(LR)
fn lora_grad_b_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_gbr;
    let R4 = p.r / 4u;
    let O4 = p.o / 4u;
    let k = gid.x + gid.y * nw.x * LR;  // = o/4 * R/4 + r/4
    if (k >= O4 * R4) { return; }
    let o4 = k / R4;
    let r4 = k % R4;
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0); var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    for (var n = 0u; n < p.n; n++) {   // rows o .. o+3 of db, ranks r .. r+3 each
        let d = gbr_dy[n * O4 + o4];
        let u = gbr_u[n * R4 + r4];
        a0 += d.x * u; a1 += d.y * u; a2 += d.z * u; a3 += d.w * u;
    }
    let j = 4u * o4 * R4 + r4;
    var o0 = vec4<f32>(0.0); var o1 = vec4<f32>(0.0); var o2 = vec4<f32>(0.0); var o3 = vec4<f32>(0.0);
    if (p.acc != 0u) { o0 = gbr_db[j]; o1 = gbr_db[j + R4]; o2 = gbr_db[j + 2u * R4]; o3 = gbr_db[j + 3u * R4]; }
    gbr_db[j] = o0 + p.scale * a0;
    gbr_db[j + R4] = o1 + p.scale * a1;
    gbr_db[j + 2u * R4] = o2 + p.scale * a2;
    gbr_db[j + 3u * R4] = o3 + p.scale * a3;
}

// keep_factor of elements idx .. idx+3, with base = keep_base(p, step) (the hash's part
// that is the same for every element, computed once per invocation)
fn keep_base(p: LoraParams, step: u32) -> u32 { return pcg(p.seed ^ pcg(step)); }

fn keep4_at(p: LoraParams, base: u32, idx: u32) -> vec4<f32> {
    if (p.keep_threshold == 0u) { return vec4<f32>(1.0); }
    let h = vec4<u32>(pcg(idx ^ base), pcg((idx + 1u) ^ base), pcg((idx + 2u) ^ base), pcg((idx + 3u) ^ base));
    return select(vec4<f32>(0.0), vec4<f32>(p.keep_scale), h >= vec4<u32>(p.keep_threshold));
}

@group(0) @binding(0) var<uniform> p_gar: LoraParams;
@group(0) @binding(1) var<storage, read> gar_du: array<f32>;
@group(0) @binding(2) var<storage, read> gar_x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> gar_da: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> gar_stream: array<u32>;

@compute @workgroup_size(LR)
fn lora_grad_a_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_gar;
    let step = gar_stream[0];
    let I4 = p.i / 4u;
    let k = gid.x + gid.y * nw.x * LR;  // = r/4 * I/4 + i/4
    if (k >= (p.r + 3u) / 4u * I4) { return; }
    let r0 = k / I4 * 4u;
    let i4 = k % I4;
    let base = keep_base(p, step);
    let r1 = min(r0 + 1u, p.r - 1u);
    let r2 = min(r0 + 2u, p.r - 1u);
    let r3 = min(r0 + 3u, p.r - 1u);
    var s0 = vec4<f32>(0.0); var s1 = vec4<f32>(0.0); var s2 = vec4<f32>(0.0); var s3 = vec4<f32>(0.0);
    for (var n = 0u; n < p.n; n++) {
        let x = gar_x[n * I4 + i4] * keep4_at(p, base, n * p.i + 4u * i4);
        let d = n * p.r;
        s0 += gar_du[d + r0] * x; s1 += gar_du[d + r1] * x; s2 += gar_du[d + r2] * x; s3 += gar_du[d + r3] * x;
    }
    let acc = p.acc != 0u;
    gar_da[r0 * I4 + i4] = select(vec4<f32>(0.0), gar_da[r0 * I4 + i4], acc) + s0;
    if (r0 + 1u < p.r) { gar_da[r1 * I4 + i4] = select(vec4<f32>(0.0), gar_da[r1 * I4 + i4], acc) + s1; }
    if (r0 + 2u < p.r) { gar_da[r2 * I4 + i4] = select(vec4<f32>(0.0), gar_da[r2 * I4 + i4], acc) + s2; }
    if (r0 + 3u < p.r) { gar_da[r3 * I4 + i4] = select(vec4<f32>(0.0), gar_da[r3 * I4 + i4], acc) + s3; }
}

@group(0) @binding(0) var<uniform> p_gxr: LoraParams;
@group(0) @binding(1) var<storage, read> gxr_du: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> gxr_a: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> gxr_dx: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> gxr_stream: array<u32>;

fn gx4(d: vec4<f32>, a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>) -> vec4<f32> {
    return d.x * a0 + d.y * a1 + d.z * a2 + d.w * a3;
}

@compute @workgroup_size(LR)
fn lora_grad_x_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = p_gxr;
    let step = gxr_stream[0];
    let I4 = p.i / 4u;
    let k = gid.x + gid.y * nw.x * LR;  // = n/4 * I/4 + i/4
    if (k >= (p.n + 3u) / 4u * I4) { return; }
    let n0 = k / I4 * 4u;
    let i4 = k % I4;
    let R4 = p.r / 4u;
    let d1 = min(n0 + 1u, p.n - 1u) * R4;   // rows n0 .. n0+3 of du, clamped to N-1
    let d2 = min(n0 + 2u, p.n - 1u) * R4;
    let d3 = min(n0 + 3u, p.n - 1u) * R4;
    var acc0 = vec4<f32>(0.0); var acc1 = vec4<f32>(0.0); var acc2 = vec4<f32>(0.0); var acc3 = vec4<f32>(0.0);
    for (var r4 = 0u; r4 < R4; r4++) {
        let j = 4u * r4 * I4 + i4;        // a[r, i..i+3] for r = 4 r4
        let a0 = gxr_a[j]; let a1 = gxr_a[j + I4]; let a2 = gxr_a[j + 2u * I4]; let a3 = gxr_a[j + 3u * I4];
        acc0 += gx4(gxr_du[n0 * R4 + r4], a0, a1, a2, a3);
        acc1 += gx4(gxr_du[d1 + r4], a0, a1, a2, a3);
        acc2 += gx4(gxr_du[d2 + r4], a0, a1, a2, a3);
        acc3 += gx4(gxr_du[d3 + r4], a0, a1, a2, a3);
    }
    let base = keep_base(p, step);
    gx_store(n0, i4, acc0, base); gx_store(n0 + 1u, i4, acc1, base);
    gx_store(n0 + 2u, i4, acc2, base); gx_store(n0 + 3u, i4, acc3, base);
}

fn gx_store(n: u32, i4: u32, acc: vec4<f32>, base: u32) {
    if (n >= p_gxr.n) { return; }
    let k = n * (p_gxr.i / 4u) + i4;
    gxr_dx[k] = gxr_dx[k] + keep4_at(p_gxr, base, 4u * k) * acc;
}

// ---------------------------------------------------------------------------- decoding
// lora_down_parts   one token's u for up to three adapted projections of one input
//   (decoding, N = 1, no dropout), from the arena's params in one dispatch:
//     u[p*R + r] = sum_i x[i] A_p[r, i]   for each part p whose a_p != NONE
//   A_p at float a_p of ab. The up half is folded into ternary_matvec (matvec.wgsl),
//   which adds scale * B_p u_p to each output as lora_up would.
//   lora_down_parts: lora_down's sum (WR threads, strided, wg_sum), one workgroup per (p, r):
//     3*R workgroups split over x, y (an absent part's return at once).
//   lora_down_parts_rows (CPU adapters, I % 4 == 0): lora_down_rows' vec4 sum, one (p, r)
//     per invocation: ceil(3*R / LR) workgroups.
//   0 params LoraPartsParams {I, R, a0, a1, a2} | 1 x[I] read | 2 ab read (the arena's
//   params) | 3 u[3R] read_write
const NONE: u32 = 0xffffffffu;
struct LoraPartsParams { i: u32, r: u32, a0: u32, a1: u32, a2: u32 };
@group(0) @binding(0) var<uniform> lp_p: LoraPartsParams;
@group(0) @binding(1) var<storage, read> lp_x: array<f32>;
@group(0) @binding(2) var<storage, read> lp_ab: array<f32>;
@group(0) @binding(3) var<storage, read_write> lp_u: array<f32>;

fn lp_a(part: u32) -> u32 {
    return select(select(lp_p.a2, lp_p.a1, part == 1u), lp_p.a0, part == 0u);
}

@compute @workgroup_size(WR)
fn lora_down_parts(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nw: vec3<u32>) {
    let k = wid.x + wid.y * nw.x;     // = part * R + r
    if (k >= 3u * lp_p.r || lp_a(k / lp_p.r) == NONE) { return; }   // uniform per workgroup
    let ar = lp_a(k / lp_p.r) + (k % lp_p.r) * lp_p.i;
    var acc = 0.0;
    var i0 = lid3.x;
    for (; i0 + 7u * WR < lp_p.i; i0 += 8u * WR) {   // eight pairs of loads in flight, added in lora_down's order
        let p0 = lp_x[i0] * lp_ab[ar + i0];
        let p1 = lp_x[i0 + WR] * lp_ab[ar + i0 + WR];
        let p2 = lp_x[i0 + 2u * WR] * lp_ab[ar + i0 + 2u * WR];
        let p3 = lp_x[i0 + 3u * WR] * lp_ab[ar + i0 + 3u * WR];
        let p4 = lp_x[i0 + 4u * WR] * lp_ab[ar + i0 + 4u * WR];
        let p5 = lp_x[i0 + 5u * WR] * lp_ab[ar + i0 + 5u * WR];
        let p6 = lp_x[i0 + 6u * WR] * lp_ab[ar + i0 + 6u * WR];
        let p7 = lp_x[i0 + 7u * WR] * lp_ab[ar + i0 + 7u * WR];
        acc += p0;
        acc += p1;
        acc += p2;
        acc += p3;
        acc += p4;
        acc += p5;
        acc += p6;
        acc += p7;
    }
    for (var i = i0; i < lp_p.i; i += WR) { acc += lp_x[i] * lp_ab[ar + i]; }
    let total = wg_sum(lid3.x, acc, WR);
    if (lid3.x == 0u) { lp_u[k] = total; }
}

@group(0) @binding(1) var<storage, read> lpr_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> lpr_ab: array<vec4<f32>>;

@compute @workgroup_size(LR)
fn lora_down_parts_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let k = gid.x + gid.y * nw.x * LR;
    if (k >= 3u * lp_p.r) { return; }
    let a = lp_a(k / lp_p.r);
    if (a == NONE) { return; }
    let I4 = lp_p.i / 4u;
    let ar = (a + (k % lp_p.r) * lp_p.i) / 4u;
    var acc = vec4<f32>(0.0);
    for (var i = 0u; i < I4; i++) { acc += lpr_x[i] * lpr_ab[ar + i]; }
    lp_u[k] = (acc.x + acc.y) + (acc.z + acc.w);
}
