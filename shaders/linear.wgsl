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
//   2 w[Oc, I] read | 3 y[N, ld_y] read_write
//   dispatch: groups (ceil(Oc/64), ceil(N/64)); a 16x16 workgroup owns a 64 x 64 tile of
//   y, thread (tx, ty) rows ty + 16a and outputs tx + 16b (a, b < 4). x and W are staged
//   through workgroup memory 32 columns at a time and read back as vec4, so each
//   workgroup-memory load feeds 16 multiply-adds (see bitlinear.wgsl).
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
//   1 dy[N, ld_dy] read | 2 w[O, I] read | 3 dx[N, I] read_write | 4 part[slices, N, I] read_write
//   Split-K (splitk.wgsl): workgroup z sums o in [z*ko, (z+1)*ko) only; with split = 1
//   it writes raw sums to part[z, N, I] for splitk_reduce (part unused when split = 0).
//   dispatch: groups (ceil(I/64), ceil(N/64), slices); 16x16 threads, a 64x64 tile of dx per
//   workgroup (4x4 elements per thread), o in chunks of 16.

override LN_BF16: bool = false;
@group(0) @binding(2) var<storage, read> w: array<u32>;   // W[O, I] of every entry point: f32, or bf16 pairs (LN_BF16)

fn w_at(e: u32) -> f32 {   // element e of W, row-major
    if (LN_BF16) { return bf16_at(w[e >> 1u], e); }
    return bitcast<f32>(w[e]);
}

const TO: u32 = 64u;
const TN: u32 = 8u;
const KC: u32 = 256u;
struct LinearParams { n: u32, i: u32, oc: u32, ld_y: u32, v0: u32, x_row0: u32, x_step: u32 };
@group(0) @binding(0) var<uniform> p: LinearParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
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

const KT: u32 = 32u;                                   // columns per staged chunk
var<workgroup> t_x: array<array<vec4<f32>, 8>, 64>;    // [row][column quad]
var<workgroup> t_w: array<array<vec4<f32>, 8>, 64>;    // [output][column quad]

@compute @workgroup_size(16, 16)
fn linear_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let o0 = wid.x * 64u;
    var acc0 = vec4<f32>(0.0);                         // acc<a>[b]: row ty + 16a, output tx + 16b
    var acc1 = vec4<f32>(0.0);                         // (named: see bitlinear.wgsl)
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var c0 = 0u; c0 < p.i; c0 += KT) {
        for (var m = 0u; m < 8u; m++) {                // stage 64 rows of x and of W, 32 columns each
            let e = lid + 256u * m;
            let r = e / KT;
            let c = c0 + e % KT;
            var xv = 0.0;
            var wv = 0.0;
            if (c < p.i) {
                if (n0 + r < p.n) { xv = x[(p.x_row0 + (n0 + r) * p.x_step) * p.i + c]; }
                if (o0 + r < p.oc) { wv = w_at((o0 + r) * p.i + c); }
            }
            t_x[r][(e % KT) / 4u][e % 4u] = xv;
            t_w[r][(e % KT) / 4u][e % 4u] = wv;
        }
        workgroupBarrier();
        for (var q = 0u; q < KT / 4u; q++) {
            let w0 = t_w[tx][q];
            let w1 = t_w[tx + 16u][q];
            let w2 = t_w[tx + 32u][q];
            let w3 = t_w[tx + 48u][q];
            let x0 = t_x[ty][q];
            let x1 = t_x[ty + 16u][q];
            let x2 = t_x[ty + 32u][q];
            let x3 = t_x[ty + 48u][q];
            acc0 += vec4<f32>(dot(x0, w0), dot(x0, w1), dot(x0, w2), dot(x0, w3));
            acc1 += vec4<f32>(dot(x1, w0), dot(x1, w1), dot(x1, w2), dot(x1, w3));
            acc2 += vec4<f32>(dot(x2, w0), dot(x2, w1), dot(x2, w2), dot(x2, w3));
            acc3 += vec4<f32>(dot(x3, w0), dot(x3, w1), dot(x3, w2), dot(x3, w3));
        }
        workgroupBarrier();
    }
    head_store(n0 + ty, o0 + tx, acc0);
    head_store(n0 + ty + 16u, o0 + tx, acc1);
    head_store(n0 + ty + 32u, o0 + tx, acc2);
    head_store(n0 + ty + 48u, o0 + tx, acc3);
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
var<workgroup> ln_dy_sh: array<array<vec4<f32>, 4>, 64>;  // [row][o quad], 16 o
var<workgroup> ln_w_sh: array<array<vec4<f32>, 16>, 16>;   // [o][column quad], 64 columns

// A 64x64 tile of dx per workgroup; thread (tx, ty) owns rows ty + 16a (a < 4) and the
// four columns 4tx .. 4tx+3, as four vec4 sums in named variables (see bitlinear.wgsl).
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
            if (o0 + wo < oend && i0 + wc < I) { wv = w_at((o0 + wo) * I + i0 + wc); }
            ln_w_sh[wo][wc / 4u][wc % 4u] = wv;
        }
        workgroupBarrier();
        for (var oq = 0u; oq < 4u; oq++) {
            let d0 = ln_dy_sh[ty][oq];
            let d1 = ln_dy_sh[ty + 16u][oq];
            let d2 = ln_dy_sh[ty + 32u][oq];
            let d3 = ln_dy_sh[ty + 48u][oq];
            var wr = ln_w_sh[oq * 4u][tx];
            a0 += d0.x * wr; a1 += d1.x * wr; a2 += d2.x * wr; a3 += d3.x * wr;
            wr = ln_w_sh[oq * 4u + 1u][tx];
            a0 += d0.y * wr; a1 += d1.y * wr; a2 += d2.y * wr; a3 += d3.y * wr;
            wr = ln_w_sh[oq * 4u + 2u][tx];
            a0 += d0.z * wr; a1 += d1.z * wr; a2 += d2.z * wr; a3 += d3.z * wr;
            wr = ln_w_sh[oq * 4u + 3u][tx];
            a0 += d0.w * wr; a1 += d1.w * wr; a2 += d2.w * wr; a3 += d3.w * wr;
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
