// matvec.wgsl — decoding's kernels for one row (N = 1: one token of one sequence). A
// decoding step reads every weight once and does a few operations per byte, so these
// are shaped for memory bandwidth — many workgroups, weights in 16-byte loads, int8 dot
// products — where bitlinear.wgsl / linear.wgsl's tiles are shaped for reuse across
// rows (prefill, training). The model records them for a one-token forward (model.py).
//
// rmsnorm_quant   the RMSNorm before a BitLinear and the BitLinear's activation
//   quantisation in one pass over the row:
//     y = w * (x * rstd) exactly as rmsnorm_forward computes it (rmsnorm_quant_cpu: as
//     rmsnorm_forward_rows), then q = clamp(round(y * s), -128, 127) with
//     s = 127 / max(max|y|, 1e-5), exactly actquant_forward's,
//   q packed for ternary_matvec (below), and qs = {s, sum of q} (y stays for LoRA).
//   rmsnorm_quant only: with the override NQ_GATE (GATE_RELU2 or GATE_SILU: the prelude's
//   gating) x is the MLP's gate g and the row normed is act(g) * u, as relu2.wgsl's gating
//   computes it (ffn_sub_norm after the gating, in one dispatch). rmsnorm_quant_cpu takes
//   x as it is (the op runs the gating first: fused, lavapipe ran this one-invocation
//   kernel ~100x slower, for reasons not found).
//   0 params NormQuantParams {C, eps} | 1 x[C] read | 2 w[C] read | 3 y[C] write |
//   4 xq[4*ceil(C/16)] u32 write | 5 qs[2] write | 6 u[C] read (rmsnorm_quant: x when ungated)
//   dispatch: one workgroup (256); rmsnorm_quant_cpu (C % 4 == 0): one workgroup of one.
// rmsnorm_quant_down   rmsnorm_quant and lora.wgsl's lora_down_parts of its y in one
//   dispatch (decoding an adapted group on a GPU: one dispatch less): workgroup 3R runs
//   rmsnorm_quant; workgroup k = p*R + r < 3R, where part p is adapted (a_p != NONE), takes
//   rmsnorm_quant's rstd (its first pass, the same bits), then
//     u[k] = sum_i y[i] A_p[r, i]   with y[i] = w[i] * (x[i] * rstd) recomputed, in
//   lora_down_parts' order (its WR = 256 threads, columns strided, wg_sum): the same
//   bits as the two dispatches. A_p at float a_p of ab. Params NormQuantParams' r, a0..a2.
//   Bindings as rmsnorm_quant | 7 ab read (the LoRA arena's params) | 8 u[3R] read_write
//   dispatch: 3R + 1 workgroups split over x, y.
//
// Packed activations: xq word 4k + m holds, in byte j, the int8 of column 16k + 4j + m
// (0 past C). That is the order in which a packed weight word gives up its codes:
// (word >> 2m) & 0x03030303 holds in byte j the code of column 16k + 4j + m, c = t + 1
// in {0, 1, 2}. So a weight word against its vec4 of xq is four dot4I8Packed, and
//   sum_i q_i t_i = sum_i q_i c_i - sum_i q_i     (integers: exact; qs[1] is the last sum)
//
// ternary_matvec   up to three projections of one input (q, k, v; gate, up), their packed
//   weights in one buffer, part p starting at vec4 word base_p (base_0 = 0):
//     y_p[o] (= or +=) (sum_i q_i t_p[o, i]) * scale_p / s   for o < O_p
//   the same bits as bitlinear_forward (its integer sums are exact in f32 too). A part
//   with a LoRA adapter (b_p != NONE) then adds lora_scale * sum_r u[p*R + r] B_p[o, r], as
//   lora_up adds it (u from lora.wgsl lora_down_parts; B_p at float b_p of ab).
//   0 params MatvecParams {W4, O0, O1, O2, base1, base2, scale0, scale1, scale2, accumulate,
//   R, lora_scale, b0, b1, b2, rank4 (bit p: part p's LoRA sum four ranks per dot, as
//   lora_up_rows sums it)} | 1 xq[4*W] u32 read, one vec4 per weight word | 2 qs[2] read |
//   3 w read, rows of W4 vec4 words (W = 4*W4 = ceil(I/16)) | 4 y0[O0] | 5 y1[O1] |
//   6 y2[O2] read_write (distinct buffers: an absent part's is a spare) | 7 u[3R] read |
//   8 ab read (the LoRA arena's params; spares without an adapter)
//   dispatch: ceil((O0 + O1 + O2) / (256 / MV_TPR)) workgroups split over x, y. MV_TPR
//   threads share an output row: they stride over its vec4 words (adjacent threads read
//   adjacent 16 bytes), and the row's partial sums meet in workgroup memory (no subgroups).
// norm_matvec   rmsnorm_quant and ternary_matvec in one dispatch, for parts without LoRA
//   (GPU kernels, whole vec4 words, C <= 8192): every workgroup norms and quantises the
//   row itself — rmsnorm_quant's passes line for line, so the same bits — into workgroup
//   memory, then multiplies its rows as ternary_matvec does. y (the normed row) is not
//   written: only LoRA's down half reads it. One dispatch less per norm: a decoding step's
//   cost on a GPU is mostly per dispatch (docs/PERFORMANCE.md). NQ_GATE as rmsnorm_quant's.
//   0 params MatvecParams (c, eps: the norm's; no LoRA) | 1 x[C] read | 2 w[C] read (the
//   norm's) | 3 w read (packed, as ternary_matvec's) | 4 y0 | 5 y1 | 6 y2 read_write |
//   7 u[C] read (the gate's u; x when ungated)
//   dispatch: as ternary_matvec, over NM_BATCH times fewer workgroups: with the override
//   NM_BATCH a workgroup multiplies NM_BATCH blocks of MV_WG / MV_TPR rows in turn after
//   its one norm (ops/matvec.py chooses it for wide grids: gate + up).
// ternary_matvec_rows   the same, one output row per invocation, one u32 word at a time, no
//   barriers: for CPU adapters, and for rows that are not whole vec4 words (W % 4 != 0).
//   Bindings as ternary_matvec with w as u32 words: W4 is then W, base_p in words.
//   dispatch: ceil((O0 + O1 + O2) / MV_ROWS) workgroups split over x, y.
//
// dense_matvec   the output head for one row: y[v0 + o] = sum_c x[x0 + c] w[o, c] for o < Oc,
//   w one row chunk of the f32 or bf16 table (override MV_BF16: bf16 pairs, low half first).
//   0 params DenseParams {C, Oc, v0, x0} | 1 x read | 2 w[Oc, C] read | 3 y read_write
//   dispatch: ceil(Oc / (256 / MV_TPR)) workgroups split over x, y; threads of a row stride
//   over 16-byte words of it (8 bf16 or 4 f32; C % 8 == 0 or C % 4 == 0 and x0 % 4 == 0).
// dense_matvec_rows   the same, one row per invocation, columns in order (the sum of
//   linear_forward_rows, bit for bit): CPU adapters, and any C.
//   dispatch: ceil(Oc / MV_ROWS) workgroups split over x, y.

const MV_WG: u32 = 256u;     // threads per workgroup of the GPU kernels
override MV_TPR: u32 = 16u;  // threads per output row (a power of two, at most 256)
const MV_ROWS: u32 = 16u;    // rows (invocations) per workgroup of the *_rows kernels

// ---------------------------------------------------------------------------- rmsnorm_quant
struct NormQuantParams { c: u32, eps: f32, r: u32, a0: u32, a1: u32, a2: u32 };   // r, a_p: rmsnorm_quant_down's
@group(0) @binding(0) var<uniform> nq_p: NormQuantParams;
@group(0) @binding(1) var<storage, read> nq_x: array<f32>;
@group(0) @binding(2) var<storage, read> nq_w: array<f32>;
@group(0) @binding(3) var<storage, read_write> nq_y: array<f32>;
@group(0) @binding(4) var<storage, read_write> nq_xq: array<u32>;
@group(0) @binding(5) var<storage, read_write> nq_qs: array<f32>;
@group(0) @binding(6) var<storage, read> nq_u: array<f32>;
@group(0) @binding(7) var<storage, read> nq_ab: array<f32>;
@group(0) @binding(8) var<storage, read_write> nq_lu: array<f32>;
override NQ_GATE: u32 = 0u;

fn nq_in(c: u32) -> f32 {   // element c of the row to norm
    if (NQ_GATE == 0u) { return nq_x[c]; }
    return gating(NQ_GATE, nq_x[c], nq_u[c]);
}

fn nq_q(col: u32, r: f32, s: f32) -> i32 {   // the int8 of column col (0 past C)
    if (col >= nq_p.c) { return 0; }
    return i32(clamp(round(nq_w[col] * (nq_in(col) * r) * s), -128.0, 127.0));
}

fn nq_word(e: u32, r: f32, s: f32) -> vec2<i32> {   // packed xq word e and the sum of its 4 values
    let c0 = 16u * (e / 4u) + e % 4u;
    let q0 = nq_q(c0, r, s);
    let q1 = nq_q(c0 + 4u, r, s);
    let q2 = nq_q(c0 + 8u, r, s);
    let q3 = nq_q(c0 + 12u, r, s);
    return vec2<i32>(bitcast<i32>(pack4xI8(vec4<i32>(q0, q1, q2, q3))), q0 + q1 + q2 + q3);
}

fn nq_in_at(c: u32) -> f32 {   // nq_in, 0 past C
    if (c < nq_p.c) { return nq_in(c); }
    return 0.0;
}

fn nq_y_at(c: u32, r: f32) -> f32 {   // the normed row's column c, written to y (0 past C)
    if (c >= nq_p.c) { return 0.0; }
    let v = nq_w[c] * (nq_in(c) * r);
    nq_y[c] = v;
    return v;
}

fn nq_put(e: u32, r: f32, s: f32) -> i32 {   // packed word e written (if the row has it); its sum
    if (e >= 4u * ((nq_p.c + 15u) / 16u)) { return 0; }
    let wq = nq_word(e, r, s);
    nq_xq[e] = bitcast<u32>(wq.x);
    return wq.y;
}

// The passes go four columns (two packed words) a thread per turn, whose loads are issued
// together: a loop turn's reads cost a memory latency, and the kernel is a chain of them
// (bench/latency_probe.py: 5.6 -> 3.8 us for one pass over 2560 columns on the H200).
// Thread lid still sums its columns lid + 256 j in order (the zeros past C add nothing).
fn nq_rstd(lid: u32) -> f32 {   // the first pass: 1 / rms of the row (every thread calls it)
    let C = nq_p.c;
    var acc = 0.0;
    for (var c = lid; c < C; c += 4u * MV_WG) {
        acc = sum_sq4(acc, vec4<f32>(nq_in_at(c), nq_in_at(c + MV_WG), nq_in_at(c + 2u * MV_WG), nq_in_at(c + 3u * MV_WG)));
    }
    return inverseSqrt(wg_sum(lid, acc, MV_WG) / f32(C) + nq_p.eps);
}

fn nq_run(lid: u32) {   // rmsnorm_quant's passes: y, xq and qs of the row
    let C = nq_p.c;
    let r = nq_rstd(lid);
    var m = 0.0;
    for (var c = lid; c < C; c += 4u * MV_WG) {
        let y = abs(vec4<f32>(nq_y_at(c, r), nq_y_at(c + MV_WG, r), nq_y_at(c + 2u * MV_WG, r), nq_y_at(c + 3u * MV_WG, r)));
        m = max(m, max(max(y.x, y.y), max(y.z, y.w)));
    }
    let s = 127.0 / max(wg_max(lid, m, MV_WG), 1e-5);
    var qsum = 0;
    for (var e = lid; e < 4u * ((C + 15u) / 16u); e += 2u * MV_WG) {
        qsum += nq_put(e, r, s) + nq_put(e + MV_WG, r, s);
    }
    let total = wg_sum(lid, f32(qsum), MV_WG);   // integers below 2^24: exact in any order
    if (lid == 0u) {
        nq_qs[0] = s;
        nq_qs[1] = total;
    }
}

@compute @workgroup_size(MV_WG)
fn rmsnorm_quant(@builtin(local_invocation_id) lid3: vec3<u32>) {
    nq_run(lid3.x);
}

const NQ_NONE: u32 = 0xffffffffu;   // "part not adapted" (ops/lora.py NONE)
const NQ_WR: u32 = 256u;            // lora.wgsl WR: lora_down_parts' threads

fn nq_a(part: u32) -> u32 {
    return select(select(nq_p.a2, nq_p.a1, part == 1u), nq_p.a0, part == 0u);
}

fn nq_down(i: u32, r: f32, ar: u32) -> f32 {   // y[i] A[r, i]: lora_down_parts' product
    return (nq_w[i] * (nq_in(i) * r)) * nq_ab[ar + i];
}

@compute @workgroup_size(MV_WG)
fn rmsnorm_quant_down(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let k = wid.x + wid.y * nw.x;     // = part * R + r; 3R: the norm and quantisation
    let R = nq_p.r;
    if (k == 3u * R) {
        nq_run(lid);
        return;
    }
    if (k > 3u * R || nq_a(k / R) == NQ_NONE) { return; }   // uniform per workgroup
    let C = nq_p.c;
    let r = nq_rstd(lid);
    let ar = nq_a(k / R) + (k % R) * C;
    var acc = 0.0;
    if (lid < NQ_WR) {
        var i0 = lid;
        for (; i0 + 7u * NQ_WR < C; i0 += 8u * NQ_WR) {   // eight products in flight, added in order
            let p0 = nq_down(i0, r, ar);
            let p1 = nq_down(i0 + NQ_WR, r, ar);
            let p2 = nq_down(i0 + 2u * NQ_WR, r, ar);
            let p3 = nq_down(i0 + 3u * NQ_WR, r, ar);
            let p4 = nq_down(i0 + 4u * NQ_WR, r, ar);
            let p5 = nq_down(i0 + 5u * NQ_WR, r, ar);
            let p6 = nq_down(i0 + 6u * NQ_WR, r, ar);
            let p7 = nq_down(i0 + 7u * NQ_WR, r, ar);
            acc += p0;
            acc += p1;
            acc += p2;
            acc += p3;
            acc += p4;
            acc += p5;
            acc += p6;
            acc += p7;
        }
        for (var i = i0; i < C; i += NQ_WR) { acc += nq_down(i, r, ar); }
    }
    let total = wg_sum(lid, acc, NQ_WR);
    if (lid == 0u) { nq_lu[k] = total; }
}

@group(0) @binding(1) var<storage, read> nqc_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> nqc_w: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> nqc_y: array<vec4<f32>>;

@compute @workgroup_size(1)
fn rmsnorm_quant_cpu() {
    let C4 = nq_p.c / 4u;
    var acc = vec4<f32>(0.0);
    for (var c = 0u; c < C4; c++) { let v = nqc_x[c]; acc += v * v; }
    let r = inverseSqrt((acc.x + acc.y + acc.z + acc.w) / f32(nq_p.c) + nq_p.eps);
    var m4 = vec4<f32>(0.0);
    for (var c = 0u; c < C4; c++) {
        let v = nqc_w[c] * (nqc_x[c] * r);
        nqc_y[c] = v;
        m4 = max(m4, abs(v));
    }
    let s = 127.0 / max(max(max(m4.x, m4.y), max(m4.z, m4.w)), 1e-5);
    var qsum = 0;
    for (var e = 0u; e < 4u * ((nq_p.c + 15u) / 16u); e++) {
        let wq = cpu_nq_word(e, r, s);
        nq_xq[e] = bitcast<u32>(wq.x);
        qsum += wq.y;
    }
    nq_qs[0] = s;
    nq_qs[1] = f32(qsum);
}

fn cpu_nq_q(col: u32, r: f32, s: f32) -> i32 {   // nq_q through the vec4 bindings (same value)
    if (col >= nq_p.c) { return 0; }
    return i32(clamp(round(nqc_w[col / 4u][col % 4u] * (nqc_x[col / 4u][col % 4u] * r) * s), -128.0, 127.0));
}

fn cpu_nq_word(e: u32, r: f32, s: f32) -> vec2<i32> {
    let c0 = 16u * (e / 4u) + e % 4u;
    let q0 = cpu_nq_q(c0, r, s);
    let q1 = cpu_nq_q(c0 + 4u, r, s);
    let q2 = cpu_nq_q(c0 + 8u, r, s);
    let q3 = cpu_nq_q(c0 + 12u, r, s);
    return vec2<i32>(bitcast<i32>(pack4xI8(vec4<i32>(q0, q1, q2, q3))), q0 + q1 + q2 + q3);
}

// ---------------------------------------------------------------------------- ternary_matvec
struct MatvecParams {
    w4: u32, o0: u32, o1: u32, o2: u32, base1: u32, base2: u32,
    scale0: f32, scale1: f32, scale2: f32, accumulate: u32,
    r: u32, lora_scale: f32, b0: u32, b1: u32, b2: u32, rank4: u32,
    c: u32, eps: f32,   // norm_matvec's norm (ternary_matvec: unused)
};
@group(0) @binding(0) var<uniform> mv_p: MatvecParams;
@group(0) @binding(1) var<storage, read> mv_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> mv_qs: array<f32>;
@group(0) @binding(3) var<storage, read> mv_w: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> mv_y0: array<f32>;
@group(0) @binding(5) var<storage, read_write> mv_y1: array<f32>;
@group(0) @binding(6) var<storage, read_write> mv_y2: array<f32>;
@group(0) @binding(7) var<storage, read> mv_u: array<f32>;
@group(0) @binding(8) var<storage, read> mv_ab: array<f32>;
var<workgroup> mv_part: array<i32, MV_WG>;

fn word_dot(w: u32, x: vec4<u32>) -> i32 {   // sum over one weight word's 16 columns of q * code
    let m = 0x03030303u;
    return dot4I8Packed(x.x, w & m) + dot4I8Packed(x.y, (w >> 2u) & m)
         + dot4I8Packed(x.z, (w >> 4u) & m) + dot4I8Packed(x.w, (w >> 6u) & m);
}

// Row r of the parts laid end to end -> (part, row in the part, its first unit in w);
// part 3 means past the last row.
fn mv_locate(r: u32) -> vec3<u32> {
    let p = mv_p;
    if (r < p.o0) { return vec3<u32>(0u, r, r * p.w4); }
    if (r < p.o0 + p.o1) { let o = r - p.o0; return vec3<u32>(1u, o, p.base1 + o * p.w4); }
    if (r < p.o0 + p.o1 + p.o2) { let o = r - p.o0 - p.o1; return vec3<u32>(2u, o, p.base2 + o * p.w4); }
    return vec3<u32>(3u, 0u, 0u);
}

fn mv_value(part: u32, o: u32, sum: i32, s: f32, qsum: f32) -> f32 {   // y_p[o] (= or +=) the BitLinear
    let p = mv_p;
    var scale = p.scale0;
    if (part == 1u) { scale = p.scale1; }
    if (part == 2u) { scale = p.scale2; }
    let v = (f32(sum) - qsum) * scale / s;
    var y = v;
    if (p.accumulate != 0u) {
        if (part == 0u) { y = mv_y0[o] + v; }
        if (part == 1u) { y = mv_y1[o] + v; }
        if (part == 2u) { y = mv_y2[o] + v; }
    }
    return y;
}

fn mv_put(part: u32, o: u32, y: f32) {
    if (part == 0u) { mv_y0[o] = y; }
    if (part == 1u) { mv_y1[o] = y; }
    if (part == 2u) { mv_y2[o] = y; }
}

fn mv_lora(part: u32, o: u32, y: f32) -> f32 {   // y plus part's LoRA branch, where it has one
    let p = mv_p;
    var b = p.b0;
    if (part == 1u) { b = p.b1; }
    if (part == 2u) { b = p.b2; }
    if (b == 0xffffffffu) { return y; }
    var acc = 0.0;
    if (((p.rank4 >> part) & 1u) != 0u) {   // lora_up_rows' order: four ranks per dot
        for (var r = 0u; r < p.r; r += 4u) {
            let u = part * p.r + r;
            let j = b + o * p.r + r;
            acc += dot(vec4<f32>(mv_u[u], mv_u[u + 1u], mv_u[u + 2u], mv_u[u + 3u]),
                       vec4<f32>(mv_ab[j], mv_ab[j + 1u], mv_ab[j + 2u], mv_ab[j + 3u]));
        }
    } else {
        for (var r = 0u; r < p.r; r++) { acc += mv_u[part * p.r + r] * mv_ab[b + o * p.r + r]; }
    }
    return y + p.lora_scale * acc;
}

fn mv_store(part: u32, o: u32, sum: i32) {
    mv_put(part, o, mv_lora(part, o, mv_value(part, o, sum, mv_qs[0], mv_qs[1])));
}

fn mv_slot(at: vec3<u32>, k: u32) -> vec4<u32> {   // weight vec4 k of the row at (0 past it)
    if (at.x < 3u && k < mv_p.w4) { return mv_w[at.z + k]; }
    return vec4<u32>(0u);
}

fn mv_dot(w: vec4<u32>, k: u32) -> i32 {   // weight vec4 k against the activations' vec4s 4k .. 4k + 3
    if (k >= mv_p.w4) { return 0; }
    return word_dot(w.x, mv_x[4u * k]) + word_dot(w.y, mv_x[4u * k + 1u])
         + word_dot(w.z, mv_x[4u * k + 2u]) + word_dot(w.w, mv_x[4u * k + 3u]);
}

@compute @workgroup_size(MV_WG)
fn ternary_matvec(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % MV_TPR;
    let at = mv_locate((wid.x + wid.y * nw.x) * (MV_WG / MV_TPR) + lid / MV_TPR);
    var acc = 0;
    for (var k = lane; k < mv_p.w4; k += 4u * MV_TPR) {   // four loads in flight, then their sums
        let w0 = mv_slot(at, k);
        let w1 = mv_slot(at, k + MV_TPR);
        let w2 = mv_slot(at, k + 2u * MV_TPR);
        let w3 = mv_slot(at, k + 3u * MV_TPR);
        acc += mv_dot(w0, k) + mv_dot(w1, k + MV_TPR) + mv_dot(w2, k + 2u * MV_TPR) + mv_dot(w3, k + 3u * MV_TPR);
    }
    mv_part[lid] = acc;
    workgroupBarrier();
    if (lane == 0u && at.x < 3u) {
        var sum = 0;
        for (var l = 0u; l < MV_TPR; l++) { sum += mv_part[lid + l]; }
        mv_store(at.x, at.y, sum);
    }
}

@group(0) @binding(3) var<storage, read> mvr_w: array<u32>;

@compute @workgroup_size(MV_ROWS)
fn ternary_matvec_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let at = mv_locate(gid.x + gid.y * nw.x * MV_ROWS);
    if (at.x == 3u) { return; }
    var acc = 0;
    for (var k = 0u; k < mv_p.w4; k++) { acc += word_dot(mvr_w[at.z + k], mv_x[k]); }
    mv_store(at.x, at.y, acc);
}

// ---------------------------------------------------------------------------- norm_matvec
@group(0) @binding(1) var<storage, read> nm_x: array<f32>;
@group(0) @binding(2) var<storage, read> nm_w: array<f32>;
@group(0) @binding(7) var<storage, read> nm_u: array<f32>;
var<workgroup> nm_xq: array<vec4<u32>, 512>;   // the row's packed int8, C <= 8192
override NM_BATCH: u32 = 1u;   // blocks of MV_WG / MV_TPR output rows per workgroup (ops/matvec.py)

fn nm_in(c: u32) -> f32 {   // rmsnorm_quant's nq_in through these bindings
    if (NQ_GATE == 0u) { return nm_x[c]; }
    return gating(NQ_GATE, nm_x[c], nm_u[c]);
}

fn nm_in_at(c: u32) -> f32 {   // nm_in, 0 past C
    if (c < mv_p.c) { return nm_in(c); }
    return 0.0;
}

fn nm_y_at(c: u32, r: f32) -> f32 {   // the normed row's column c (0 past C)
    if (c >= mv_p.c) { return 0.0; }
    return nm_w[c] * (nm_in(c) * r);
}

fn nm_q(col: u32, r: f32, s: f32) -> i32 {   // rmsnorm_quant's nq_q
    return i32(clamp(round(nm_y_at(col, r) * s), -128.0, 127.0));
}

fn nm_put(e: u32, r: f32, s: f32) -> i32 {   // packed word e into nm_xq (if the row has it); its sum
    if (e >= 4u * ((mv_p.c + 15u) / 16u)) { return 0; }
    let c0 = 16u * (e / 4u) + e % 4u;
    let q = vec4<i32>(nm_q(c0, r, s), nm_q(c0 + 4u, r, s), nm_q(c0 + 8u, r, s), nm_q(c0 + 12u, r, s));
    nm_xq[e / 4u][e % 4u] = pack4xI8(q);
    return q.x + q.y + q.z + q.w;
}

fn nm_dot(w: vec4<u32>, k: u32) -> i32 {   // weight vec4 k against the row's int8 in nm_xq
    if (k >= mv_p.w4) { return 0; }
    return word_dot(w.x, nm_xq[4u * k]) + word_dot(w.y, nm_xq[4u * k + 1u])
         + word_dot(w.z, nm_xq[4u * k + 2u]) + word_dot(w.w, nm_xq[4u * k + 3u]);
}

// rmsnorm_quant's passes through these bindings (the same bits), the row's int8 into
// nm_xq: (s, sum of q); its last barriers publish nm_xq.
fn nm_norm(lid: u32) -> vec2<f32> {
    let C = mv_p.c;
    var acc = 0.0;
    for (var c = lid; c < C; c += 4u * MV_WG) {
        acc = sum_sq4(acc, vec4<f32>(nm_in_at(c), nm_in_at(c + MV_WG), nm_in_at(c + 2u * MV_WG), nm_in_at(c + 3u * MV_WG)));
    }
    let r = inverseSqrt(wg_sum(lid, acc, MV_WG) / f32(C) + mv_p.eps);
    var m = 0.0;
    for (var c = lid; c < C; c += 4u * MV_WG) {
        let y = abs(vec4<f32>(nm_y_at(c, r), nm_y_at(c + MV_WG, r), nm_y_at(c + 2u * MV_WG, r), nm_y_at(c + 3u * MV_WG, r)));
        m = max(m, max(max(y.x, y.y), max(y.z, y.w)));
    }
    let s = 127.0 / max(wg_max(lid, m, MV_WG), 1e-5);
    var qsum = 0;
    for (var e = lid; e < 4u * ((C + 15u) / 16u); e += 2u * MV_WG) {
        qsum += nm_put(e, r, s) + nm_put(e + MV_WG, r, s);
    }
    return vec2<f32>(s, wg_sum(lid, f32(qsum), MV_WG));
}

// rmsnorm_quant's passes, four columns (two packed words) a turn as there (the same
// bits), then the rows; a row block's weights four vec4 loads a turn, the first block's
// first turn issued before the norm (the weights do not depend on it).
@compute @workgroup_size(MV_WG)
fn norm_matvec(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
               @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % MV_TPR;
    let first = (wid.x + wid.y * nw.x) * NM_BATCH;   // the workgroup's first block of rows
    let at0 = mv_locate(first * (MV_WG / MV_TPR) + lid / MV_TPR);
    var p0 = mv_slot(at0, lane);
    var p1 = mv_slot(at0, lane + MV_TPR);
    var p2 = mv_slot(at0, lane + 2u * MV_TPR);
    var p3 = mv_slot(at0, lane + 3u * MV_TPR);
    let st = nm_norm(lid);   // (s, sum of q); its barriers publish nm_xq
    let s = st.x;
    let total = st.y;
    // ternary_matvec's rows, the activations from workgroup memory: NM_BATCH blocks of
    // MV_WG / MV_TPR rows, one after another (the norm above done once for all of them)
    for (var b = 0u; b < NM_BATCH; b++) {
        var at = at0;
        if (b > 0u) {
            at = mv_locate((first + b) * (MV_WG / MV_TPR) + lid / MV_TPR);
            p0 = mv_slot(at, lane);
            p1 = mv_slot(at, lane + MV_TPR);
            p2 = mv_slot(at, lane + 2u * MV_TPR);
            p3 = mv_slot(at, lane + 3u * MV_TPR);
        }
        var dot = nm_dot(p0, lane) + nm_dot(p1, lane + MV_TPR) + nm_dot(p2, lane + 2u * MV_TPR)
                + nm_dot(p3, lane + 3u * MV_TPR);
        for (var k = lane + 4u * MV_TPR; k < mv_p.w4; k += 4u * MV_TPR) {   // the rest, four loads a turn
            let v0 = mv_slot(at, k);
            let v1 = mv_slot(at, k + MV_TPR);
            let v2 = mv_slot(at, k + 2u * MV_TPR);
            let v3 = mv_slot(at, k + 3u * MV_TPR);
            dot += nm_dot(v0, k) + nm_dot(v1, k + MV_TPR) + nm_dot(v2, k + 2u * MV_TPR) + nm_dot(v3, k + 3u * MV_TPR);
        }
        mv_part[lid] = dot;
        workgroupBarrier();
        if (lane == 0u && at.x < 3u) {
            var sum = 0;
            for (var l = 0u; l < MV_TPR; l++) { sum += mv_part[lid + l]; }
            mv_put(at.x, at.y, mv_value(at.x, at.y, sum, s, total));
        }
        workgroupBarrier();   // mv_part is written again by the next block
    }
}

// ---------------------------------------------------------------------------- dense_matvec
override MV_BF16: bool = false;
struct DenseParams { c: u32, oc: u32, v0: u32, x0: u32 };
@group(0) @binding(0) var<uniform> dm_p: DenseParams;
@group(0) @binding(1) var<storage, read> dm_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> dm_w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> dm_y: array<f32>;
var<workgroup> dm_part: array<f32, MV_WG>;

fn bf16_pair(w: u32) -> vec2<f32> {   // the two bf16 of a u32, low half first
    return vec2<f32>(bitcast<f32>(w << 16u), bitcast<f32>(w & 0xffff0000u));
}

@compute @workgroup_size(MV_WG)
fn dense_matvec(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let lane = lid % MV_TPR;
    let o = (wid.x + wid.y * nw.x) * (MV_WG / MV_TPR) + lid / MV_TPR;
    let x0 = dm_p.x0 / 4u;
    var acc = 0.0;
    if (o < dm_p.oc) {
        if (MV_BF16) {
            let units = dm_p.c / 8u;
            for (var k = lane; k < units; k += MV_TPR) {
                let w = dm_w[o * units + k];
                acc += dot(dm_x[x0 + 2u * k], vec4<f32>(bf16_pair(w.x), bf16_pair(w.y)))
                     + dot(dm_x[x0 + 2u * k + 1u], vec4<f32>(bf16_pair(w.z), bf16_pair(w.w)));
            }
        } else {
            let units = dm_p.c / 4u;
            for (var k = lane; k < units; k += MV_TPR) {
                acc += dot(dm_x[x0 + k], bitcast<vec4<f32>>(dm_w[o * units + k]));
            }
        }
    }
    dm_part[lid] = acc;
    workgroupBarrier();
    if (lane == 0u && o < dm_p.oc) {
        var sum = 0.0;
        for (var l = 0u; l < MV_TPR; l++) { sum += dm_part[lid + l]; }
        dm_y[dm_p.v0 + o] = sum;
    }
}

@group(0) @binding(1) var<storage, read> dmr_x: array<f32>;
@group(0) @binding(2) var<storage, read> dmr_w: array<u32>;

@compute @workgroup_size(MV_ROWS)
fn dense_matvec_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let o = gid.x + gid.y * nw.x * MV_ROWS;
    if (o >= dm_p.oc) { return; }
    let C = dm_p.c;
    var acc = 0.0;
    for (var c = 0u; c < C; c++) {
        let e = o * C + c;
        var wv: f32;
        if (MV_BF16) { wv = bf16_at(dmr_w[e >> 1u], e); } else { wv = bitcast<f32>(dmr_w[e]); }
        acc += dmr_x[dm_p.x0 + c] * wv;
    }
    dm_y[dm_p.v0 + o] = acc;
}
