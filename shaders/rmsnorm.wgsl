// rmsnorm.wgsl — RMSNorm as HF BitNetRMSNorm computes it, in f32, and its input gradient:
//   rstd[n] = 1 / sqrt(mean_c x[n, c]^2 + eps),  y[n, c] = w[c] * (x[n, c] * rstd[n])
//   dx = rstd * (w*dy - x * rstd^2 * mean_c(w*dy*x))      (w is frozen: no weight gradient)
// Forward saves rstd[N] for the backward.
//
// rmsnorm_forward
//   0 params RmsParams {N, C, eps} | 1 x[N, C] read | 2 w[C] read | 3 y[N, C] write |
//   4 rstd[N] write
// rmsnorm_backward   accumulate = 1 adds into dx (the residual stream), 0 overwrites
//   0 params RmsBackwardParams {N, C, accumulate, (slices, scale, added: rmsnorm_backward_sum's)} |
//   1 dy[N, C] read | 2 x[N, C] read |
//   3 w[C] read | 4 rstd[N] read | 5 dx[N, C] read_write
// rmsnorm_quant_forward   rmsnorm_forward, then BitLinear's activation quantiser of its
//   output (bitlinear.wgsl actquant_forward) in the same dispatch, with the same bits: y,
//   rstd, and s[n] = 127 / max(max_c |y[n, c]|, 1e-5), xq = quant_i8(y * s) (prelude),
//   written as f32 [N, C] (packed = 0) or packed int8 (packed = 1: prelude xq8).
//   y is recomputed, not read back, for xq (the same two multiplies: the same value).
//   0 params RmsQuantParams {N, C, eps, packed} | 1 x[N, C] read | 2 w[C] read |
//   3 y[N, C] write | 4 rstd[N] write | 5 xq write (u32 words) | 6 s[N] write
// dispatch (all three): one workgroup (256) per row: N workgroups split over x, y
//
// CPU variants (Device.kind "cpu", C % 4 == 0): rmsnorm_forward_rows, rmsnorm_backward_rows
//   and rmsnorm_quant_forward_rows (below),
//   the same bindings seen as vec4 (rstd[N] stays scalar); four rows per invocation (each w
//   vec4 loaded once for four: SwiftShader 1.2x faster than one row), RR invocations per
//   workgroup: ceil(ceil(N/4) / RR) workgroups split over x, y. A CPU runs a workgroup as a
//   loop on one thread, SIMD across invocations, so a row's sum is a private vec4 and there
//   are no barriers. The sums are ordered differently from the GPU kernels' tree. Rows past
//   N-1 are clamped: the forward writes row N-1's values again, the backward its dx as it is.

struct RmsParams { n: u32, c: u32, eps: f32 };
@group(0) @binding(0) var<uniform> p: RmsParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> rstd: array<f32>;

// The GPU kernels' passes over a row go four columns a thread per turn, the loads issued
// together (a loop turn's reads are a memory latency, and a row's kernel is a chain of
// them: bench/latency_probe.py), thread lid still taking its columns lid + 256 j in order
// (so the same sums; the zeros past C add nothing).
fn rf_at(base: u32, c: u32) -> f32 {   // x[base + c], 0 past C
    if (c < p.c) { return x[base + c]; }
    return 0.0;
}

@compute @workgroup_size(WG)
fn rmsnorm_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= p.n) { return; }
    let base = n * p.c;
    var acc = 0.0;
    for (var c = lid; c < p.c; c += 4u * WG) {
        acc = sum_sq4(acc, vec4<f32>(rf_at(base, c), rf_at(base, c + WG), rf_at(base, c + 2u * WG), rf_at(base, c + 3u * WG)));
    }
    let r = inverseSqrt(wg_sum(lid, acc, WG) / f32(p.c) + p.eps);
    for (var c = lid; c < p.c; c += WG) { y[base + c] = w[c] * (x[base + c] * r); }
    if (lid == 0u) { rstd[n] = r; }
}

struct RmsQuantParams { n: u32, c: u32, eps: f32, packed: u32 };
@group(0) @binding(0) var<uniform> rq_p: RmsQuantParams;
@group(0) @binding(1) var<storage, read> rq_x: array<f32>;
@group(0) @binding(2) var<storage, read> rq_w: array<f32>;
@group(0) @binding(3) var<storage, read_write> rq_y: array<f32>;
@group(0) @binding(4) var<storage, read_write> rq_rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> rq_xq: array<u32>;   // f32 bits, or packed int8
@group(0) @binding(6) var<storage, read_write> rq_s: array<f32>;

fn rq_in(base: u32, c: u32) -> f32 {   // x[base + c], 0 past C
    if (c < rq_p.c) { return rq_x[base + c]; }
    return 0.0;
}

fn rq_y_at(base: u32, c: u32, r: f32) -> f32 {   // y of column c written (0 past C)
    if (c >= rq_p.c) { return 0.0; }
    let v = rq_w[c] * (rq_x[base + c] * r);
    rq_y[base + c] = v;
    return v;
}

fn rq_at(base: u32, c: u32, r: f32, s: f32) -> f32 {   // xq of column c of the row at base (0 past C)
    if (c >= rq_p.c) { return 0.0; }
    return quant_i8(rq_w[c] * (rq_x[base + c] * r), s);
}

@compute @workgroup_size(WG)
fn rmsnorm_quant_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= rq_p.n) { return; }
    let C = rq_p.c;
    let base = n * C;
    var acc = 0.0;
    for (var c = lid; c < C; c += 4u * WG) { acc = sum_sq4(acc, rq_x4(base, c)); }
    let r = inverseSqrt(wg_sum(lid, acc, WG) / f32(C) + rq_p.eps);
    var m = 0.0;
    for (var c = lid; c < C; c += 4u * WG) {
        let v = abs(vec4<f32>(rq_y_at(base, c, r), rq_y_at(base, c + WG, r), rq_y_at(base, c + 2u * WG, r),
                              rq_y_at(base, c + 3u * WG, r)));
        m = max(m, max4(v));
    }
    let s = 127.0 / max(wg_max(lid, m, WG), 1e-5);
    if (rq_p.packed != 0u) {
        let words = 4u * ((C + 15u) / 16u);
        for (var e = lid; e < words; e += WG) {
            let c = (e / 4u) * 16u + e % 4u;   // byte j: column c + 4j
            rq_xq[n * words + e] = pack_i8(vec4<f32>(rq_at(base, c, r, s), rq_at(base, c + 4u, r, s),
                                                     rq_at(base, c + 8u, r, s), rq_at(base, c + 12u, r, s)));
        }
    } else {
        for (var c = lid; c < C; c += WG) { rq_xq[base + c] = bitcast<u32>(rq_at(base, c, r, s)); }
    }
    if (lid == 0u) { rq_rstd[n] = r; rq_s[n] = s; }
}

// rmsnorm_quant_held   rmsnorm_quant_forward with packed = 1 and C <= 4 RQ_HELD WG, the same
//   bindings and bits: a thread loads its columns lid + WG j (x and w) once, all issued
//   together in straight-line code (named vec4s: an array indexed in a loop lives in memory
//   on NVIDIA's compiler), and keeps them for the three steps, where rmsnorm_quant_forward
//   reads them again in each (a chain of loop turns, each a memory latency). The int8
//   bytes are gathered into the packed words in workgroup memory (atomicOr) and written
//   after one barrier. Same sum order as rmsnorm_quant_forward (columns in turn, zeros past C).
//   dispatch: one workgroup (256) per row, as rmsnorm_quant_forward
const RQ_HELD: u32 = 9u;   // vec4s a thread holds: rows up to 9216 columns
var<workgroup> rq_pack: array<atomic<u32>, RQ_HELD * WG>;   // 4 ceil(C / 16) <= 4 RQ_HELD WG / 4 words

fn rq_w_at(c: u32) -> f32 {   // w[c], 0 past C
    if (c < rq_p.c) { return rq_w[c]; }
    return 0.0;
}

fn rq_x4(base: u32, c: u32) -> vec4<f32> {   // x at columns c + WG j, j < 4, of the row at base
    return vec4<f32>(rq_in(base, c), rq_in(base, c + WG), rq_in(base, c + 2u * WG), rq_in(base, c + 3u * WG));
}

fn rq_w4(c: u32) -> vec4<f32> {
    return vec4<f32>(rq_w_at(c), rq_w_at(c + WG), rq_w_at(c + 2u * WG), rq_w_at(c + 3u * WG));
}

fn rq_put(i: u32, c: u32, v: f32) { if (c < rq_p.c) { rq_y[i] = v; } }

fn rq_put4(base: u32, c: u32, y4: vec4<f32>) {   // y at columns c + WG j (where < C)
    rq_put(base + c, c, y4.x);
    rq_put(base + c + WG, c + WG, y4.y);
    rq_put(base + c + 2u * WG, c + 2u * WG, y4.z);
    rq_put(base + c + 3u * WG, c + 3u * WG, y4.w);
}

fn rq_or(c: u32, q: f32) {   // column c's int8 q into its byte of the packed row (prelude xq8)
    if (c < rq_p.c) {
        let r = c % 16u;
        atomicOr(&rq_pack[(c / 16u) * 4u + r % 4u], (bitcast<u32>(i32(q)) & 0xffu) << (8u * (r / 4u)));
    }
}

fn rq_or4(c: u32, y4: vec4<f32>, s: f32) {
    rq_or(c, quant_i8(y4.x, s));
    rq_or(c + WG, quant_i8(y4.y, s));
    rq_or(c + 2u * WG, quant_i8(y4.z, s));
    rq_or(c + 3u * WG, quant_i8(y4.w, s));
}

fn max4(v: vec4<f32>) -> f32 { return max(max(v.x, v.y), max(v.z, v.w)); }

@compute @workgroup_size(WG)
fn rmsnorm_quant_held(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                      @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= rq_p.n) { return; }
    let C = rq_p.c;
    let base = n * C;
    let words = 4u * ((C + 15u) / 16u);
    for (var e = lid; e < words; e += WG) { atomicStore(&rq_pack[e], 0u); }   // before wg_sum's barriers
    let t = 4u * WG;   // a vec4's columns: lid + t k + WG j
    let x0 = rq_x4(base, lid); let x1 = rq_x4(base, lid + t); let x2 = rq_x4(base, lid + 2u * t);
    let x3 = rq_x4(base, lid + 3u * t); let x4 = rq_x4(base, lid + 4u * t); let x5 = rq_x4(base, lid + 5u * t);
    let x6 = rq_x4(base, lid + 6u * t); let x7 = rq_x4(base, lid + 7u * t); let x8 = rq_x4(base, lid + 8u * t);
    let w0 = rq_w4(lid); let w1 = rq_w4(lid + t); let w2 = rq_w4(lid + 2u * t);
    let w3 = rq_w4(lid + 3u * t); let w4 = rq_w4(lid + 4u * t); let w5 = rq_w4(lid + 5u * t);
    let w6 = rq_w4(lid + 6u * t); let w7 = rq_w4(lid + 7u * t); let w8 = rq_w4(lid + 8u * t);
    var acc = sum_sq4(0.0, x0);
    acc = sum_sq4(acc, x1); acc = sum_sq4(acc, x2); acc = sum_sq4(acc, x3); acc = sum_sq4(acc, x4);
    acc = sum_sq4(acc, x5); acc = sum_sq4(acc, x6); acc = sum_sq4(acc, x7); acc = sum_sq4(acc, x8);
    let r = inverseSqrt(wg_sum(lid, acc, WG) / f32(C) + rq_p.eps);
    let y0 = w0 * (x0 * r); let y1 = w1 * (x1 * r); let y2 = w2 * (x2 * r);
    let y3 = w3 * (x3 * r); let y4 = w4 * (x4 * r); let y5 = w5 * (x5 * r);
    let y6 = w6 * (x6 * r); let y7 = w7 * (x7 * r); let y8 = w8 * (x8 * r);
    rq_put4(base, lid, y0); rq_put4(base, lid + t, y1); rq_put4(base, lid + 2u * t, y2);
    rq_put4(base, lid + 3u * t, y3); rq_put4(base, lid + 4u * t, y4); rq_put4(base, lid + 5u * t, y5);
    rq_put4(base, lid + 6u * t, y6); rq_put4(base, lid + 7u * t, y7); rq_put4(base, lid + 8u * t, y8);
    let m = max(max(max(max4(abs(y0)), max4(abs(y1))), max(max4(abs(y2)), max4(abs(y3)))),
                max(max(max4(abs(y4)), max4(abs(y5))), max(max(max4(abs(y6)), max4(abs(y7))), max4(abs(y8)))));
    let s = 127.0 / max(wg_max(lid, m, WG), 1e-5);
    rq_or4(lid, y0, s); rq_or4(lid + t, y1, s); rq_or4(lid + 2u * t, y2, s);
    rq_or4(lid + 3u * t, y3, s); rq_or4(lid + 4u * t, y4, s); rq_or4(lid + 5u * t, y5, s);
    rq_or4(lid + 6u * t, y6, s); rq_or4(lid + 7u * t, y7, s); rq_or4(lid + 8u * t, y8, s);
    workgroupBarrier();
    for (var e = lid; e < words; e += WG) { rq_xq[n * words + e] = atomicLoad(&rq_pack[e]); }
    if (lid == 0u) { rq_rstd[n] = r; rq_s[n] = s; }
}

struct RmsBackwardParams { n: u32, c: u32, accumulate: u32, slices: u32, scale: f32, added: u32 };
@group(0) @binding(0) var<uniform> rn_p: RmsBackwardParams;
@group(0) @binding(1) var<storage, read> rn_dy: array<f32>;
@group(0) @binding(2) var<storage, read> rn_x: array<f32>;
@group(0) @binding(3) var<storage, read> rn_w: array<f32>;
@group(0) @binding(4) var<storage, read> rn_rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> rn_dx: array<f32>;

// element i = (n, c): its term of the row's sum, and dx[i] (= or +=) its gradient
fn rn_term(i: u32, c: u32, dy: f32) -> f32 { return rn_w[c] * dy * rn_x[i]; }

fn rn_put(i: u32, c: u32, dy: f32, r: f32, k: f32) {
    let g = r * (rn_w[c] * dy - rn_x[i] * k);
    if (rn_p.accumulate != 0u) { rn_dx[i] = rn_dx[i] + g; } else { rn_dx[i] = g; }
}

@compute @workgroup_size(WG)
fn rmsnorm_backward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= rn_p.n) { return; }
    let C = rn_p.c;
    let base = n * C;
    var acc = 0.0;
    for (var c = lid; c < C; c += WG) { acc += rn_term(base + c, c, rn_dy[base + c]); }
    let r = rn_rstd[n];
    let k = r * r * wg_sum(lid, acc, WG) / f32(C);
    for (var c = lid; c < C; c += WG) { rn_put(base + c, c, rn_dy[base + c], r, k); }
}

// rmsnorm_backward_sum   rmsnorm_backward of dy = the split sums of the input gradient that
//   writes it (down_proj's, o_proj's) or, with added = 1, adds into it (up_proj's, after
//   gate_proj's), the reduce folded in: dy[n, c] (= or +=) (sum_z part[z, n, c]) * scale
//   (splitk_reduce's arithmetic, slices added in order: the same bits), written to dy as the
//   reduce would and read back by the same thread in the second pass.
//   0 params RmsBackwardParams {N, C, accumulate, slices, scale, added} | 1 dy[N, C] read_write |
//   2 x | 3 w | 4 rstd | 5 dx (as rmsnorm_backward) | 6 part[slices, N, C] read
//   dispatch: one workgroup (256) per row, as rmsnorm_backward
@group(0) @binding(1) var<storage, read_write> rd_dy: array<f32>;
@group(0) @binding(6) var<storage, read> rd_part: array<f32>;

@compute @workgroup_size(WG)
fn rmsnorm_backward_sum(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= rn_p.n) { return; }
    let C = rn_p.c;
    let base = n * C;
    let count = rn_p.n * C;
    var acc = 0.0;
    for (var c = lid; c < C; c += WG) {
        var d = 0.0;
        for (var z = 0u; z < rn_p.slices; z++) { d += rd_part[z * count + base + c]; }
        d = d * rn_p.scale;
        if (rn_p.added != 0u) { d = rd_dy[base + c] + d; }
        rd_dy[base + c] = d;
        acc += rn_term(base + c, c, d);
    }
    let r = rn_rstd[n];
    let k = r * r * wg_sum(lid, acc, WG) / f32(C);
    for (var c = lid; c < C; c += WG) { rn_put(base + c, c, rd_dy[base + c], r, k); }
}

// ---------------------------------------------------------------------------- CPU variants
const RR: u32 = 16u;  // rows (invocations) per workgroup

@group(0) @binding(0) var<uniform> rr_p: RmsParams;
@group(0) @binding(1) var<storage, read> rr_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> rr_w: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> rr_y: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> rr_rstd: array<f32>;

fn rr_rstd4(a: vec4<f32>) -> f32 { return inverseSqrt((a.x + a.y + a.z + a.w) / f32(rr_p.c) + rr_p.eps); }

@compute @workgroup_size(RR)
fn rmsnorm_forward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n0 = (gid.x + gid.y * nw.x * RR) * 4u;
    if (n0 >= rr_p.n) { return; }
    let C4 = rr_p.c / 4u;
    let m = rr_p.n - 1u;
    let n = vec4<u32>(n0, min(n0 + 1u, m), min(n0 + 2u, m), min(n0 + 3u, m));
    let b = n * C4;
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0); var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    for (var c = 0u; c < C4; c++) {
        let v0 = rr_x[b.x + c]; let v1 = rr_x[b.y + c]; let v2 = rr_x[b.z + c]; let v3 = rr_x[b.w + c];
        a0 += v0 * v0; a1 += v1 * v1; a2 += v2 * v2; a3 += v3 * v3;
    }
    let r = vec4<f32>(rr_rstd4(a0), rr_rstd4(a1), rr_rstd4(a2), rr_rstd4(a3));
    for (var c = 0u; c < C4; c++) {
        let w = rr_w[c];
        rr_y[b.x + c] = w * (rr_x[b.x + c] * r.x); rr_y[b.y + c] = w * (rr_x[b.y + c] * r.y);
        rr_y[b.z + c] = w * (rr_x[b.z + c] * r.z); rr_y[b.w + c] = w * (rr_x[b.w + c] * r.w);
    }
    rr_rstd[n.x] = r.x; rr_rstd[n.y] = r.y; rr_rstd[n.z] = r.z; rr_rstd[n.w] = r.w;
}

// rmsnorm_quant_forward_rows   rmsnorm_forward_rows, then actquant_forward_rows of its
//   output in the same dispatch (kind "cpu", C % 4 == 0): y, rstd, s and xq (f32 [N, C]) with
//   the same bits as the two kernels (the max is exact; y is recomputed for xq from x, r
//   and w with the same two multiplies, not read back). Bindings as rmsnorm_quant_forward
//   (packed unused), seen as vec4 (rstd[N], s[N] stay scalar); rows as rmsnorm_forward_rows.
//   One dispatch and one pass over y fewer: SwiftShader and lavapipe ~1.3x faster than the two.
@group(0) @binding(0) var<uniform> rk_p: RmsQuantParams;
@group(0) @binding(1) var<storage, read> rk_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> rk_w: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> rk_y: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> rk_rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> rk_xq: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> rk_s: array<f32>;

fn rk_rstd4(a: vec4<f32>) -> f32 { return inverseSqrt((a.x + a.y + a.z + a.w) / f32(rk_p.c) + rk_p.eps); }
fn rk_s4(m: vec4<f32>) -> f32 { return 127.0 / max(max(max(m.x, m.y), max(m.z, m.w)), 1e-5); }   // as actquant_forward_rows
fn rk_q(v: vec4<f32>, s: f32) -> vec4<f32> { return clamp(round(v * s), vec4<f32>(-128.0), vec4<f32>(127.0)); }

@compute @workgroup_size(RR)
fn rmsnorm_quant_forward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n0 = (gid.x + gid.y * nw.x * RR) * 4u;
    if (n0 >= rk_p.n) { return; }
    let C4 = rk_p.c / 4u;
    let m = rk_p.n - 1u;
    let n = vec4<u32>(n0, min(n0 + 1u, m), min(n0 + 2u, m), min(n0 + 3u, m));
    let b = n * C4;
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0); var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    for (var c = 0u; c < C4; c++) {
        let v0 = rk_x[b.x + c]; let v1 = rk_x[b.y + c]; let v2 = rk_x[b.z + c]; let v3 = rk_x[b.w + c];
        a0 += v0 * v0; a1 += v1 * v1; a2 += v2 * v2; a3 += v3 * v3;
    }
    let r = vec4<f32>(rk_rstd4(a0), rk_rstd4(a1), rk_rstd4(a2), rk_rstd4(a3));
    var m0 = vec4<f32>(0.0); var m1 = vec4<f32>(0.0); var m2 = vec4<f32>(0.0); var m3 = vec4<f32>(0.0);
    for (var c = 0u; c < C4; c++) {
        let w = rk_w[c];
        let y0 = w * (rk_x[b.x + c] * r.x); let y1 = w * (rk_x[b.y + c] * r.y);
        let y2 = w * (rk_x[b.z + c] * r.z); let y3 = w * (rk_x[b.w + c] * r.w);
        rk_y[b.x + c] = y0; rk_y[b.y + c] = y1; rk_y[b.z + c] = y2; rk_y[b.w + c] = y3;
        m0 = max(m0, abs(y0)); m1 = max(m1, abs(y1)); m2 = max(m2, abs(y2)); m3 = max(m3, abs(y3));
    }
    let s = vec4<f32>(rk_s4(m0), rk_s4(m1), rk_s4(m2), rk_s4(m3));
    for (var c = 0u; c < C4; c++) {
        let w = rk_w[c];
        rk_xq[b.x + c] = rk_q(w * (rk_x[b.x + c] * r.x), s.x); rk_xq[b.y + c] = rk_q(w * (rk_x[b.y + c] * r.y), s.y);
        rk_xq[b.z + c] = rk_q(w * (rk_x[b.z + c] * r.z), s.z); rk_xq[b.w + c] = rk_q(w * (rk_x[b.w + c] * r.w), s.w);
    }
    rk_rstd[n.x] = r.x; rk_rstd[n.y] = r.y; rk_rstd[n.z] = r.z; rk_rstd[n.w] = r.w;
    rk_s[n.x] = s.x; rk_s[n.y] = s.y; rk_s[n.z] = s.z; rk_s[n.w] = s.w;
}

@group(0) @binding(0) var<uniform> rb_p: RmsBackwardParams;
@group(0) @binding(1) var<storage, read> rb_dy: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> rb_x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> rb_w: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> rb_rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> rb_dx: array<vec4<f32>>;

fn rb_put(i: u32, g: vec4<f32>, ok: bool) {   // dx (= or +=) g where ok, no branch: see bitlinear.wgsl cm_put
    let d = rb_dx[i];   // a row past N-1 repeats row N-1 (this invocation's): its value is written back
    rb_dx[i] = select(d, select(g, d + g, rb_p.accumulate != 0u), ok);
}

@compute @workgroup_size(RR)
fn rmsnorm_backward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let n0 = (gid.x + gid.y * nw.x * RR) * 4u;
    if (n0 >= rb_p.n) { return; }
    let C4 = rb_p.c / 4u;
    let m = rb_p.n - 1u;
    let n = vec4<u32>(n0, min(n0 + 1u, m), min(n0 + 2u, m), min(n0 + 3u, m));
    let b = n * C4;
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0); var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    for (var c = 0u; c < C4; c++) {
        let w = rb_w[c];
        a0 += w * rb_dy[b.x + c] * rb_x[b.x + c]; a1 += w * rb_dy[b.y + c] * rb_x[b.y + c];
        a2 += w * rb_dy[b.z + c] * rb_x[b.z + c]; a3 += w * rb_dy[b.w + c] * rb_x[b.w + c];
    }
    let r = vec4<f32>(rb_rstd[n.x], rb_rstd[n.y], rb_rstd[n.z], rb_rstd[n.w]);
    let k = r * r * vec4<f32>(a0.x + a0.y + a0.z + a0.w, a1.x + a1.y + a1.z + a1.w,
                              a2.x + a2.y + a2.z + a2.w, a3.x + a3.y + a3.z + a3.w) / f32(rb_p.c);
    let ok = vec3<bool>(n0 + 1u <= m, n0 + 2u <= m, n0 + 3u <= m);   // rows past N-1 are not stored
    for (var c = 0u; c < C4; c++) {
        let w = rb_w[c];
        rb_put(b.x + c, r.x * (w * rb_dy[b.x + c] - rb_x[b.x + c] * k.x), true);
        rb_put(b.y + c, r.y * (w * rb_dy[b.y + c] - rb_x[b.y + c] * k.y), ok.x);
        rb_put(b.z + c, r.z * (w * rb_dy[b.z + c] - rb_x[b.z + c] * k.z), ok.y);
        rb_put(b.w + c, r.w * (w * rb_dy[b.w + c] - rb_x[b.w + c] * k.w), ok.z);
    }
}
