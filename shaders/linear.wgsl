// linear.wgsl — a dense (unquantised) linear layer y = x W^T, forward and input
// gradient: the output head (HF's lm_head is a plain nn.Linear, not a BitLinear), over
// W[V, C] = the tied embedding or an untied lm_head. W is f32, or bf16 two per u32
// (low half first) when the override LN_BF16 is true (the table as the checkpoint
// stores it). W may be split into row chunks, each its own buffer under
// maxStorageBufferBindingSize: one dispatch per chunk.
//
// linear_forward   y[n, v0 + o] = sum_i x[row(n), i] w[o, i]   for o < Oc (one chunk),
//   row(n) = x_row0 + n * x_step (x_row0 = 0, x_step = 1 for every row; x_row0 = T-1,
//   x_step = T for the last token of each sequence when decoding)
//   0 params LinearParams {N, I, Oc, ld_y, v0, x_row0, x_step} | 1 x[N, I] read |
//   2 w[Oc, I] read | 3 y[N, ld_y] read_write | linear_forward only: 4 x again, read as vec4s,
//   and 5 w again, read as u32 pairs, where I % 4 == 0 (a spare 16-byte buffer where not): a
//   thread loads and stages its chunk's x quad and two W quads as vectors
//   dispatch: groups (ceil(Oc/128), ceil(N/64)); a 16x16 workgroup owns a 64 x 128 tile
//   of y, thread (tx, ty) rows ty + 16a (a < 4) and outputs tx + 16b (b < 8). x and W are
//   staged through workgroup memory 16 columns at a time (15 KB) and read back as vec4,
//   so each workgroup-memory vec4 feeds 2.7 dot products (see bitlinear.wgsl). Staged
//   rows are padded to 5 vec4s: unpadded, the W rows that neighbouring threads read lie
//   in one bank (with 64 x 64 tiles and 32 columns the head ran 3.4 TMAC/s on an H200
//   unpadded, 5.7 padded, the same bits; 64 x 128 tiles without the prefetch below ran
//   2.9, a transposed W tile as the input gradient's 5.7). The next chunk's x and W values
//   are loaded into registers while the current chunk is multiplied (as
//   bitlinear_backward_input; the same bits). At 1024 x 2560 x 128256, bf16 W: 64 x 64
//   tiles 5.9 -> 7.6 TMAC/s with the prefetch (57.4 -> 44.3 ms), 64 x 128 tiles 11.1
//   (30.4 ms); the input gradient's prefetch 7.6 -> 9.5 (44.0 -> 35.4 ms), and its
//   64 x 128 tiles (two slices) ran slower, 50.1 ms.
//
// linear_forward_rows   the same for a few rows (decoding); bindings as linear_forward.
//   dispatch: groups (ceil(Oc/64), ceil(N/8)); a workgroup (64) owns 64 outputs x 8 rows,
//   a thread one output for 8 rows; x is staged through workgroup memory 256 columns
//   at a time.
//
// linear_backward_input   dx (= or +=) scale * dy W
//   dy rows are ld_dy floats apart, so a vocabulary chunk [v0, v0 + Oc) of a
//   dlogits[N, V] buffer is used in place: bind dy from float v0 (ld_dy = V) and W
//   from row v0, call once per chunk with accumulate = 1 after the first (each
//   binding then stays under maxStorageBufferBindingSize; v0 a multiple of 64 keeps
//   the views 256-byte aligned).
//   0 params LinearBackwardParams {N, I, O, scale, accumulate, ld_dy, ko, split} |
//   1 dy[N, ld_dy] read | 2 w[O, I] read | 3 dx[N, I] read_write | 4 part[slices, N, I] read_write |
//   5 w again, read as u32 pairs where I % 4 == 0 | 6 dy again, read as vec4s where ld_dy % 4 == 0
//   (a spare 16-byte buffer where not): a thread loads its chunk's dy and W values as one vec4
//   each and stages them with one store each (the same bits as scalar loads; the head on the
//   H200: docs/PERFORMANCE.md, 2026-12-04)
//   Split-K (splitk.wgsl): workgroup z sums o in [z*ko, (z+1)*ko) only; with split = 1
//   it writes raw sums to part[z, N, I] for splitk_reduce (part unused when split = 0).
//   dispatch: groups (ceil(I/64), ceil(N/64), slices); 16x16 threads, a 64x64 tile of dx per
//   workgroup (4x4 elements per thread), o in chunks of 16.

override LN_BF16: bool = false;
override LN_QUADS: bool = false;   // linear_backward_input_cpu: I % 4 == 0 (whole quads of W)
@group(0) @binding(2) var<storage, read> w: array<u32>;   // W[O, I] of every entry point: f32, or bf16 pairs (LN_BF16)
@group(0) @binding(5) var<storage, read> w2: array<vec2<u32>>;   // W again, as u32 pairs (read where I % 4 == 0)

fn w_at(e: u32) -> f32 {   // element e of W, row-major
    if (LN_BF16) { return bf16_at(w[e >> 1u], e); }
    return bitcast<f32>(w[e]);
}

// W elements e .. e+n-1 (n <= 4), zeros after them. quads (rows of whole quads, e % 4 == 0,
// n == 4): one load through w2 (binding 5, W again as u32 pairs): a pair of bf16s, or two
// pairs of f32 words.
fn w_quad(e: u32, n: u32, quads: bool) -> vec4<f32> {
    if (quads) {
        if (LN_BF16) {
            let q = w2[e / 4u];
            return vec4<f32>(bf16_at(q.x, 0u), bf16_at(q.x, 1u), bf16_at(q.y, 0u), bf16_at(q.y, 1u));
        }
        return bitcast<vec4<f32>>(vec4<u32>(w2[e / 2u], w2[e / 2u + 1u]));
    }
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < n; c++) { v[c] = w_at(e + c); }
    return v;
}

const TO: u32 = 64u;
const TN: u32 = 8u;
const KC: u32 = 256u;
struct LinearParams { n: u32, i: u32, oc: u32, ld_y: u32, v0: u32, x_row0: u32, x_step: u32 };
@group(0) @binding(0) var<uniform> p: LinearParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> x4: array<vec4<f32>>;   // linear_forward: x again, as vec4s (read where I % 4 == 0)
var<workgroup> xsh: array<array<f32, KC>, TN>;

@compute @workgroup_size(TO)
fn linear_forward_rows(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let lid = lid3.x;
    let o = wid.x * TO + lid;
    let n0 = wid.y * TN;
    var acc: array<f32, TN>;
    for (var r = 0u; r < TN; r++) { acc[r] = 0.0; }
    for (var c0 = 0u; c0 < p.i; c0 += KC) {
        for (var e = lid; e < TN * KC; e += TO) {
            let r = e / KC;
            let col = c0 + e % KC;
            var v = 0.0;
            if (n0 + r < p.n && col < p.i) { v = x[(p.x_row0 + (n0 + r) * p.x_step) * p.i + col]; }
            xsh[r][e % KC] = v;
        }
        workgroupBarrier();
        if (o < p.oc) {
            let cend = min(KC, p.i - c0);
            let wb = o * p.i + c0;
            for (var c = 0u; c < cend; c++) {
                let wv = w_at(wb + c);
                for (var r = 0u; r < TN; r++) { acc[r] += xsh[r][c] * wv; }
            }
        }
        workgroupBarrier();
    }
    if (o >= p.oc) { return; }
    for (var r = 0u; r < TN; r++) {
        let n = n0 + r;
        if (n < p.n) { y[n * p.ld_y + p.v0 + o] = acc[r]; }
    }
}

const KT: u32 = 16u;                                   // columns per staged chunk
var<workgroup> t_x: array<array<vec4<f32>, 5>, 64>;    // [row][column quad] (+1 pad, see the header)
var<workgroup> t_w: array<array<vec4<f32>, 5>, 128>;   // [output][column quad] (+1 pad)

fn lf_x4(r: u32, c: u32, n0: u32) -> vec4<f32> {   // x[row(n0 + r), c .. c+3] (c % 4 == 0), 0 past the row or the rows
    if (c >= p.i || n0 + r >= p.n) { return vec4<f32>(0.0); }
    let at = (p.x_row0 + (n0 + r) * p.x_step) * p.i + c;
    if (p.i % 4u == 0u) { return x4[at / 4u]; }
    var v = vec4<f32>(0.0);
    for (var k = 0u; k < min(4u, p.i - c); k++) { v[k] = x[at + k]; }
    return v;
}
fn lf_w4(o: u32, c: u32) -> vec4<f32> {   // w[o, c .. c+3] of this chunk (c % 4 == 0), 0 past the row or the chunk
    if (c >= p.i || o >= p.oc) { return vec4<f32>(0.0); }
    return w_quad(o * p.i + c, min(4u, p.i - c), p.i % 4u == 0u);
}

// acc + (u . v0, u . v1, u . v2, u . v3)
fn lf_dots(acc: vec4<f32>, u: vec4<f32>, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>) -> vec4<f32> {
    return acc + vec4<f32>(dot(u, v0), dot(u, v1), dot(u, v2), dot(u, v3));
}

@compute @workgroup_size(16, 16)
fn linear_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let o0 = wid.x * 128u;
    var acc = LfSums();
    // the next chunk's x quad (row lid/4, quad lid%4) and W quads (outputs lid/4 and 64 + lid/4,
    // quad lid%4) of this thread, in registers
    let sr = lid / 4u;
    let sq = lid % 4u;
    var xv = lf_x4(sr, 4u * sq, n0);
    var wv0 = lf_w4(o0 + sr, 4u * sq);
    var wv1 = lf_w4(o0 + 64u + sr, 4u * sq);
    for (var c0 = 0u; c0 < p.i; c0 += KT) {
        t_x[sr][sq] = xv;
        t_w[sr][sq] = wv0;
        t_w[64u + sr][sq] = wv1;
        workgroupBarrier();
        let c1 = c0 + KT;
        xv = lf_x4(sr, c1 + 4u * sq, n0);
        wv0 = lf_w4(o0 + sr, c1 + 4u * sq);
        wv1 = lf_w4(o0 + 64u + sr, c1 + 4u * sq);
        acc = lf_q(acc, 0u, ty, tx);
        acc = lf_q(acc, 1u, ty, tx);
        acc = lf_q(acc, 2u, ty, tx);
        acc = lf_q(acc, 3u, ty, tx);
        workgroupBarrier();
    }
    head_store(n0 + ty, o0 + tx, acc.acc0);
    head_store(n0 + ty + 16u, o0 + tx, acc.acc1);
    head_store(n0 + ty + 32u, o0 + tx, acc.acc2);
    head_store(n0 + ty + 48u, o0 + tx, acc.acc3);
    head_store(n0 + ty, o0 + 64u + tx, acc.hcc0);
    head_store(n0 + ty + 16u, o0 + 64u + tx, acc.hcc1);
    head_store(n0 + ty + 32u, o0 + 64u + tx, acc.hcc2);
    head_store(n0 + ty + 48u, o0 + 64u + tx, acc.hcc3);
}

// linear_forward's 8 vec4 sums (acc<a>[b]: row ty + 16a, output tx + 16b; hcc<a>[b]: output
// tx + 64 + 16b) and the products of column quad q of the staged chunk, called with q = 0 .. 3
// spelled out (as bitlinear.wgsl's bl_oq)
struct LfSums { acc0: vec4<f32>, acc1: vec4<f32>, acc2: vec4<f32>, acc3: vec4<f32>,
                hcc0: vec4<f32>, hcc1: vec4<f32>, hcc2: vec4<f32>, hcc3: vec4<f32> };

fn lf_q(acc: LfSums, q: u32, ty: u32, tx: u32) -> LfSums {
    var s = acc;
    let v0 = t_w[tx][q];
    let v1 = t_w[tx + 16u][q];
    let v2 = t_w[tx + 32u][q];
    let v3 = t_w[tx + 48u][q];
    let v4 = t_w[tx + 64u][q];
    let v5 = t_w[tx + 80u][q];
    let v6 = t_w[tx + 96u][q];
    let v7 = t_w[tx + 112u][q];
    let u0 = t_x[ty][q];
    let u1 = t_x[ty + 16u][q];
    let u2 = t_x[ty + 32u][q];
    let u3 = t_x[ty + 48u][q];
    s.acc0 = lf_dots(s.acc0, u0, v0, v1, v2, v3);
    s.acc1 = lf_dots(s.acc1, u1, v0, v1, v2, v3);
    s.acc2 = lf_dots(s.acc2, u2, v0, v1, v2, v3);
    s.acc3 = lf_dots(s.acc3, u3, v0, v1, v2, v3);
    s.hcc0 = lf_dots(s.hcc0, u0, v4, v5, v6, v7);
    s.hcc1 = lf_dots(s.hcc1, u1, v4, v5, v6, v7);
    s.hcc2 = lf_dots(s.hcc2, u2, v4, v5, v6, v7);
    s.hcc3 = lf_dots(s.hcc3, u3, v4, v5, v6, v7);
    return s;
}

fn head_store(n: u32, o: u32, acc: vec4<f32>) {    // outputs o + 16b of row n
    if (n >= p.n) { return; }
    for (var b = 0u; b < 4u; b++) {
        if (o + 16u * b < p.oc) { y[n * p.ld_y + p.v0 + o + 16u * b] = acc[b]; }
    }
}

// ---------------------------------------------------------------------------- backward
struct LinearBackwardParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, ld_dy: u32, ko: u32, split: u32 };
@group(0) @binding(0) var<uniform> ln_p: LinearBackwardParams;
@group(0) @binding(1) var<storage, read> ln_dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> ln_dx: array<f32>;
@group(0) @binding(4) var<storage, read_write> ln_part: array<f32>;   // split: [z, N, I] raw sums
@group(0) @binding(6) var<storage, read> ln_dy4: array<vec4<f32>>;   // dy again, as vec4s (read where ld_dy % 4 == 0)
var<workgroup> ln_dy_sh: array<array<vec4<f32>, 4>, 64>;  // [row][o quad], 16 o
var<workgroup> ln_w_sh: array<array<vec4<f32>, 16>, 16>;   // [o][column quad], 64 columns

fn lb_dy4(n: u32, o: u32, oend: u32) -> vec4<f32> {   // dy[n, o .. o+3], 0 past the tile's slice or the rows
    if (n >= ln_p.n) { return vec4<f32>(0.0); }
    let at = n * ln_p.ld_dy + o;
    if (ln_p.ld_dy % 4u == 0u && o + 3u < oend) { return ln_dy4[at / 4u]; }
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (o + c < oend) { v[c] = ln_dy[at + c]; }
    }
    return v;
}

fn lb_w4(o: u32, oend: u32, i: u32) -> vec4<f32> {   // w[o, i .. i+3] (i % 4 == 0), 0 past the slice or the row
    if (o >= oend || i >= ln_p.i) { return vec4<f32>(0.0); }
    return w_quad(o * ln_p.i + i, min(4u, ln_p.i - i), ln_p.i % 4u == 0u);
}

// A 64x64 tile of dx per workgroup; thread (tx, ty) owns rows ty + 16a (a < 4) and the
// four columns 4tx .. 4tx+3, as four vec4 sums in named variables (see bitlinear.wgsl).
// The next 16 o's dy and W values are loaded into registers while the current ones are
// multiplied (as bitlinear_backward_input; the same order of sums).
@compute @workgroup_size(16, 16)
fn linear_backward_input(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let i0 = wid.x * 64u;
    let obeg = wid.z * ln_p.ko;
    let oend = min(ln_p.o, (wid.z + 1u) * ln_p.ko);            // this z's slice of the outputs
    var acc = LbSums();
    // this thread's staging slots: dy row lid/4, o quad lid%4; W output lid/16, column quad lid%16
    let dr = lid / 4u;
    let dq = lid % 4u;
    let wo = lid / 16u;
    let wc = lid % 16u;
    var d = lb_dy4(n0 + dr, obeg + 4u * dq, oend);
    var wv = lb_w4(obeg + wo, oend, i0 + 4u * wc);
    for (var o0 = obeg; o0 < oend; o0 += 16u) {
        ln_dy_sh[dr][dq] = d;
        ln_w_sh[wo][wc] = wv;
        workgroupBarrier();
        let o1 = o0 + 16u;
        d = lb_dy4(n0 + dr, o1 + 4u * dq, oend);
        wv = lb_w4(o1 + wo, oend, i0 + 4u * wc);
        acc = lb_oq(acc, 0u, ty, tx);
        acc = lb_oq(acc, 1u, ty, tx);
        acc = lb_oq(acc, 2u, ty, tx);
        acc = lb_oq(acc, 3u, ty, tx);
        workgroupBarrier();
    }
    ln_store(n0 + ty, i0 + 4u * tx, acc.a0, wid.z);
    ln_store(n0 + ty + 16u, i0 + 4u * tx, acc.a1, wid.z);
    ln_store(n0 + ty + 32u, i0 + 4u * tx, acc.a2, wid.z);
    ln_store(n0 + ty + 48u, i0 + 4u * tx, acc.a3, wid.z);
}

// linear_backward_input's 4 vec4 sums (rows ty + 16a, columns 4tx .. 4tx+3) and the products of
// o quad oq of the staged chunk, called with oq = 0 .. 3 spelled out (as bitlinear.wgsl's bl_oq)
struct LbSums { a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32> };

fn lb_oq(acc: LbSums, oq: u32, ty: u32, tx: u32) -> LbSums {
    var s = acc;
    let e0 = ln_dy_sh[ty][oq];
    let e1 = ln_dy_sh[ty + 16u][oq];
    let e2 = ln_dy_sh[ty + 32u][oq];
    let e3 = ln_dy_sh[ty + 48u][oq];
    var wr = ln_w_sh[oq * 4u][tx];
    s.a0 += e0.x * wr; s.a1 += e1.x * wr; s.a2 += e2.x * wr; s.a3 += e3.x * wr;
    wr = ln_w_sh[oq * 4u + 1u][tx];
    s.a0 += e0.y * wr; s.a1 += e1.y * wr; s.a2 += e2.y * wr; s.a3 += e3.y * wr;
    wr = ln_w_sh[oq * 4u + 2u][tx];
    s.a0 += e0.z * wr; s.a1 += e1.z * wr; s.a2 += e2.z * wr; s.a3 += e3.z * wr;
    wr = ln_w_sh[oq * 4u + 3u][tx];
    s.a0 += e0.w * wr; s.a1 += e1.w * wr; s.a2 += e2.w * wr; s.a3 += e3.w * wr;
    return s;
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

// ---------------------------------------------------------------------------- CPU variants
// For WebGPU on a CPU (Device.kind "cpu"), as in bitlinear.wgsl: no workgroup memory,
// no barriers, no split-K. Rows and columns past the edges are clamped on load and
// skipped on store.
//
// linear_forward_cpu   as linear_forward, for I % 4 == 0; bindings as there with x seen as
//   vec4. An invocation keeps an 8-row x 32-output tile in registers (the prelude's T8):
//   each loaded x vec4 feeds 32 x 4 multiply-adds, each weight 8, a bf16 word gives two.
//   The four products of an x vec4 are summed, then added to the tile (t8_dot4; four
//   updates before): lavapipe 1.16-1.35x faster at the demo's head, SwiftShader 1.03x.
//   dispatch: ceil(ceil(N/8) * ceil(Oc/32) / CPU_WG) workgroups split over x, y;
//   invocation g (gid.x + gid.y * nw.x * CPU_WG) owns rows 8(g / tiles) .. +7 and
//   outputs 32(g % tiles) .. +31, tiles = ceil(Oc/32).
//
// linear_backward_input_cpu   as linear_backward_input (no part; ko and split unused), any
//   I; an invocation keeps an 8 x 16 tile (eight mat4x4). The 8 x 32 tile of the forward
//   ran no faster on lavapipe here and ~1.3-1.7x slower on SwiftShader. With the override
//   LN_QUADS (the op sets it where I % 4 == 0) a quad of W is one vec4 load (bf16: two
//   words) instead of four elements: at the demo's head SwiftShader 1.45x faster,
//   lavapipe 1.1x. (A run-time `if` on I % 4 instead made SwiftShader 1.5x slower: it
//   runs both sides of a branch, masked.) Four o's products are summed, then added to the
//   tile (o % 4 left over one at a time): SwiftShader 1.35-1.5x faster at the demo's head,
//   lavapipe 1.0-1.25x (f32 and bf16 W; 2026-12-05, the sums in another order).
//   dispatch: groups (ceil(ceil(I/16) / CPU_WG), ceil(N/8)); invocation j owns rows
//   8gy .. 8gy+7 and columns 16(gx*CPU_WG + j) .. +15.

const CPU_WG: u32 = 8u;

fn lc_w4(e: u32) -> vec4<f32> {   // W elements e .. e+3 (row-major), e % 4 == 0: 4 words, or 2 of bf16 pairs
    if (LN_BF16) {
        let p0 = w[e >> 1u];
        let p1 = w[(e >> 1u) + 1u];
        return bitcast<vec4<f32>>(vec4<u32>(p0 << 16u, p0 & 0xffff0000u, p1 << 16u, p1 & 0xffff0000u));
    }
    return bitcast<vec4<f32>>(vec4<u32>(w[e], w[e + 1u], w[e + 2u], w[e + 3u]));
}

@group(0) @binding(1) var<storage, read> lcx: array<vec4<f32>>;

fn lc_x8(xb: U8, c: u32) -> R8 {   // x vec4 c of rows 8b .. 8b+7 (row offsets in xb.a, xb.b)
    return R8(lcx[xb.a.x + c], lcx[xb.a.y + c], lcx[xb.a.z + c], lcx[xb.a.w + c],
              lcx[xb.b.x + c], lcx[xb.b.y + c], lcx[xb.b.z + c], lcx[xb.b.w + c]);
}

fn lc_m4(row: u32, c: u32) -> mat4x4<f32> {   // columns c .. c+3 of 4 rows of W from `row` (clamped to Oc-1), transposed
    let r = min(vec4<u32>(row) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.oc - 1u)) * p.i + c;
    return transpose(mat4x4<f32>(lc_w4(r.x), lc_w4(r.y), lc_w4(r.z), lc_w4(r.w)));
}

@compute @workgroup_size(CPU_WG)
fn linear_forward_cpu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let tiles = (p.oc + 31u) / 32u;
    let g = gid.x + gid.y * nw.x * CPU_WG;
    if (g >= (p.n + 7u) / 8u * tiles) { return; }
    let I4 = p.i / 4u;
    let n0 = g / tiles * 8u;
    let o0 = g % tiles * 32u;
    let rows = vec4<u32>(p.x_row0) + min(vec4<u32>(n0) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(p.n - 1u)) * p.x_step;
    let rows2 = vec4<u32>(p.x_row0) + min(vec4<u32>(n0) + vec4<u32>(4u, 5u, 6u, 7u), vec4<u32>(p.n - 1u)) * p.x_step;
    let xb = U8(rows * I4, rows2 * I4);
    var a = T8();
    for (var c = 0u; c < I4; c++) {
        let x = lc_x8(xb, c);
        let m0 = lc_m4(o0, 4u * c); let m1 = lc_m4(o0 + 4u, 4u * c); let m2 = lc_m4(o0 + 8u, 4u * c);
        let m3 = lc_m4(o0 + 12u, 4u * c); let m4 = lc_m4(o0 + 16u, 4u * c); let m5 = lc_m4(o0 + 20u, 4u * c);
        let m6 = lc_m4(o0 + 24u, 4u * c); let m7 = lc_m4(o0 + 28u, 4u * c);
        a = t8_dot4(a, x, R8(m0[0], m1[0], m2[0], m3[0], m4[0], m5[0], m6[0], m7[0]),
                    R8(m0[1], m1[1], m2[1], m3[1], m4[1], m5[1], m6[1], m7[1]),
                    R8(m0[2], m1[2], m2[2], m3[2], m4[2], m5[2], m6[2], m7[2]),
                    R8(m0[3], m1[3], m2[3], m3[3], m4[3], m5[3], m6[3], m7[3]));
    }
    lc_store(n0, o0, a.r0); lc_store(n0 + 1u, o0, a.r1); lc_store(n0 + 2u, o0, a.r2); lc_store(n0 + 3u, o0, a.r3);
    lc_store(n0 + 4u, o0, a.r4); lc_store(n0 + 5u, o0, a.r5); lc_store(n0 + 6u, o0, a.r6); lc_store(n0 + 7u, o0, a.r7);
}

fn lc_store4(n: u32, o0: u32, acc: vec4<f32>) {
    for (var b = 0u; b < 4u; b++) {
        if (o0 + b < p.oc) { y[n * p.ld_y + p.v0 + o0 + b] = acc[b]; }
    }
}

fn lc_store(n: u32, o0: u32, acc: R8) {   // outputs o0 .. o0+31 of row n
    if (n >= p.n) { return; }
    lc_store4(n, o0, acc.a); lc_store4(n, o0 + 4u, acc.b); lc_store4(n, o0 + 8u, acc.c); lc_store4(n, o0 + 12u, acc.d);
    lc_store4(n, o0 + 16u, acc.e); lc_store4(n, o0 + 20u, acc.f); lc_store4(n, o0 + 24u, acc.g); lc_store4(n, o0 + 28u, acc.h);
}

fn lc_wr4(row: u32, c: u32, I: u32) -> vec4<f32> {   // w[row, c .. c+3], columns clamped to I-1
    if (LN_QUADS) { return lc_w4(row * I + min(c, I - 4u)); }   // I % 4 == 0: one vec4 (bf16: two words)
    let b = row * I;
    let im = I - 1u;
    return vec4<f32>(w_at(b + min(c, im)), w_at(b + min(c + 1u, im)), w_at(b + min(c + 2u, im)), w_at(b + min(c + 3u, im)));
}

fn lc_w16(o: u32, c: u32, I: u32) -> mat4x4<f32> {   // w[o, c .. c+15]
    return mat4x4<f32>(lc_wr4(o, c, I), lc_wr4(o, c + 4u, I), lc_wr4(o, c + 8u, I), lc_wr4(o, c + 12u, I));
}

fn lc_dy4(d: u32, o: u32) -> vec4<f32> { return vec4<f32>(ln_dy[d + o], ln_dy[d + o + 1u], ln_dy[d + o + 2u], ln_dy[d + o + 3u]); }

fn lc_dot4(d: vec4<f32>, t0: mat4x4<f32>, t1: mat4x4<f32>, t2: mat4x4<f32>, t3: mat4x4<f32>) -> mat4x4<f32> {
    return d.x * t0 + d.y * t1 + d.z * t2 + d.w * t3;
}

@compute @workgroup_size(CPU_WG)
fn linear_backward_input_cpu(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let I = ln_p.i;
    let ld = ln_p.ld_dy;
    let c = (wid.x * CPU_WG + lid3.x) * 16u;              // columns c .. c+15
    let n0 = wid.y * 8u;
    let d0 = min(n0, ln_p.n - 1u) * ld;      let d1 = min(n0 + 1u, ln_p.n - 1u) * ld;
    let d2 = min(n0 + 2u, ln_p.n - 1u) * ld; let d3 = min(n0 + 3u, ln_p.n - 1u) * ld;
    let d4 = min(n0 + 4u, ln_p.n - 1u) * ld; let d5 = min(n0 + 5u, ln_p.n - 1u) * ld;
    let d6 = min(n0 + 6u, ln_p.n - 1u) * ld; let d7 = min(n0 + 7u, ln_p.n - 1u) * ld;
    var a0 = mat4x4<f32>(); var a1 = mat4x4<f32>(); var a2 = mat4x4<f32>(); var a3 = mat4x4<f32>();
    var a4 = mat4x4<f32>(); var a5 = mat4x4<f32>(); var a6 = mat4x4<f32>(); var a7 = mat4x4<f32>();
    var o = 0u;
    for (; o + 3u < ln_p.o; o += 4u) {   // four o's products summed, then added (see the header)
        let t0 = lc_w16(o, c, I); let t1 = lc_w16(o + 1u, c, I); let t2 = lc_w16(o + 2u, c, I); let t3 = lc_w16(o + 3u, c, I);
        a0 += lc_dot4(lc_dy4(d0, o), t0, t1, t2, t3); a1 += lc_dot4(lc_dy4(d1, o), t0, t1, t2, t3);
        a2 += lc_dot4(lc_dy4(d2, o), t0, t1, t2, t3); a3 += lc_dot4(lc_dy4(d3, o), t0, t1, t2, t3);
        a4 += lc_dot4(lc_dy4(d4, o), t0, t1, t2, t3); a5 += lc_dot4(lc_dy4(d5, o), t0, t1, t2, t3);
        a6 += lc_dot4(lc_dy4(d6, o), t0, t1, t2, t3); a7 += lc_dot4(lc_dy4(d7, o), t0, t1, t2, t3);
    }
    for (; o < ln_p.o; o++) {
        let t = lc_w16(o, c, I);
        a0 += ln_dy[d0 + o] * t; a1 += ln_dy[d1 + o] * t; a2 += ln_dy[d2 + o] * t; a3 += ln_dy[d3 + o] * t;
        a4 += ln_dy[d4 + o] * t; a5 += ln_dy[d5 + o] * t; a6 += ln_dy[d6 + o] * t; a7 += ln_dy[d7 + o] * t;
    }
    lc_bstore(n0, c, a0); lc_bstore(n0 + 1u, c, a1); lc_bstore(n0 + 2u, c, a2); lc_bstore(n0 + 3u, c, a3);
    lc_bstore(n0 + 4u, c, a4); lc_bstore(n0 + 5u, c, a5); lc_bstore(n0 + 6u, c, a6); lc_bstore(n0 + 7u, c, a7);
}

fn lc_bstore(n: u32, c: u32, acc: mat4x4<f32>) {   // columns c .. c+15 of dx row n
    if (n >= ln_p.n) { return; }
    for (var k = 0u; k < 16u; k++) {
        let i = c + k;
        if (i < ln_p.i) {
            let j = n * ln_p.i + i;
            let g = ln_p.scale * acc[k / 4u][k % 4u];
            ln_dx[j] = select(g, ln_dx[j] + g, ln_p.accumulate != 0u);   // no branch: see bitlinear.wgsl cm_put
        }
    }
}
