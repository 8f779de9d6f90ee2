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
//   of y, thread (tx, ty) rows ty + 16a (a < 4) and outputs 4tx .. 4tx+3, 64 + 4tx ..
//   (the prelude's 64 x 128 tile products, mt_*: outer products, each product added to
//   its sum in column order). x goes to workgroup memory 16 columns at a time as rows of
//   vec4s, W transposed (each thread loads a quad of two W rows and stores its 8 values
//   one by one); the next chunk's x and W values are loaded into registers while the
//   current chunk is multiplied. Before (to 2026-12-07) each output was a sum of
//   vec4 dot products over W staged untransposed (a dot is one multiply and three adds
//   before its sum: 5 instructions for 4 multiply-adds). At 1024 x 2560 x 128256, bf16 W,
//   on an H200: 64 x 64 tiles 5.9 -> 7.6 TMAC/s with the prefetch, 64 x 128 tiles of dot
//   products 11.1; on an H100 the dot-product tiles 12.5 (26.9 ms).
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
//   dispatch: groups (ceil(I/128), ceil(N/64), slices); 16x16 threads, a 64 x 128 tile of
//   dx per workgroup (the prelude's tile products, as bitlinear_backward_input), o in
//   chunks of 16. Before (to 2026-12-07) 64 x 64 tiles of 4 x 4 elements a thread: 11.2
//   TMAC/s on an H100 at 1024 x 2560 x 128256 (30.1 ms).

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

const KT: u32 = 16u;   // columns per staged chunk

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

fn lf_put_wt(o: u32, q: u32, v: vec4<f32>) {   // w[o, 4q .. 4q+3] of the chunk into mt_b, transposed
    mt_b[4u * q][o / 4u][o % 4u] = v.x;
    mt_b[4u * q + 1u][o / 4u][o % 4u] = v.y;
    mt_b[4u * q + 2u][o / 4u][o % 4u] = v.z;
    mt_b[4u * q + 3u][o / 4u][o % 4u] = v.w;
}

@compute @workgroup_size(16, 16)
fn linear_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let o0 = wid.x * 128u;
    // this thread's staging slots: x row lid/4, column quad lid%4; W outputs lid/4 and
    // 64 + lid/4, the same quad (rows of W, stored transposed)
    let sr = lid / 4u;
    let sq = lid % 4u;
    var xv = lf_x4(sr, 4u * sq, n0);
    var wv0 = lf_w4(o0 + sr, 4u * sq);
    var wv1 = lf_w4(o0 + 64u + sr, 4u * sq);
    var acc = MtSums();
    for (var c0 = 0u; c0 < p.i; c0 += KT) {
        mt_a[sr][sq] = xv;
        lf_put_wt(sr, sq, wv0);
        lf_put_wt(64u + sr, sq, wv1);
        workgroupBarrier();
        let c1 = c0 + KT;
        xv = lf_x4(sr, c1 + 4u * sq, n0);
        wv0 = lf_w4(o0 + sr, c1 + 4u * sq);
        wv1 = lf_w4(o0 + 64u + sr, c1 + 4u * sq);
        acc = mt_quad(acc, 0u, ty, tx);
        acc = mt_quad(acc, 1u, ty, tx);
        acc = mt_quad(acc, 2u, ty, tx);
        acc = mt_quad(acc, 3u, ty, tx);
        workgroupBarrier();
    }
    let c0 = o0 + 4u * tx;
    let c1 = o0 + 64u + 4u * tx;
    head_store(n0 + ty, c0, acc.a00); head_store(n0 + ty, c1, acc.a01);
    head_store(n0 + ty + 16u, c0, acc.a10); head_store(n0 + ty + 16u, c1, acc.a11);
    head_store(n0 + ty + 32u, c0, acc.a20); head_store(n0 + ty + 32u, c1, acc.a21);
    head_store(n0 + ty + 48u, c0, acc.a30); head_store(n0 + ty + 48u, c1, acc.a31);
}

fn head_store(n: u32, o: u32, acc: vec4<f32>) {    // outputs o .. o+3 of row n
    if (n >= p.n) { return; }
    for (var b = 0u; b < 4u; b++) {
        if (o + b < p.oc) { y[n * p.ld_y + p.v0 + o + b] = acc[b]; }
    }
}

// ---------------------------------------------------------------------------- backward
struct LinearBackwardParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, ld_dy: u32, ko: u32, split: u32 };
@group(0) @binding(0) var<uniform> ln_p: LinearBackwardParams;
@group(0) @binding(1) var<storage, read> ln_dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> ln_dx: array<f32>;
@group(0) @binding(4) var<storage, read_write> ln_part: array<f32>;   // split: [z, N, I] raw sums
@group(0) @binding(6) var<storage, read> ln_dy4: array<vec4<f32>>;   // dy again, as vec4s (read where ld_dy % 4 == 0)

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

// A 64 x 128 tile of dx per workgroup, the prelude's tile products (mt_*): dy chunks in
// mt_a, W rows in mt_b. The next 16 o's dy and W values are loaded into registers while
// the current ones are multiplied.
@compute @workgroup_size(16, 16)
fn linear_backward_input(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let i0 = wid.x * 128u;
    let obeg = wid.z * ln_p.ko;
    let oend = min(ln_p.o, (wid.z + 1u) * ln_p.ko);            // this z's slice of the outputs
    // this thread's staging slots: dy row lid/4, o quad lid%4; W outputs lid/32 and 8 + lid/32,
    // column quad lid%32
    let dr = lid / 4u;
    let dq = lid % 4u;
    let wo = lid / 32u;
    let wc = lid % 32u;
    var d = lb_dy4(n0 + dr, obeg + 4u * dq, oend);
    var wv0 = lb_w4(obeg + wo, oend, i0 + 4u * wc);
    var wv1 = lb_w4(obeg + wo + 8u, oend, i0 + 4u * wc);
    var acc = MtSums();
    for (var o0 = obeg; o0 < oend; o0 += 16u) {
        mt_a[dr][dq] = d;
        mt_b[wo][wc] = wv0;
        mt_b[wo + 8u][wc] = wv1;
        workgroupBarrier();
        let o1 = o0 + 16u;
        d = lb_dy4(n0 + dr, o1 + 4u * dq, oend);
        wv0 = lb_w4(o1 + wo, oend, i0 + 4u * wc);
        wv1 = lb_w4(o1 + wo + 8u, oend, i0 + 4u * wc);
        acc = mt_quad(acc, 0u, ty, tx);
        acc = mt_quad(acc, 1u, ty, tx);
        acc = mt_quad(acc, 2u, ty, tx);
        acc = mt_quad(acc, 3u, ty, tx);
        workgroupBarrier();
    }
    let c0 = i0 + 4u * tx;
    let c1 = i0 + 64u + 4u * tx;
    ln_store(n0 + ty, c0, acc.a00, wid.z); ln_store(n0 + ty, c1, acc.a01, wid.z);
    ln_store(n0 + ty + 16u, c0, acc.a10, wid.z); ln_store(n0 + ty + 16u, c1, acc.a11, wid.z);
    ln_store(n0 + ty + 32u, c0, acc.a20, wid.z); ln_store(n0 + ty + 32u, c1, acc.a21, wid.z);
    ln_store(n0 + ty + 48u, c0, acc.a30, wid.z); ln_store(n0 + ty + 48u, c1, acc.a31, wid.z);
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
