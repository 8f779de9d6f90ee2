// lm_head.wgsl — dense (unquantised) linear layer for the output head, forward:
// logits = x W^T with W[V, C] f32, or bf16 two per u32 (low half first) when the
// override LN_BF16 is true (the tied embedding or an untied lm_head; HF's
// lm_head is a plain nn.Linear, not a BitLinear). W may be split into row chunks,
// each its own buffer under maxStorageBufferBindingSize: one dispatch per chunk,
// writing columns [v0, v0 + Oc) of y. (linear_backward_input is in backward.wgsl.)
//
// linear_forward   y[n, v0 + o] = sum_i x[row(n), i] w[o, i]   for o < Oc,
//   row(n) = x_row0 + n * x_step (x_row0 = 0, x_step = 1 for every row; x_row0 = T-1,
//   x_step = T for the last token of each sequence when decoding)
//   0 params {N, I, Oc, ld_y, v0, x_row0, x_step} | 1 x[N, I] read | 2 w[Oc, I] read | 3 y[N, ld_y] read_write
//   dispatch: groups (ceil(Oc/64), ceil(N/64)); a 16x16 workgroup owns a 64 x 64 tile of
//   y, thread (tx, ty) rows ty + 16a and outputs tx + 16b (a, b < 4). x and W are staged
//   through workgroup memory 32 columns at a time and read back as vec4, so each
//   workgroup-memory load feeds 16 multiply-adds (see bitlinear.wgsl).
//
// linear_forward_rows   the same for a few rows (decoding): groups (ceil(Oc/64), ceil(N/8));
//   a workgroup (64) owns 64 outputs x 8 rows, a thread one output for 8 rows; x is
//   staged through workgroup memory 256 columns at a time.

const TO: u32 = 64u;
const TN: u32 = 8u;
const KC: u32 = 256u;
struct LinParams { n: u32, i: u32, oc: u32, ld_y: u32, v0: u32, x_row0: u32, x_step: u32 };
@group(0) @binding(0) var<uniform> p: LinParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;   // f32, or bf16 pairs (LN_BF16)
override LN_BF16: bool = false;

fn w_at(e: u32) -> f32 {   // element e of W, row-major
    if (LN_BF16) {
        let word = w[e >> 1u];
        return bitcast<f32>(select(word << 16u, word & 0xffff0000u, (e & 1u) == 1u));
    }
    return bitcast<f32>(w[e]);
}
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
