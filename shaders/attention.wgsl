// attention.wgsl — causal softmax attention with GQA: the forward over a KV cache,
// the store of new k, v rows into that cache, and the backward (dq; dk, dv).
// Query head h reads KV head h / (H/Hkv) (HF repeat_kv).
//   s_j = scale * q . k_j,  P = softmax(s),  out = sum_j P_j v_j   (f32, online softmax)
//
// attention_forward   query row n = b*T + t (token t of sequence b, at position
//   pos = pos0 + t) attends to cache positions 0..pos of sequence b. The new tokens'
//   k, v must already be in the cache (kv_store); for a whole sequence at once pos0 = 0
//   and S may equal T. lse[n, h] = log sum_j exp(s_j) is saved. pos0 is the uniform's
//   plus kv_pos[0], the cache's length kept on the GPU (kv_advance below): a decoding
//   step's dispatches are then the same at every position (recorded once, replayed).
//   0 params AttentionParams {B, T, H, Hkv, D, S, pos0, scale} | 1 q[N, H*D] read (post-RoPE) |
//   2 k_cache[B, S, Hkv*D] read | 3 v_cache[B, S, Hkv*D] read | 4 out[N, H*D] write |
//   5 lse[N, H] write | 6 kv_pos[1] u32 read | 7 k_cache again, as vec4s (where D % 4 == 0:
//   a key row's 16-byte words; else any buffer of 16 bytes or more, unread; attention_forward only)
//   dispatch: one workgroup (64) per (n, h): N*H workgroups split over x, y. D <= 256.
//
// kv_advance   kv_pos[0] += T: the cache grew by this forward's T tokens (one invocation).
//   0 params KvAdvanceParams {T} | 1 kv_pos[1] u32 read_write
//   Keys go 64 at a time: one score per thread, then every thread updates its
//   (up to 4) output dims with the chunk's probabilities from workgroup memory.
//   (Decoding, T = 1; whole sequences and prompts take attention_forward_q32 where
//   D % 4 == 0 and D <= 128, else attention_forward_tiled: same bindings, blocks of 32 or
//   8 query rows, after the backward below.)
//
// kv_store   k_cache[b, pos0 + t, :] = k[b*T + t, :], same for v (a kernel, not buffer
//   copies: all of a forward stays one compute pass)
//   0 params KvStoreParams {B, T, S, W = Hkv*D, pos0} | 1 k[N, W] read | 2 v[N, W] read |
//   3 k_cache[B, S, W] write | 4 v_cache[B, S, W] write
//   dispatch: ceil(N*W / 256) workgroups split over x, y
//
// attention_backward_dq, attention_backward_dkv   all positions of all sequences at
//   once, from post-RoPE q[N, H*D], k[N, Hkv*D], v[N, Hkv*D] and dout[N, H*D]. Nothing
//   from the forward is needed: the softmax is recomputed
//   (P[i, j] = exp(s[i, j] - lse[i]), s = scale * q_i . k_j, j <= i).
//     dP = dout_i . v_j,   Dsum_i = sum_j P dP,   dS = P (dP - Dsum_i)
//     dq_i = scale * sum_j dS k_j,   dk_j = scale * sum_{h in group, i >= j} dS q_i,
//     dv_j = sum_{h in group, i >= j} P dout_i
//   Pass 1 (dq) also writes stats[N, H, 2] = (lse, Dsum) for pass 2.
//   Padding: sequences are right-padded; causal masking alone keeps every valid row
//   exact, and a padded row gets no gradient when its dout is zero (masked loss).
//   D <= 256.
//   attention_backward_dq:
//     0 params AttentionBackwardParams {B, T, H, Hkv, D, scale} | 1 dout[N, H*D] read |
//     2 q read | 3 k read | 4 v read | 5 dq[N, H*D] write | 6 stats[N, H, 2] write
//     dispatch: one workgroup (256) per (sequence, block of 8 query rows, h):
//     B*ceil(T/8)*H workgroups split over x, y. Two sweeps over the key blocks up to
//     the diagonal: (lse, Dsum) by an online softmax, then dS and dq.
//   attention_backward_dqs: attention_backward_dq given the forward's 7 out[N, H*D] read
//     and 8 lse[N, H] read (of the same q, k, v and scale): (lse, Dsum = dout_i . out_i)
//     per row, one sweep over the key blocks; the same stats.
//   attention_backward_dkv:
//     0 params (same) | 1 dout read | 2 q read | 3 k read | 4 v read |
//     5 stats[N, H, 2] read | 6 dk[N, Hkv*D] write | 7 dv[N, Hkv*D] write
//     dispatch: one workgroup (256) per (sequence, block of 8 keys, kv head):
//     B*ceil(T/8)*Hkv workgroups split over x, y; it sweeps the group's heads and the
//     query blocks from the diagonal on.
//   Where D % 4 == 0 and D <= 128 GPUs take 32 x 32 tiles instead (dqs_q32, dkv_q32, below
//   the tiled forward; the same stats contract).
//
// CPU variants (Device.kind "cpu", D % 4 == 0; ops/attention.py picks them): the same
// bindings, outputs and stats (either dq kernel feeds either dkv kernel), with the
// q, k, v, dout, out, dq, dk, dv bindings typed array<vec4<f32>> (rows of D/4 vec4s).
// One invocation per output row, online softmax, no barriers, no workgroup memory.
//   attention_forward_rows   invocation g = n*H + h: ceil(N*H / 16) workgroups (16)
//   attention_backward_dq_rows   invocation g = n*H + h (query row n): ceil(N*H / 16)
//     workgroups (16); two sweeps over keys 0..t: (lse, Dsum), then dS and dq.
//   attention_backward_dkv_rows   invocation g = n*Hkv + kv head (key row n):
//     ceil(N*Hkv / 16) workgroups (16); sweeps the group's heads and queries t..T-1.
//   Workgroups split over x, y (g = gid.x + gid.y * nw.x * 16).
//   Where D <= 32 the *_d32 kernels (below) replace them: 4 rows per invocation, a row's
//   dims in registers.

const WF: u32 = 64u;   // attention_forward's workgroup size
struct AttentionParams { b: u32, t: u32, h: u32, hkv: u32, d: u32, s: u32, pos0: u32, scale: f32 };
@group(0) @binding(0) var<uniform> af_p: AttentionParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<f32>;
@group(0) @binding(3) var<storage, read> vc: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;
@group(0) @binding(6) var<storage, read> kv_pos: array<u32>;   // every attention_forward variant
@group(0) @binding(7) var<storage, read> kc4: array<vec4<f32>>;   // attention_forward: k_cache again (D % 4 == 0)
var<workgroup> q_sh: array<f32, 256>;
var<workgroup> p_sh: array<f32, WF>;

@compute @workgroup_size(WF)
fn attention_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nw: vec3<u32>) {
    let p = af_p;
    let lid = lid3.x;
    let g = wid.x + wid.y * nw.x;
    let N = p.b * p.t;
    if (g >= N * p.h) { return; }   // uniform per workgroup
    let n = g / p.h;
    let h = g % p.h;
    let b = n / p.t;
    let pos = p.pos0 + kv_pos[0] + n % p.t;
    let kvh = h / (p.h / p.hkv);
    let D = p.d;
    let W = p.hkv * D;
    for (var d = lid; d < D; d += WF) { q_sh[d] = q[n * p.h * D + h * D + d]; }
    workgroupBarrier();
    var m = NEG_BIG;
    var l = 0.0;
    var acc = vec4<f32>(0.0);   // dims lid + 64e: a vector, not a loop-indexed array (NVIDIA)
    let nkeys = pos + 1u;
    for (var j0 = 0u; j0 < nkeys; j0 += WF) {
        let j = j0 + lid;
        var sc = NEG_BIG;
        if (j < nkeys) {
            let kb = (b * p.s + j) * W + kvh * D;
            var dot = 0.0;
            var d = 0u;
            if (D % 4u == 0u) {   // the row's 16-byte words, eight in flight, added in order
                for (; d + 31u < D; d += 32u) {
                    let k0 = kc4[(kb + d) / 4u];
                    let k1 = kc4[(kb + d) / 4u + 1u];
                    let k2 = kc4[(kb + d) / 4u + 2u];
                    let k3 = kc4[(kb + d) / 4u + 3u];
                    let k4 = kc4[(kb + d) / 4u + 4u];
                    let k5 = kc4[(kb + d) / 4u + 5u];
                    let k6 = kc4[(kb + d) / 4u + 6u];
                    let k7 = kc4[(kb + d) / 4u + 7u];
                    dot = af_dot4(dot, d, k0);
                    dot = af_dot4(dot, d + 4u, k1);
                    dot = af_dot4(dot, d + 8u, k2);
                    dot = af_dot4(dot, d + 12u, k3);
                    dot = af_dot4(dot, d + 16u, k4);
                    dot = af_dot4(dot, d + 20u, k5);
                    dot = af_dot4(dot, d + 24u, k6);
                    dot = af_dot4(dot, d + 28u, k7);
                }
                for (; d < D; d += 4u) { dot = af_dot4(dot, d, kc4[(kb + d) / 4u]); }
            }
            for (; d + 7u < D; d += 8u) {   // eight loads in flight, added in order
                let k0 = kc[kb + d];
                let k1 = kc[kb + d + 1u];
                let k2 = kc[kb + d + 2u];
                let k3 = kc[kb + d + 3u];
                let k4 = kc[kb + d + 4u];
                let k5 = kc[kb + d + 5u];
                let k6 = kc[kb + d + 6u];
                let k7 = kc[kb + d + 7u];
                dot += q_sh[d] * k0;
                dot += q_sh[d + 1u] * k1;
                dot += q_sh[d + 2u] * k2;
                dot += q_sh[d + 3u] * k3;
                dot += q_sh[d + 4u] * k4;
                dot += q_sh[d + 5u] * k5;
                dot += q_sh[d + 6u] * k6;
                dot += q_sh[d + 7u] * k7;
            }
            for (; d < D; d++) { dot += q_sh[d] * kc[kb + d]; }
            sc = dot * p.scale;
        }
        let m_new = max(m, wg_max(lid, sc, WF));
        var pj = 0.0;
        if (j < nkeys) { pj = exp(sc - m_new); }
        p_sh[lid] = pj;
        let psum = wg_sum(lid, pj, WF);
        let corr = exp(m - m_new);
        l = l * corr + psum;
        m = m_new;
        let jend = min(WF, nkeys - j0);
        acc *= corr;
        let d0 = min(lid, D - 1u);
        let d1 = min(lid + WF, D - 1u);
        let d2 = min(lid + 2u * WF, D - 1u);
        let d3 = min(lid + 3u * WF, D - 1u);
        let dd = vec4<u32>(d0, d1, d2, d3);
        let vb0 = (b * p.s + j0) * W + kvh * D;
        var jj = 0u;
        for (; jj + 7u < jend; jj += 8u) {   // eight keys' loads in flight, added in key order
            let v0 = af_v(vb0 + jj * W, dd, D);
            let v1 = af_v(vb0 + (jj + 1u) * W, dd, D);
            let v2 = af_v(vb0 + (jj + 2u) * W, dd, D);
            let v3 = af_v(vb0 + (jj + 3u) * W, dd, D);
            let v4 = af_v(vb0 + (jj + 4u) * W, dd, D);
            let v5 = af_v(vb0 + (jj + 5u) * W, dd, D);
            let v6 = af_v(vb0 + (jj + 6u) * W, dd, D);
            let v7 = af_v(vb0 + (jj + 7u) * W, dd, D);
            acc += p_sh[jj] * v0;
            acc += p_sh[jj + 1u] * v1;
            acc += p_sh[jj + 2u] * v2;
            acc += p_sh[jj + 3u] * v3;
            acc += p_sh[jj + 4u] * v4;
            acc += p_sh[jj + 5u] * v5;
            acc += p_sh[jj + 6u] * v6;
            acc += p_sh[jj + 7u] * v7;
        }
        for (; jj < jend; jj++) { acc += p_sh[jj] * af_v(vb0 + jj * W, dd, D); }
        workgroupBarrier();
    }
    for (var e = 0u; e < 4u; e++) {
        let d = lid + e * WF;
        if (d < D) { out[n * p.h * D + h * D + d] = acc[e] / l; }
    }
    if (lid == 0u) { lse[n * p.h + h] = m + log(l); }
}

fn af_dot4(acc: f32, d: u32, k: vec4<f32>) -> f32 {   // acc + q dims d..d+3 . k, added in order
    var a = acc;
    a += q_sh[d] * k.x;
    a += q_sh[d + 1u] * k.y;
    a += q_sh[d + 2u] * k.z;
    a += q_sh[d + 3u] * k.w;
    return a;
}

fn af_v(vb: u32, d: vec4<u32>, D: u32) -> vec4<f32> {   // v's dims d of the row at vb (those D has)
    var v = vec4<f32>(vc[vb + d.x], 0.0, 0.0, 0.0);
    if (D > WF) { v.y = vc[vb + d.y]; }
    if (D > 2u * WF) {
        v.z = vc[vb + d.z];
        v.w = vc[vb + d.w];
    }
    return v;
}

struct KvAdvanceParams { t: u32 };
@group(0) @binding(0) var<uniform> adv_p: KvAdvanceParams;
@group(0) @binding(1) var<storage, read_write> adv_pos: array<u32>;

@compute @workgroup_size(1)
fn kv_advance() {
    adv_pos[0] += adv_p.t;
}

struct KvStoreParams { b: u32, t: u32, s: u32, w: u32, pos0: u32 };
@group(0) @binding(0) var<uniform> sp: KvStoreParams;
@group(0) @binding(1) var<storage, read> st_k: array<f32>;
@group(0) @binding(2) var<storage, read> st_v: array<f32>;
@group(0) @binding(3) var<storage, read_write> st_kc: array<f32>;
@group(0) @binding(4) var<storage, read_write> st_vc: array<f32>;

@compute @workgroup_size(256)
fn kv_store(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wid.x + wid.y * nw.x) * 256u + lid.x;
    if (i >= sp.b * sp.t * sp.w) { return; }
    let n = i / sp.w;
    let c = i % sp.w;
    let dst = ((n / sp.t) * sp.s + sp.pos0 + n % sp.t) * sp.w + c;
    st_kc[dst] = st_k[i];
    st_vc[dst] = st_v[i];
}

// ---------------------------------------------------------------------------- backward
// Tiles of AO owned rows (queries for dq, keys for dkv) x AS streamed rows: thread
// (o, s) = (lid / AS, lid % AS) computes one s and dP over 32-dim chunks of q, dout,
// k, v staged in workgroup memory (rows padded to 9 vec4s against bank conflicts);
// then P / dS of the tile go through workgroup memory and thread (o, s) updates owned
// row o: in dq its dims 4s + 128e .. +3 (e < 2; vec4 sums in named variables, k rows read
// from global memory), in dkv its dims 32k + s (k < 8), each chunk of the streamed q and
// dout rows staged again (the sums over the streamed rows in the same order either way).
// Few owned rows keep the longest workgroup short (the causal triangle makes the work uneven).
struct AttentionBackwardParams { b: u32, t: u32, h: u32, hkv: u32, d: u32, scale: f32 };
const AO: u32 = 8u;           // owned rows per workgroup
const AS: u32 = 32u;          // streamed rows per tile (AO * AS = 256 threads)
const AC: u32 = 32u;          // head dims per staged chunk (at_put, at_fetch and af_fetch take these
                              // three: 4 streamed elements a thread, rows lid / AC + 8 t)
const AP: u32 = 9u;           // vec4s per staged row (AC / 4 + 1 pad)
var<workgroup> at_oa: array<vec4<f32>, 72>;    // [AO, AP] owned rows: q (dq) or k (dkv)
var<workgroup> at_ob: array<vec4<f32>, 72>;    //   dout (dq) or v (dkv)
var<workgroup> at_sa: array<vec4<f32>, 288>;   // [AS, AP] streamed rows: k (dq) or q (dkv)
var<workgroup> at_sb: array<vec4<f32>, 288>;   //   v (dq) or dout (dkv)
var<workgroup> at_p: array<f32, 256>;          // [AO, AS] P, or scratch
var<workgroup> at_ds: array<f32, 256>;         // dS, or scratch
var<workgroup> at_x: array<f32, 256>;          // scratch
var<workgroup> at_row: array<f32, 16>;         // lse, Dsum of the block's query rows (dq)

fn at_stage(e: u32, x: f32, dst: u32) {   // element e of a staged [rows, AC] chunk
    let i = (e / AC) * AP + (e % AC) / 4u;
    let c = e % 4u;
    if (dst == 0u) { at_oa[i][c] = x; } else if (dst == 1u) { at_ob[i][c] = x; }
    else if (dst == 2u) { at_sa[i][c] = x; } else { at_sb[i][c] = x; }
}

fn at_dots(o: u32, s: u32) -> vec2<f32> {   // (oa . sa, ob . sb) over the staged chunk
    var x = 0.0;
    var y = 0.0;
    for (var c = 0u; c < AC / 4u; c++) {
        x += dot(at_oa[o * AP + c], at_sa[s * AP + c]);
        y += dot(at_ob[o * AP + c], at_sb[s * AP + c]);
    }
    return vec2<f32>(x, y);
}

// A thread's share of one staged chunk: element lid + 256 t (t < 4) of the streamed rows'
// [AS, AC] chunk (rows lid / AC + 8 t, dim lid % AC) of both streamed arrays, element lid of
// the owned rows' [AO, AC] chunk of both owned arrays. Loaded into registers a chunk ahead
// (the kernels' chunks are each a memory latency otherwise), then staged by at_put.
struct AtChunk { sa: vec4<f32>, sb: vec4<f32>, oa: f32, ob: f32 };

// both: the second arrays too (sb, and ob where owned); owned: the owned rows too (oa, ob)
fn at_put(ch: AtChunk, lid: u32, both: bool, owned: bool) {
    at_stage(lid, ch.sa.x, 2u);
    at_stage(lid + 256u, ch.sa.y, 2u);
    at_stage(lid + 512u, ch.sa.z, 2u);
    at_stage(lid + 768u, ch.sa.w, 2u);
    if (owned) { at_stage(lid, ch.oa, 0u); }
    if (both) {
        at_stage(lid, ch.sb.x, 3u);
        at_stage(lid + 256u, ch.sb.y, 3u);
        at_stage(lid + 512u, ch.sb.z, 3u);
        at_stage(lid + 768u, ch.sb.w, 3u);
        if (owned) { at_stage(lid, ch.ob, 1u); }
    }
}

// Bindings 0-4 of both backward kernels (dq, dqs and dkv); the rest are each kernel's own.
@group(0) @binding(0) var<uniform> ab_p: AttentionBackwardParams;
@group(0) @binding(1) var<storage, read> ab_do: array<f32>;
@group(0) @binding(2) var<storage, read> ab_q: array<f32>;
@group(0) @binding(3) var<storage, read> ab_k: array<f32>;
@group(0) @binding(4) var<storage, read> ab_v: array<f32>;
@group(0) @binding(5) var<storage, read_write> aq_dq: array<f32>;    // dq's and dqs' own
@group(0) @binding(6) var<storage, read_write> aq_stats: array<f32>;

// Thread (o, s)'s (owned . streamed) over the staged chunks of both pairs: in dq (kvs: k, v
// streamed) (q_i . k_j, dout_i . v_j) for query i = i0 + o, key j = j0 + s; in dkv (q, dout
// streamed) (k_j . q_i, v_j . dout_i) for key j = j0 + o, query i = i0 + s.
// qo, ko: offsets of the q / k tiles' first rows; nq, nk: their valid rows (others read 0)
fn at_scores(kvs: bool, qo: u32, qs: u32, nq: u32, ko: u32, ks: u32, nk: u32, D: u32, lid: u32) -> vec2<f32> {
    var sd = vec2<f32>(0.0);
    var ch = at_fetch(kvs, true, qo, qs, nq, ko, ks, nk, 0u, D, lid);
    for (var d0 = 0u; d0 < D; d0 += AC) {
        workgroupBarrier();   // the previous chunk (and tile) has been read
        at_put(ch, lid, true, true);
        workgroupBarrier();
        if (d0 + AC < D) { ch = at_fetch(kvs, true, qo, qs, nq, ko, ks, nk, d0 + AC, D, lid); }
        sd += at_dots(lid / AS, lid % AS);
    }
    return sd;
}

fn ab_kv(ko: u32, ks: u32, nk: u32, r: u32, d: u32) -> vec2<f32> {   // (k, v) of row r, dim d (0 past nk)
    if (r < nk) { return vec2<f32>(ab_k[ko + r * ks + d], ab_v[ko + r * ks + d]); }
    return vec2<f32>(0.0);
}

fn ab_qd(qo: u32, qs: u32, nq: u32, r: u32, d: u32) -> vec2<f32> {   // (q, dout) of row r, dim d (0 past nq)
    if (r < nq) { return vec2<f32>(ab_q[qo + r * qs + d], ab_do[qo + r * qs + d]); }
    return vec2<f32>(0.0);
}

// A thread's share of chunk d0.. (AtChunk): k, v streamed and q, dout owned where kvs (dq),
// the other way round otherwise (dkv); the owned rows only where `owned` (else 0)
fn at_fetch(kvs: bool, owned: bool, qo: u32, qs: u32, nq: u32, ko: u32, ks: u32, nk: u32, d0: u32, D: u32,
            lid: u32) -> AtChunk {
    let r = lid / AC;
    let d = d0 + lid % AC;
    if (d >= D) { return AtChunk(vec4<f32>(0.0), vec4<f32>(0.0), 0.0, 0.0); }
    var a: vec2<f32>;
    var b: vec2<f32>;
    var c: vec2<f32>;
    var e: vec2<f32>;
    var own = vec2<f32>(0.0);
    if (kvs) {
        a = ab_kv(ko, ks, nk, r, d);
        b = ab_kv(ko, ks, nk, r + 8u, d);
        c = ab_kv(ko, ks, nk, r + 16u, d);
        e = ab_kv(ko, ks, nk, r + 24u, d);
        if (owned) { own = ab_qd(qo, qs, nq, r, d); }
    } else {
        a = ab_qd(qo, qs, nq, r, d);
        b = ab_qd(qo, qs, nq, r + 8u, d);
        c = ab_qd(qo, qs, nq, r + 16u, d);
        e = ab_qd(qo, qs, nq, r + 24u, d);
        if (owned) { own = ab_kv(ko, ks, nk, r, d); }
    }
    return AtChunk(vec4<f32>(a.x, b.x, c.x, e.x), vec4<f32>(a.y, b.y, c.y, e.y), own.x, own.y);
}

// The block of `rows` rows (of T a sequence, nb sequences) and the head (of `heads`) that
// workgroup wid takes, wid.x + wid.y * nw.x = (b * blocks + block) * heads + head:
// (head, b, its first row in the sequence, its rows); head = heads when out of range.
// last_first: the sequence's last block first (a causal query block's work grows with it).
fn row_block(wid: vec3<u32>, nw: vec3<u32>, nb: u32, T: u32, heads: u32, rows: u32, last_first: bool) -> vec4<u32> {
    let blocks = (T + rows - 1u) / rows;
    let k = wid.x + wid.y * nw.x;
    if (k >= nb * blocks * heads) { return vec4<u32>(heads, 0u, 0u, 0u); }
    let bq = k / heads;
    let i0 = select(bq % blocks, blocks - 1u - bq % blocks, last_first) * rows;
    return vec4<u32>(k % heads, bq / blocks, i0, min(rows, T - i0));
}

// The dq kernels' block of workgroup wid: (h, i0 = its first query row, first = the row of
// its sequence's position 0, nq = its rows); x = H when out of range
fn aq_block(wid: vec3<u32>, nw: vec3<u32>) -> vec4<u32> {
    let blk = row_block(wid, nw, ab_p.b, ab_p.t, ab_p.h, AO, true);
    return vec4<u32>(blk.x, blk.z, blk.y * ab_p.t, blk.w);
}

@compute @workgroup_size(AO * AS)
fn attention_backward_dq(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ab_p;
    let blk = aq_block(wid, nw);
    if (blk.x >= p.h) { return; }
    let h = blk.x;
    let i0 = blk.y;
    let first = blk.z;
    let nq = blk.w;
    let D = p.d;
    let HD = p.h * D;
    let KD = p.hkv * D;
    let g = h / (p.h / p.hkv);
    let qo = (first + i0) * HD + h * D;
    let s = lid % AS;
    let i = i0 + lid / AS;
    let nkb = (i0 + nq + AS - 1u) / AS;   // key blocks up to the last row's diagonal

    // sweep 1: per thread an online (max m, sum l, sum u of P dP) over its keys
    var m = NEG_BIG;
    var l = 0.0;
    var u = 0.0;
    for (var kb = 0u; kb < nkb; kb++) {
        let j0 = kb * AS;
        let sd = at_scores(true, qo, HD, nq, (first + j0) * KD + g * D, KD, min(AS, p.t - j0), D, lid);
        if (j0 + s <= i && i < p.t) {
            let sc = p.scale * sd.x;
            if (sc > m) { let c = exp(m - sc); l = l * c + 1.0; u = u * c + sd.y; m = sc; }
            else { let e = exp(sc - m); l += e; u += e * sd.y; }
        }
    }
    at_p[lid] = m;
    at_ds[lid] = l;
    at_x[lid] = u;
    workgroupBarrier();
    if (s == 0u) {   // combine row o's partials: lse = M + log L, Dsum = U / L
        var mm = NEG_BIG;
        for (var c = 0u; c < AS; c++) { mm = max(mm, at_p[lid + c]); }
        var ll = 0.0;
        var uu = 0.0;
        for (var c = 0u; c < AS; c++) {
            let f = exp(at_p[lid + c] - mm);
            ll += at_ds[lid + c] * f;
            uu += at_x[lid + c] * f;
        }
        at_row[lid / AS] = mm + log(max(ll, 1e-30));
        at_row[AO + lid / AS] = uu / max(ll, 1e-30);
    }
    workgroupBarrier();
    aq_dq_sweep(h, i0, first, nq, lid);
}

// attention_backward_dqs: attention_backward_dq with the forward's saved out (binding 7,
// out[N, H*D] read) and lse (binding 8, lse[N, H] read), of the same q, k, v and scale:
// (lse, Dsum = dout_i . out_i) per row instead of a first sweep over the keys.
@group(0) @binding(7) var<storage, read> aq_out: array<f32>;
@group(0) @binding(8) var<storage, read> aq_lse: array<f32>;

@compute @workgroup_size(AO * AS)
fn attention_backward_dqs(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ab_p;
    let blk = aq_block(wid, nw);
    if (blk.x >= p.h) { return; }
    let o = lid / AS;
    let s = lid % AS;
    let i = blk.y + o;
    var u = 0.0;   // dims s, s + AS, ... of row o's dout . out
    if (o < blk.w) {
        let r = (blk.z + i) * p.h * p.d + blk.x * p.d;
        for (var d = s; d < p.d; d += AS) { u += ab_do[r + d] * aq_out[r + d]; }
    }
    at_x[lid] = u;
    workgroupBarrier();
    if (s == 0u) {
        var uu = 0.0;
        for (var c = 0u; c < AS; c++) { uu += at_x[lid + c]; }
        at_row[o] = select(0.0, aq_lse[(blk.z + min(i, p.t - 1u)) * p.h + blk.x], o < blk.w);
        at_row[AO + o] = uu;
    }
    workgroupBarrier();
    aq_dq_sweep(blk.x, blk.y, blk.z, blk.w, lid);
}

// The dq kernels' sweep over the key blocks: dS tile by tile, dq_i += dS_ij k_j, with
// row o's (lse, Dsum) in at_row[o], at_row[AO + o]; writes dq and stats. Thread (o, s)
// sums dims 32k + s (k < 8: D <= 256) of row o's dq from the key block's k rows, restaged
// chunk by chunk in workgroup memory (aq_restage, aq_accum), keys in order.
fn aq_dq_sweep(h: u32, i0: u32, first: u32, nq: u32, lid: u32) {
    let p = ab_p;
    let D = p.d;
    let HD = p.h * D;
    let KD = p.hkv * D;
    let g = h / (p.h / p.hkv);
    let qo = (first + i0) * HD + h * D;
    let o = lid / AS;                     // query row in the tile
    let s = lid % AS;                     // key in the tile; dims 32k + s when accumulating
    let i = i0 + o;
    let nkb = (i0 + nq + AS - 1u) / AS;
    let lse = at_row[o];
    let dsum = at_row[AO + o];
    var a0 = 0.0;
    var a1 = 0.0;
    var a2 = 0.0;
    var a3 = 0.0;
    var a4 = 0.0;
    var a5 = 0.0;
    var a6 = 0.0;
    var a7 = 0.0;
    for (var kb = 0u; kb < nkb; kb++) {
        let j0 = kb * AS;
        let nk = min(AS, p.t - j0);
        let ko = (first + j0) * KD + g * D;
        let sd = at_scores(true, qo, HD, nq, ko, KD, nk, D, lid);
        var kc = aq_kfetch(ko, KD, nk, 0u, D, lid);   // chunk 0 of the k rows again, for the sums
        var ds = 0.0;
        if (j0 + s <= i && i < p.t) { ds = exp(p.scale * sd.x - lse) * (sd.y - dsum); }
        at_ds[lid] = ds;
        let last = min(nk, i0 + nq - j0);   // keys past the block's last row have dS = 0
        kc = aq_restage(kc, 0u, ko, KD, nk, D, lid);
        a0 = aq_accum(a0, o, s, last);
        if (D > 32u) { kc = aq_restage(kc, 1u, ko, KD, nk, D, lid); a1 = aq_accum(a1, o, s, last); }
        if (D > 64u) { kc = aq_restage(kc, 2u, ko, KD, nk, D, lid); a2 = aq_accum(a2, o, s, last); }
        if (D > 96u) { kc = aq_restage(kc, 3u, ko, KD, nk, D, lid); a3 = aq_accum(a3, o, s, last); }
        if (D > 128u) { kc = aq_restage(kc, 4u, ko, KD, nk, D, lid); a4 = aq_accum(a4, o, s, last); }
        if (D > 160u) { kc = aq_restage(kc, 5u, ko, KD, nk, D, lid); a5 = aq_accum(a5, o, s, last); }
        if (D > 192u) { kc = aq_restage(kc, 6u, ko, KD, nk, D, lid); a6 = aq_accum(a6, o, s, last); }
        if (D > 224u) { kc = aq_restage(kc, 7u, ko, KD, nk, D, lid); a7 = aq_accum(a7, o, s, last); }
    }
    if (i < p.t) {
        let r = (first + i) * HD + h * D;
        aq_store(r, s, 0u, a0, D);
        aq_store(r, s, 1u, a1, D);
        aq_store(r, s, 2u, a2, D);
        aq_store(r, s, 3u, a3, D);
        aq_store(r, s, 4u, a4, D);
        aq_store(r, s, 5u, a5, D);
        aq_store(r, s, 6u, a6, D);
        aq_store(r, s, 7u, a7, D);
        if (s == 0u) { aq_stats[2u * ((first + i) * p.h + h)] = lse; aq_stats[2u * ((first + i) * p.h + h) + 1u] = dsum; }
    }
}

// A thread's share of chunk d0.. of the key block's k rows: at_fetch's streamed k (rows
// lid / AC + 8 t, dim d0 + lid % AC; 0 past nk or D) without v or the owned rows
fn aq_kfetch(ko: u32, ks: u32, nk: u32, d0: u32, D: u32, lid: u32) -> vec4<f32> {
    let r = lid / AC;
    let d = d0 + lid % AC;
    var x = vec4<f32>(0.0);
    if (d >= D) { return x; }
    for (var t = 0u; t < 4u; t++) { if (r + 8u * t < nk) { x[t] = ab_k[ko + (r + 8u * t) * ks + d]; } }
    return x;
}

// Stage chunk k of the k rows (registers kc) once the previous chunk has been read, then
// load chunk k + 1 (where D has it)
fn aq_restage(kc: vec4<f32>, k: u32, ko: u32, ks: u32, nk: u32, D: u32, lid: u32) -> vec4<f32> {
    workgroupBarrier();
    at_put(AtChunk(kc, vec4<f32>(0.0), 0.0, 0.0), lid, false, false);
    workgroupBarrier();
    if (AC * (k + 1u) < D) { return aq_kfetch(ko, ks, nk, AC * (k + 1u), D, lid); }
    return kc;
}

// dq of query o's dim s of the staged chunk += sum over the block's first `last` keys (in
// order) of dS k; dS in at_ds
fn aq_accum(a: f32, o: u32, s: u32, last: u32) -> f32 {
    var acc = a;
    for (var jj = 0u; jj < last; jj++) { acc += at_ds[o * AS + jj] * at_sa[jj * AP + s / 4u][s % 4u]; }
    return acc;
}

fn aq_store(r: u32, s: u32, k: u32, a: f32, D: u32) {   // dim 32k + s of the query row at r
    if (AC * k + s < D) { aq_dq[r + AC * k + s] = ab_p.scale * a; }
}

@group(0) @binding(5) var<storage, read> ak_stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> ak_dk: array<f32>;
@group(0) @binding(7) var<storage, read_write> ak_dv: array<f32>;

@compute @workgroup_size(AO * AS)
fn attention_backward_dkv(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                          @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ab_p;
    let D = p.d;
    let blk = row_block(wid, nw, p.b, p.t, p.hkv, AO, false);   // first blocks have the most queries
    if (blk.x >= p.hkv) { return; }
    let g = blk.x;
    let first = blk.y * p.t;
    let j0 = blk.z;
    let nk = blk.w;
    let rep = p.h / p.hkv;
    let HD = p.h * D;
    let KD = p.hkv * D;
    let ko = (first + j0) * KD + g * D;
    let o = lid / AS;                     // key in the tile
    let s = lid % AS;                     // query in the tile; dims 32k + s when accumulating
    let j = j0 + o;

    // (dk, dv) of key j's dims 32k + s, k < 8 (D <= 256), accumulated chunk by chunk from the
    // block's q and dout rows staged in workgroup memory (ak_restage, ak_accum)
    var a0 = vec2<f32>(0.0);
    var a1 = vec2<f32>(0.0);
    var a2 = vec2<f32>(0.0);
    var a3 = vec2<f32>(0.0);
    var a4 = vec2<f32>(0.0);
    var a5 = vec2<f32>(0.0);
    var a6 = vec2<f32>(0.0);
    var a7 = vec2<f32>(0.0);
    for (var r = 0u; r < rep; r++) {
        let h = g * rep + r;
        for (var i0 = j0; i0 < p.t; i0 += AS) {   // query blocks from the diagonal on
            let nq = min(AS, p.t - i0);
            let qo = (first + i0) * HD + h * D;
            let sd = at_scores(false, qo, HD, nq, ko, KD, nk, D, lid);
            var ch = at_fetch(false, false, qo, HD, nq, ko, KD, nk, 0u, D, lid);   // chunk 0 again, for the sums
            let i = i0 + s;
            var pr = 0.0;
            var ds = 0.0;
            if (j <= i && i < p.t) {
                let st = 2u * ((first + i) * p.h + h);
                pr = exp(p.scale * sd.x - ak_stats[st]);
                ds = pr * (sd.y - ak_stats[st + 1u]);
            }
            at_p[lid] = pr;
            at_ds[lid] = ds;
            ch = ak_restage(ch, 0u, qo, HD, nq, ko, KD, nk, D, lid);
            a0 = ak_accum(a0, o, s, nq);
            if (D > 32u) { ch = ak_restage(ch, 1u, qo, HD, nq, ko, KD, nk, D, lid); a1 = ak_accum(a1, o, s, nq); }
            if (D > 64u) { ch = ak_restage(ch, 2u, qo, HD, nq, ko, KD, nk, D, lid); a2 = ak_accum(a2, o, s, nq); }
            if (D > 96u) { ch = ak_restage(ch, 3u, qo, HD, nq, ko, KD, nk, D, lid); a3 = ak_accum(a3, o, s, nq); }
            if (D > 128u) { ch = ak_restage(ch, 4u, qo, HD, nq, ko, KD, nk, D, lid); a4 = ak_accum(a4, o, s, nq); }
            if (D > 160u) { ch = ak_restage(ch, 5u, qo, HD, nq, ko, KD, nk, D, lid); a5 = ak_accum(a5, o, s, nq); }
            if (D > 192u) { ch = ak_restage(ch, 6u, qo, HD, nq, ko, KD, nk, D, lid); a6 = ak_accum(a6, o, s, nq); }
            if (D > 224u) { ch = ak_restage(ch, 7u, qo, HD, nq, ko, KD, nk, D, lid); a7 = ak_accum(a7, o, s, nq); }
        }
    }
    if (j < p.t) {
        let r = ko + o * KD;
        ak_store(r, s, 0u, a0, D);
        ak_store(r, s, 1u, a1, D);
        ak_store(r, s, 2u, a2, D);
        ak_store(r, s, 3u, a3, D);
        ak_store(r, s, 4u, a4, D);
        ak_store(r, s, 5u, a5, D);
        ak_store(r, s, 6u, a6, D);
        ak_store(r, s, 7u, a7, D);
    }
}

// Stage chunk k (registers ch: the block's q and dout rows, dims 32k ..) once the previous
// chunk has been read, then load chunk k + 1 (where D has it)
fn ak_restage(ch: AtChunk, k: u32, qo: u32, qs: u32, nq: u32, ko: u32, ks: u32, nk: u32, D: u32,
              lid: u32) -> AtChunk {
    workgroupBarrier();
    at_put(ch, lid, true, false);   // the q, dout rows only: the sums read no owned row
    workgroupBarrier();
    if (AC * (k + 1u) < D) { return at_fetch(false, false, qo, qs, nq, ko, ks, nk, AC * (k + 1u), D, lid); }
    return ch;
}

// (dk, dv) of key o's dim s of the staged chunk += sum over the block's queries (in order) of
// dS q, P dout; P and dS in at_p, at_ds
fn ak_accum(a: vec2<f32>, o: u32, s: u32, nq: u32) -> vec2<f32> {
    var acc = a;
    for (var ii = 0u; ii < nq; ii++) {
        let e = ii * AP + s / 4u;
        acc.y += at_p[o * AS + ii] * at_sb[e][s % 4u];
        acc.x += at_ds[o * AS + ii] * at_sa[e][s % 4u];
    }
    return acc;
}

fn ak_store(r: u32, s: u32, k: u32, a: vec2<f32>, D: u32) {   // dim 32k + s of the key row at r
    if (AC * k + s < D) {
        ak_dk[r + AC * k + s] = ab_p.scale * a.x;
        ak_dv[r + AC * k + s] = a.y;
    }
}

// ---------------------------------------------------------------------------- tiled forward
// attention_forward_tiled: attention_forward's bindings, outputs and math, for whole
// sequences and prompts (T > 1): one workgroup (256) per (sequence, block of AO query
// rows, head), longest blocks first: B*ceil(T/AO)*H workgroups split over x, y. It walks
// the key blocks of AS keys up to the block's last diagonal, so each k, v row is read
// once per AO query rows (attention_forward reads them once per row). Thread (o, s)
// computes score (o, s) over staged 32-dim chunks of q and k (as the backward's tiles),
// the tile's row max and P go through workgroup memory, and thread (o, s) adds P v into
// row o's dims 4s + 128e .. +3 (e < 2) with an online softmax over the blocks.
fn af_vc4(o: u32, D: u32) -> vec4<f32> {   // v[o .. o+3], clamped to the row's last dim (D: dims left)
    return vec4<f32>(vc[o], vc[o + min(1u, D - 1u)], vc[o + min(2u, D - 1u)], vc[o + min(3u, D - 1u)]);
}

fn af_k(ko: u32, ks: u32, nk: u32, r: u32, d: u32) -> f32 {   // k of streamed row r, dim d
    if (r < nk) { return kc[ko + r * ks + d]; }
    return 0.0;
}

fn af_fetch(qo: u32, qs: u32, nq: u32, ko: u32, ks: u32, nk: u32, d0: u32, D: u32, lid: u32) -> AtChunk {
    var ch = AtChunk(vec4<f32>(0.0), vec4<f32>(0.0), 0.0, 0.0);   // (k rows, q rows; the second pair unused)
    let r = lid / AC;
    let d = d0 + lid % AC;
    if (d < D) {
        ch.sa = vec4<f32>(af_k(ko, ks, nk, r, d), af_k(ko, ks, nk, r + 8u, d), af_k(ko, ks, nk, r + 16u, d),
                          af_k(ko, ks, nk, r + 24u, d));
        if (r < nq) { ch.oa = q[qo + r * qs + d]; }
    }
    return ch;
}

@compute @workgroup_size(AO * AS)
fn attention_forward_tiled(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                           @builtin(num_workgroups) nw: vec3<u32>) {
    let p = af_p;
    let D = p.d;
    let blk = row_block(wid, nw, p.b, p.t, p.h, AO, true);
    if (blk.x >= p.h) { return; }
    let h = blk.x;
    let b = blk.y;
    let i0 = blk.z;
    let nq = blk.w;
    let HD = p.h * D;
    let W = p.hkv * D;
    let qo = (b * p.t + i0) * HD + h * D;
    let kvo = b * p.s * W + (h / (p.h / p.hkv)) * D;   // key 0 of this sequence and kv head
    let o = lid / AS;                     // query row in the tile
    let s = lid % AS;                     // key in the tile; dims 4s + 128e when accumulating
    let i = i0 + o;
    let pos0 = p.pos0 + kv_pos[0];        // the first query row's position
    let nkeys = pos0 + i0 + nq;           // keys up to the block's last row's position
    var m = NEG_BIG;
    var l = 0.0;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    let d0 = min(4u * s, D - 1u);         // clamped: sums past D are computed, never written
    let d1 = min(4u * s + 128u, D - 1u);
    for (var j0 = 0u; j0 < nkeys; j0 += AS) {
        let nk = min(AS, nkeys - j0);
        var sc = 0.0;
        let ko = kvo + j0 * W;
        var ch = af_fetch(qo, HD, nq, ko, W, nk, 0u, D, lid);
        for (var c0 = 0u; c0 < D; c0 += AC) {
            workgroupBarrier();           // the previous chunk (and tile) has been read
            at_put(ch, lid, false, true);
            workgroupBarrier();
            if (c0 + AC < D) { ch = af_fetch(qo, HD, nq, ko, W, nk, c0 + AC, D, lid); }
            for (var c = 0u; c < AC / 4u; c++) { sc += dot(at_oa[o * AP + c], at_sa[s * AP + c]); }
        }
        let ok = j0 + s <= pos0 + i && i < p.t;   // causal; rows past T are never stored
        sc = select(NEG_BIG, p.scale * sc, ok);
        at_p[lid] = sc;
        workgroupBarrier();
        var mx = m;
        for (var c = 0u; c < AS; c++) { mx = max(mx, at_p[o * AS + c]); }
        let pj = select(0.0, exp(sc - mx), ok);
        at_ds[lid] = pj;
        workgroupBarrier();
        let corr = exp(m - mx);
        m = mx;
        acc0 *= corr;
        acc1 *= corr;
        var psum = 0.0;
        for (var jj = 0u; jj < nk; jj++) {
            let pa = at_ds[o * AS + jj];
            psum += pa;
            let vo = kvo + (j0 + jj) * W;
            acc0 += pa * af_vc4(vo + d0, D - d0);
            if (D > 128u) { acc1 += pa * af_vc4(vo + d1, D - d1); }
        }
        l = l * corr + psum;
    }
    if (i >= p.t) { return; }
    let r = qo + o * HD;
    for (var c = 0u; c < 4u; c++) {
        if (4u * s + c < D) { out[r + 4u * s + c] = acc0[c] / l; }
        if (4u * s + 128u + c < D) { out[r + 4u * s + 128u + c] = acc1[c] / l; }
    }
    if (s == 0u) { lse[(b * p.t + i) * p.h + h] = m + log(l); }
}

// attention_forward_q32: attention_forward_tiled's bindings, outputs and math where
// D % 4 == 0 and D <= 128 (ops/attention.py picks it), in blocks of FQ = 32 query rows:
// one workgroup (256) per (sequence, block, head), longest first, B*ceil(T/32)*H
// workgroups split over x, y; each key tile of FK = 32 keys is staged once per 32 rows
// (the 8-row tiles stage it once per 8). Thread (g, c) = (lid / 32, lid % 32) owns rows
// 4g .. 4g+3 of the block: their scores against key c of the tile (q . k over staged
// chunks of 8 vec4s), then their output dims 4c .. 4c+3 (sum over the tile's keys of
// P v, v staged 16 keys at a time). A row's max and sum live in registers: the 32 lanes
// that own it read its scores and probabilities back from workgroup memory alike.
const FQ: u32 = 32u;          // query rows per block
const FK: u32 = 32u;          // keys per tile
const FV: u32 = 16u;          // keys per staged v sub-tile
@group(0) @binding(1) var<storage, read> ff_q4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ff_k4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> ff_v4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> ff_out4: array<vec4<f32>>;
// [0, 256): a q chunk [FQ rows, 8 vec4s]; [256, 544): a k chunk [FK keys, 9 vec4s (a pad
// against bank conflicts)]; in the P v phase [0, 512): v rows [FV keys, 32 vec4s]
var<workgroup> ff_sh: array<vec4<f32>, 544>;
var<workgroup> ff_p: array<vec4<f32>, 256>;   // [FQ rows, FK / 4]: scores, then probabilities

struct FfChunk { q: vec4<f32>, k: vec4<f32> };

// Thread lid's share of chunk v0 (vec4s v0 .. v0+7 of a row): q row lid / 8 and key
// row lid / 8 of the tile, vec4 v0 + lid % 8 (zero past the row's D4, nq rows, nk keys)
fn ff_fetch(qo4: u32, qs4: u32, nq: u32, ko4: u32, ks4: u32, nk: u32, v0: u32, D4: u32, lid: u32) -> FfChunk {
    let r = lid / 8u;
    let v = v0 + lid % 8u;
    var ch = FfChunk(vec4<f32>(0.0), vec4<f32>(0.0));
    if (v < D4) {
        if (r < nq) { ch.q = ff_q4[qo4 + r * qs4 + v]; }
        if (r < nk) { ch.k = ff_k4[ko4 + r * ks4 + v]; }
    }
    return ch;
}

@compute @workgroup_size(256)
fn attention_forward_q32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nw: vec3<u32>) {
    let p = af_p;
    let D4 = p.d / 4u;
    let blk = row_block(wid, nw, p.b, p.t, p.h, FQ, true);
    if (blk.x >= p.h) { return; }
    let h = blk.x;
    let b = blk.y;
    let i0 = blk.z;
    let nq = blk.w;
    let HD4 = p.h * D4;
    let W4 = p.hkv * D4;
    let qo4 = (b * p.t + i0) * HD4 + h * D4;
    let kvo4 = b * p.s * W4 + (h / (p.h / p.hkv)) * D4;   // key 0 of this sequence and kv head
    let g = lid / 32u;
    let c = lid % 32u;
    let r0 = 4u * g;                      // the thread's first row in the block
    let pos0 = p.pos0 + kv_pos[0];        // the first query row's position
    let pos = pos0 + i0 + r0;             // ... and the thread's first row's
    let nkeys = pos0 + i0 + nq;           // keys up to the block's last row's position
    var m = vec4<f32>(NEG_BIG);           // rows r0 .. r0+3: running max, sum, output dims 4c ..
    var l = vec4<f32>(0.0);
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0); var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    for (var j0 = 0u; j0 < nkeys; j0 += FK) {
        let nk = min(FK, nkeys - j0);
        let ko4 = kvo4 + j0 * W4;
        var sc = vec4<f32>(0.0);          // scores of rows r0 .. r0+3 against key j0 + c
        var ch = ff_fetch(qo4, HD4, nq, ko4, W4, nk, 0u, D4, lid);
        for (var v0 = 0u; v0 < D4; v0 += 8u) {
            workgroupBarrier();           // the previous chunk (or tile's v rows) has been read
            ff_sh[lid] = ch.q;
            ff_sh[256u + (lid / 8u) * 9u + lid % 8u] = ch.k;
            workgroupBarrier();
            if (v0 + 8u < D4) { ch = ff_fetch(qo4, HD4, nq, ko4, W4, nk, v0 + 8u, D4, lid); }
            for (var v = 0u; v < 8u; v++) {
                let k = ff_sh[256u + c * 9u + v];
                sc += vec4<f32>(dot(ff_sh[r0 * 8u + v], k), dot(ff_sh[(r0 + 1u) * 8u + v], k),
                                dot(ff_sh[(r0 + 2u) * 8u + v], k), dot(ff_sh[(r0 + 3u) * 8u + v], k));
            }
        }
        let ok = vec4<u32>(j0 + c) <= vec4<u32>(pos) + vec4<u32>(0u, 1u, 2u, 3u);   // causal
        sc = select(vec4<f32>(NEG_BIG), p.scale * sc, ok);
        for (var i = 0u; i < 4u; i++) { ff_p[(r0 + i) * 8u + c / 4u][c % 4u] = sc[i]; }
        workgroupBarrier();
        var mx = m;
        for (var e = 0u; e < 8u; e++) {
            mx = max(mx, vec4<f32>(ff_max4(ff_p[r0 * 8u + e]), ff_max4(ff_p[(r0 + 1u) * 8u + e]),
                                   ff_max4(ff_p[(r0 + 2u) * 8u + e]), ff_max4(ff_p[(r0 + 3u) * 8u + e])));
        }
        let pr = select(vec4<f32>(0.0), exp(sc - mx), ok);
        let corr = exp(m - mx);
        m = mx;
        a0 *= corr.x; a1 *= corr.y; a2 *= corr.z; a3 *= corr.w;
        l *= corr;
        workgroupBarrier();               // every row's scores have been read
        for (var i = 0u; i < 4u; i++) { ff_p[(r0 + i) * 8u + c / 4u][c % 4u] = pr[i]; }
        for (var u0 = 0u; u0 < nk; u0 += FV) {
            if (u0 > 0u) { workgroupBarrier(); }   // the previous v rows have been read
            for (var e = lid; e < FV * 32u; e += 256u) {   // v rows j0+u0 .. +15, vec4 e % 32
                let j = e / 32u;
                let v = e % 32u;
                var x = vec4<f32>(0.0);
                if (u0 + j < nk && v < D4) { x = ff_v4[ko4 + (u0 + j) * W4 + v]; }
                ff_sh[e] = x;
            }
            workgroupBarrier();
            for (var e = 0u; e < FV / 4u; e++) {   // keys u0 + 4e .. +3
                let kq = (u0 / 4u) + e;
                let p0 = ff_p[r0 * 8u + kq]; let p1 = ff_p[(r0 + 1u) * 8u + kq];
                let p2 = ff_p[(r0 + 2u) * 8u + kq]; let p3 = ff_p[(r0 + 3u) * 8u + kq];
                l += vec4<f32>(p0.x + p0.y + p0.z + p0.w, p1.x + p1.y + p1.z + p1.w,
                               p2.x + p2.y + p2.z + p2.w, p3.x + p3.y + p3.z + p3.w);
                for (var k = 0u; k < 4u; k++) {
                    let x = ff_sh[(4u * e + k) * 32u + c];
                    a0 += p0[k] * x; a1 += p1[k] * x; a2 += p2[k] * x; a3 += p3[k] * x;
                }
            }
        }
    }
    if (c < D4) {
        let o = qo4 + r0 * HD4 + c;
        if (r0 < nq) { ff_out4[o] = a0 / l.x; }
        if (r0 + 1u < nq) { ff_out4[o + HD4] = a1 / l.y; }
        if (r0 + 2u < nq) { ff_out4[o + 2u * HD4] = a2 / l.z; }
        if (r0 + 3u < nq) { ff_out4[o + 3u * HD4] = a3 / l.w; }
    }
    if (c == 0u) {
        let lo = (b * p.t + i0 + r0) * p.h + h;
        let lv = m + log(l);
        for (var i = 0u; i < 4u; i++) { if (r0 + i < nq) { lse[lo + i * p.h] = lv[i]; } }
    }
}

fn ff_max4(x: vec4<f32>) -> f32 { return max(max(x.x, x.y), max(x.z, x.w)); }

// ---------------------------------------------------------------------------- backward, 32 x 32 tiles
// attention_backward_dqs_q32, attention_backward_dkv_q32: the backward where D % 4 == 0
// and D <= 128 (ops/attention.py picks them), in tiles of 32 owned rows x 32 streamed
// rows (the 8-row kernels' tiles above stage each streamed row once per 8 owned rows).
// Thread (g, c) = (lid / 32, lid % 32) owns rows 4g .. 4g+3 of the tile: their two dot
// products with streamed row c over staged chunks of 4 vec4s (fb_scores), then their dims
// 4c .. 4c+3 of the sums over the streamed rows, those rows staged 16 at a time (fb_stage).
//   attention_backward_dqs_q32: attention_backward_dqs's bindings and outputs, with dq
//     and out seen as vec4s; one workgroup per (sequence, block of 32 query rows, h),
//     longest first: B*ceil(T/32)*H workgroups split over x, y.
//   attention_backward_dkv_q32: one workgroup per (sequence, block of 32 keys, query
//     head h), the first blocks (most queries) first: B*ceil(T/32)*H workgroups split
//     over x, y. Bindings as attention_backward_dkv's, but 6, 7 take head h's share of
//     dk, dv (dk scaled) at slice h % (H/Hkv) of [H/Hkv, N, Hkv*D]: where H > Hkv the
//     slices are scratch that ops/attention.py adds into dk, dv (splitk_reduce); where
//     H = Hkv, dk and dv themselves.
@group(0) @binding(1) var<storage, read> fb_do4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> fb_q4: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> fb_k4: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> fb_v4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> fb_dq4: array<vec4<f32>>;   // dqs_q32
@group(0) @binding(7) var<storage, read> fb_out4: array<vec4<f32>>;        // dqs_q32
@group(0) @binding(6) var<storage, read_write> fb_dk4: array<vec4<f32>>;   // dkv_q32
@group(0) @binding(7) var<storage, read_write> fb_dv4: array<vec4<f32>>;   // dkv_q32
// Chunk phase: [0, 128) owned rows' chunk of the first array [32 rows, 4 vec4s]; [128, 256)
// of the second; [256, 416) streamed rows' chunk of the first [32 rows, 5 vec4s: a pad
// against bank conflicts]; [416, 576) of the second. Sum phase: [0, 512) 16 streamed rows
// [16, 32 vec4s].
var<workgroup> fb_sh: array<vec4<f32>, 576>;
var<workgroup> fb_p: array<vec4<f32>, 256>;   // [32 owned rows, 8]: P or dS against the streamed rows

fn fb_load(which: u32, e: u32) -> vec4<f32> {   // vec4 e of q (0), dout (1), k (2) or v (3)
    switch which {
        case 0u: { return fb_q4[e]; }
        case 1u: { return fb_do4[e]; }
        case 2u: { return fb_k4[e]; }
        default: { return fb_v4[e]; }
    }
}

struct FbChunk { a: vec4<f32>, b: vec4<f32> };
struct FbRows { o: u32, os: u32, no: u32, s: u32, ss: u32, ns: u32, kv: u32 };   // owned / streamed rows:
// first vec4, row stride (vec4s), valid rows; kv = 1: k, v owned and q, dout streamed (dkv), else the other way

// Thread lid's share of chunk v0 (vec4s v0 .. v0+3 of a row) of both arrays: owned row
// lid / 4 (lid < 128) or streamed row (lid - 128) / 4, vec4 v0 + lid % 4 (0 past D4 or the rows)
fn fb_fetch(t: FbRows, v0: u32, D4: u32, lid: u32) -> FbChunk {
    let owned = lid < 128u;
    let r = (lid % 128u) / 4u;
    let v = v0 + lid % 4u;
    var ch = FbChunk(vec4<f32>(0.0), vec4<f32>(0.0));
    let n = select(t.ns, t.no, owned);
    if (v < D4 && r < n) {
        let e = select(t.s + r * t.ss, t.o + r * t.os, owned) + v;
        let kv = (t.kv == 1u) == owned;   // this row is a k, v row
        ch.a = fb_load(select(0u, 2u, kv), e);
        ch.b = fb_load(select(1u, 3u, kv), e);
    }
    return ch;
}

// (a . a, b . b) of owned rows r0 .. r0+3 with streamed row c: (q . k, dout . v) in dq,
// (k . q, v . dout) in dkv. Call in uniform control flow; it leaves the chunk phase's
// arrays being read (barrier before writing fb_sh).
fn fb_scores(t: FbRows, D4: u32, lid: u32) -> array<vec4<f32>, 2> {
    let r0 = 4u * (lid / 32u);
    let c = lid % 32u;
    var x = vec4<f32>(0.0);
    var y = vec4<f32>(0.0);
    var ch = fb_fetch(t, 0u, D4, lid);
    for (var v0 = 0u; v0 < D4; v0 += 4u) {
        workgroupBarrier();   // the previous chunk (or sum phase) has been read
        if (lid < 128u) { fb_sh[lid] = ch.a; fb_sh[128u + lid] = ch.b; }
        else { let e = ((lid - 128u) / 4u) * 5u + lid % 4u; fb_sh[256u + e] = ch.a; fb_sh[416u + e] = ch.b; }
        workgroupBarrier();
        if (v0 + 4u < D4) { ch = fb_fetch(t, v0 + 4u, D4, lid); }
        for (var v = 0u; v < 4u; v++) {
            let sa = fb_sh[256u + c * 5u + v];
            let sb = fb_sh[416u + c * 5u + v];
            x += vec4<f32>(dot(fb_sh[r0 * 4u + v], sa), dot(fb_sh[(r0 + 1u) * 4u + v], sa),
                           dot(fb_sh[(r0 + 2u) * 4u + v], sa), dot(fb_sh[(r0 + 3u) * 4u + v], sa));
            y += vec4<f32>(dot(fb_sh[128u + r0 * 4u + v], sb), dot(fb_sh[128u + (r0 + 1u) * 4u + v], sb),
                           dot(fb_sh[128u + (r0 + 2u) * 4u + v], sb), dot(fb_sh[128u + (r0 + 3u) * 4u + v], sb));
        }
    }
    return array<vec4<f32>, 2>(x, y);
}

fn fb_put_p(r0: u32, c: u32, x: vec4<f32>) {   // fb_p[r0 + i, c] = x[i]
    for (var i = 0u; i < 4u; i++) { fb_p[(r0 + i) * 8u + c / 4u][c % 4u] = x[i]; }
}

// Streamed rows u0 .. u0+15 (of n) of array `which` (first vec4 base, row stride st) into
// the sum phase's fb_sh, 0 past n or D4. Call in uniform control flow: it barriers first.
fn fb_stage(which: u32, base: u32, st: u32, n: u32, u0: u32, D4: u32, lid: u32) {
    workgroupBarrier();   // the chunk phase's or the previous rows' readers are done
    for (var e = lid; e < 512u; e += 256u) {
        let j = e / 32u;
        let v = e % 32u;
        var x = vec4<f32>(0.0);
        if (u0 + j < n && v < D4) { x = fb_load(which, base + (u0 + j) * st + v); }
        fb_sh[e] = x;
    }
    workgroupBarrier();
}

// acc[i] += sum over staged rows u0 .. u0+15 of fb_p[r0 + i, u0 + j] * row j's vec4 c
fn fb_accum(acc: array<vec4<f32>, 4>, r0: u32, c: u32, u0: u32) -> array<vec4<f32>, 4> {
    var a0 = acc[0]; var a1 = acc[1]; var a2 = acc[2]; var a3 = acc[3];
    for (var e = 0u; e < 4u; e++) {
        let kq = u0 / 4u + e;
        let p0 = fb_p[r0 * 8u + kq]; let p1 = fb_p[(r0 + 1u) * 8u + kq];
        let p2 = fb_p[(r0 + 2u) * 8u + kq]; let p3 = fb_p[(r0 + 3u) * 8u + kq];
        for (var k = 0u; k < 4u; k++) {
            let x = fb_sh[(4u * e + k) * 32u + c];
            a0 += p0[k] * x; a1 += p1[k] * x; a2 += p2[k] * x; a3 += p3[k] * x;
        }
    }
    return array<vec4<f32>, 4>(a0, a1, a2, a3);
}

@compute @workgroup_size(256)
fn attention_backward_dqs_q32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ab_p;
    let D4 = p.d / 4u;
    let blk = row_block(wid, nw, p.b, p.t, p.h, FQ, true);
    if (blk.x >= p.h) { return; }
    let h = blk.x;
    let first = blk.y * p.t;              // the sequence's row 0
    let i0 = blk.z;
    let nq = blk.w;
    let HD4 = p.h * D4;
    let KD4 = p.hkv * D4;
    let qo4 = (first + i0) * HD4 + h * D4;
    let kvo4 = first * KD4 + (h / (p.h / p.hkv)) * D4;
    let r0 = 4u * (lid / 32u);
    let c = lid % 32u;
    // lse and Dsum = dout . out of rows r0 .. r0+3, Dsum from the 32 lanes' parts through fb_p
    var part = vec4<f32>(0.0);
    var lse = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        if (r0 + i < nq) {
            if (c < D4) { let e = qo4 + (r0 + i) * HD4 + c; part[i] = dot(fb_do4[e], fb_out4[e]); }
            lse[i] = aq_lse[(first + i0 + r0 + i) * p.h + h];
        }
    }
    fb_put_p(r0, c, part);
    workgroupBarrier();
    var dsum = vec4<f32>(0.0);
    for (var e = 0u; e < 8u; e++) {
        dsum += vec4<f32>(dot(fb_p[r0 * 8u + e], vec4<f32>(1.0)), dot(fb_p[(r0 + 1u) * 8u + e], vec4<f32>(1.0)),
                          dot(fb_p[(r0 + 2u) * 8u + e], vec4<f32>(1.0)), dot(fb_p[(r0 + 3u) * 8u + e], vec4<f32>(1.0)));
    }
    var acc = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    let nkeys = i0 + nq;                  // keys up to the block's last row
    for (var j0 = 0u; j0 < nkeys; j0 += FK) {
        let nk = min(FK, nkeys - j0);
        let ko4 = kvo4 + j0 * KD4;
        let sd = fb_scores(FbRows(qo4, HD4, nq, ko4, KD4, nk, 0u), D4, lid);   // (q . k, dout . v)
        let ok = vec4<u32>(j0 + c) <= vec4<u32>(i0 + r0) + vec4<u32>(0u, 1u, 2u, 3u);   // causal
        let pr = select(vec4<f32>(0.0), exp(p.scale * sd[0] - lse), ok);
        fb_put_p(r0, c, pr * (sd[1] - dsum));   // dS (fb_p's readers passed fb_scores' barriers)
        for (var u0 = 0u; u0 < nk; u0 += FV) {
            fb_stage(2u, ko4, KD4, nk, u0, D4, lid);   // k rows
            acc = fb_accum(acc, r0, c, u0);
        }
    }
    for (var i = 0u; i < 4u; i++) {
        if (r0 + i < nq) {
            if (c < D4) { fb_dq4[qo4 + (r0 + i) * HD4 + c] = p.scale * acc[i]; }
            if (c == 0u) {
                let st = 2u * ((first + i0 + r0 + i) * p.h + h);
                aq_stats[st] = lse[i];
                aq_stats[st + 1u] = dsum[i];
            }
        }
    }
}

@compute @workgroup_size(256)
fn attention_backward_dkv_q32(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                              @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ab_p;
    let D4 = p.d / 4u;
    let blk = row_block(wid, nw, p.b, p.t, p.h, FQ, false);   // first blocks have the most queries
    if (blk.x >= p.h) { return; }
    let h = blk.x;
    let rep = p.h / p.hkv;
    let first = blk.y * p.t;
    let j0 = blk.z;
    let nk = blk.w;
    let HD4 = p.h * D4;
    let KD4 = p.hkv * D4;
    let ko4 = (first + j0) * KD4 + (h / rep) * D4;
    let r0 = 4u * (lid / 32u);            // keys j0 + r0 .. +3
    let c = lid % 32u;                    // query i0 + c of a tile; dims 4c .. when summing
    let zero4 = array<vec4<f32>, 4>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    var dk = zero4;
    var dv = zero4;
    for (var i0 = j0; i0 < p.t; i0 += FQ) {   // query blocks from the diagonal on
        let nq = min(FQ, p.t - i0);
        let qo4 = (first + i0) * HD4 + h * D4;
        let sd = fb_scores(FbRows(ko4, KD4, nk, qo4, HD4, nq, 1u), D4, lid);   // (k . q, v . dout)
        let i = i0 + c;
        var st = vec2<f32>(0.0);
        if (i < p.t) { let e = 2u * ((first + i) * p.h + h); st = vec2<f32>(ak_stats[e], ak_stats[e + 1u]); }
        let ok = (vec4<u32>(j0 + r0) + vec4<u32>(0u, 1u, 2u, 3u) <= vec4<u32>(i)) & vec4<bool>(i < p.t);
        let pr = select(vec4<f32>(0.0), exp(p.scale * sd[0] - st.x), ok);
        fb_put_p(r0, c, pr);   // dv += P dout
        for (var u0 = 0u; u0 < nq; u0 += FV) {
            fb_stage(1u, qo4, HD4, nq, u0, D4, lid);
            dv = fb_accum(dv, r0, c, u0);
        }
        workgroupBarrier();   // P has been read
        fb_put_p(r0, c, pr * (sd[1] - st.y));   // dk += dS q
        for (var u0 = 0u; u0 < nq; u0 += FV) {
            fb_stage(0u, qo4, HD4, nq, u0, D4, lid);
            dk = fb_accum(dk, r0, c, u0);
        }
    }
    if (c < D4) {
        let o = (h % rep) * p.b * p.t * KD4 + ko4 + c;   // head h's slice
        for (var i = 0u; i < 4u; i++) {
            if (r0 + i < nk) {
                fb_dk4[o + (r0 + i) * KD4] = p.scale * dk[i];
                fb_dv4[o + (r0 + i) * KD4] = dv[i];
            }
        }
    }
}

// ---------------------------------------------------------------------------- CPU variants
// For WebGPU on CPUs (Device.kind "cpu"), which run a workgroup as a loop on one thread,
// SIMD across invocations: one invocation per output row and head, no barriers, no
// workgroup memory, vec4 bindings (D % 4 == 0), the row's D/4 vec4 sums in private
// arrays. Same math, outputs and stats as the kernels above.
const AR: u32 = 16u;   // invocations per workgroup (ops/attention.py ROWS_WG); 8-32 measured alike on lavapipe

@group(0) @binding(0) var<uniform> ar_p: AttentionParams;
@group(0) @binding(1) var<storage, read> ar_q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ar_kc: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> ar_vc: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> ar_out: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> ar_lse: array<f32>;

@compute @workgroup_size(AR)
fn attention_forward_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ar_p;
    let g = gid.x + gid.y * nw.x * AR;   // = n * H + h
    if (g >= p.b * p.t * p.h) { return; }
    let n = g / p.h;
    let b = n / p.t;
    let pos = p.pos0 + kv_pos[0] + n % p.t;
    let D4 = p.d / 4u;
    let W4 = p.hkv * D4;
    let qb = g * D4;
    let kb0 = b * p.s * W4 + ((g % p.h) / (p.h / p.hkv)) * D4;
    var acc: array<vec4<f32>, 64>;
    var qr: array<vec4<f32>, 64>;
    for (var d = 0u; d < D4; d++) { acc[d] = vec4<f32>(0.0); qr[d] = ar_q[qb + d]; }
    var m = NEG_BIG;
    var l = 0.0;
    for (var j = 0u; j <= pos; j++) {
        let kb = kb0 + j * W4;
        var s4 = vec4<f32>(0.0);
        for (var d = 0u; d < D4; d++) { s4 += qr[d] * ar_kc[kb + d]; }
        let sc = p.scale * (s4.x + s4.y + s4.z + s4.w);
        let x = exp(-abs(sc - m));   // one exp: exp(m - sc) if sc is the new max, else exp(sc - m)
        let corr = select(1.0, x, sc > m);
        let e = select(x, 1.0, sc > m);
        l = l * corr + e;
        m = max(m, sc);
        for (var d = 0u; d < D4; d++) { acc[d] = acc[d] * corr + e * ar_vc[kb + d]; }
    }
    for (var d = 0u; d < D4; d++) { ar_out[qb + d] = acc[d] / l; }
    ar_lse[g] = m + log(l);
}

@group(0) @binding(0) var<uniform> arq_p: AttentionBackwardParams;
@group(0) @binding(1) var<storage, read> arq_do: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> arq_q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> arq_k: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> arq_v: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> arq_dq: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> arq_stats: array<f32>;

@compute @workgroup_size(AR)
fn attention_backward_dq_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = arq_p;
    let g = gid.x + gid.y * nw.x * AR;   // = n * H + h, query row n = b*T + t
    if (g >= p.b * p.t * p.h) { return; }
    let n = g / p.h;
    let t = n % p.t;
    let D4 = p.d / 4u;
    let K4 = p.hkv * D4;
    let qb = g * D4;
    let kb0 = (n - t) * K4 + ((g % p.h) / (p.h / p.hkv)) * D4;
    var qr: array<vec4<f32>, 64>;
    var dor: array<vec4<f32>, 64>;
    for (var d = 0u; d < D4; d++) { qr[d] = arq_q[qb + d]; dor[d] = arq_do[qb + d]; }
    // sweep 1: online (max m, sum l, sum u of P dP) over keys 0..t
    var m = NEG_BIG;
    var l = 0.0;
    var u = 0.0;
    for (var j = 0u; j <= t; j++) {
        let kb = kb0 + j * K4;
        var s4 = vec4<f32>(0.0);
        var p4 = vec4<f32>(0.0);
        for (var d = 0u; d < D4; d++) { s4 += qr[d] * arq_k[kb + d]; p4 += dor[d] * arq_v[kb + d]; }
        let sc = p.scale * (s4.x + s4.y + s4.z + s4.w);
        let x = exp(-abs(sc - m));
        let corr = select(1.0, x, sc > m);
        let e = select(x, 1.0, sc > m);
        l = l * corr + e;
        u = u * corr + e * (p4.x + p4.y + p4.z + p4.w);
        m = max(m, sc);
    }
    let lse = m + log(l);
    let dsum = u / l;
    // sweep 2: dq = scale * sum_j dS_j k_j
    var acc: array<vec4<f32>, 64>;
    for (var d = 0u; d < D4; d++) { acc[d] = vec4<f32>(0.0); }
    for (var j = 0u; j <= t; j++) {
        let kb = kb0 + j * K4;
        var s4 = vec4<f32>(0.0);
        var p4 = vec4<f32>(0.0);
        for (var d = 0u; d < D4; d++) { s4 += qr[d] * arq_k[kb + d]; p4 += dor[d] * arq_v[kb + d]; }
        let ds = exp(p.scale * (s4.x + s4.y + s4.z + s4.w) - lse) * ((p4.x + p4.y + p4.z + p4.w) - dsum);
        for (var d = 0u; d < D4; d++) { acc[d] += ds * arq_k[kb + d]; }
    }
    for (var d = 0u; d < D4; d++) { arq_dq[qb + d] = p.scale * acc[d]; }
    arq_stats[2u * g] = lse;
    arq_stats[2u * g + 1u] = dsum;
}

@group(0) @binding(0) var<uniform> ark_p: AttentionBackwardParams;
@group(0) @binding(1) var<storage, read> ark_do: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> ark_q: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> ark_k: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read> ark_v: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> ark_stats: array<f32>;
@group(0) @binding(6) var<storage, read_write> ark_dk: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> ark_dv: array<vec4<f32>>;

@compute @workgroup_size(AR)
fn attention_backward_dkv_rows(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ark_p;
    let g = gid.x + gid.y * nw.x * AR;   // = n * Hkv + kv head, key row n = b*T + t
    if (g >= p.b * p.t * p.hkv) { return; }
    let n = g / p.hkv;
    let t = n % p.t;
    let rep = p.h / p.hkv;
    let D4 = p.d / 4u;
    let kb = g * D4;
    var acck: array<vec4<f32>, 64>;
    var accv: array<vec4<f32>, 64>;
    var kr: array<vec4<f32>, 64>;
    var vr: array<vec4<f32>, 64>;
    for (var d = 0u; d < D4; d++) {
        acck[d] = vec4<f32>(0.0);
        accv[d] = vec4<f32>(0.0);
        kr[d] = ark_k[kb + d];
        vr[d] = ark_v[kb + d];
    }
    for (var r = 0u; r < rep; r++) {
        let h = (g % p.hkv) * rep + r;
        for (var i = n; i < n - t + p.t; i++) {   // the sequence's queries from the diagonal on
            let qi = i * p.h + h;
            let qb = qi * D4;
            var s4 = vec4<f32>(0.0);
            var p4 = vec4<f32>(0.0);
            for (var d = 0u; d < D4; d++) { s4 += ark_q[qb + d] * kr[d]; p4 += ark_do[qb + d] * vr[d]; }
            let pr = exp(p.scale * (s4.x + s4.y + s4.z + s4.w) - ark_stats[2u * qi]);
            let ds = pr * ((p4.x + p4.y + p4.z + p4.w) - ark_stats[2u * qi + 1u]);
            for (var d = 0u; d < D4; d++) { accv[d] += pr * ark_do[qb + d]; acck[d] += ds * ark_q[qb + d]; }
        }
    }
    for (var d = 0u; d < D4; d++) { ark_dk[kb + d] = p.scale * acck[d]; ark_dv[kb + d] = accv[d]; }
}

// ---------------------------------------------------------------------------- CPU variants, D <= 32
// The *_rows kernels above keep a row's D/4 vec4s in private arrays indexed by loop
// counters: CPU compilers keep those in memory and load every k, v, q, dout vec4 once
// per owned row. These keep up to 32 dims of a row in named registers (the prelude's
// R8: eight vec4s, dims past D zero in the owned rows, and read clamped to the row's
// last vec4 in the streamed ones, where they meet those zeros or are never stored) and
// give an invocation a block of AB rows of one head, so each streamed row is loaded
// once per AB owned rows (at D = 32 ~10x faster than *_rows on lavapipe, ~4x on
// SwiftShader). 8 rows ran lavapipe ~1.35x faster still and SwiftShader no faster, but
// took SwiftShader ~2.8x as long to compile (~10 s of CPU for the three kernels).
// Rows of the block past T repeat row T-1 and are not stored. Same outputs and stats.
//   attention_forward_d32   invocation g = (b*ceil(T/AB) + t/AB)*H + h owns query rows
//     t .. t+AB-1 of sequence b, head h: ceil(B*ceil(T/AB)*H / 16) workgroups (16).
//     Bindings as attention_forward_rows.
//   attention_backward_dq_d32   the same blocks of query rows; bindings as
//     attention_backward_dq_rows.
//   attention_backward_dkv_d32   invocation g = (b*ceil(T/AB) + t/AB)*Hkv + kv head owns
//     key rows t .. t+AB-1: ceil(B*ceil(T/AB)*Hkv / 16) workgroups (16); bindings as
//     attention_backward_dkv_rows.
const AB: u32 = 4u;   // rows per invocation (ops/attention.py D32_ROWS)

fn r8_owned(x: R8, n: u32) -> R8 {   // x with vec4s n.. zeroed (n = D/4 >= 1)
    let z = vec4<f32>(0.0);
    return R8(x.a, select(z, x.b, n > 1u), select(z, x.c, n > 2u), select(z, x.d, n > 3u),
              select(z, x.e, n > 4u), select(z, x.f, n > 5u), select(z, x.g, n > 6u), select(z, x.h, n > 7u));
}

// Loads of 8 vec4s from index b, clamped to b + m (m = D/4 - 1), per binding.
fn ar_q8(b: u32, m: u32) -> R8 {
    return R8(ar_q[b], ar_q[b + min(1u, m)], ar_q[b + min(2u, m)], ar_q[b + min(3u, m)],
              ar_q[b + min(4u, m)], ar_q[b + min(5u, m)], ar_q[b + min(6u, m)], ar_q[b + min(7u, m)]);
}
fn ar_kc8(b: u32, m: u32) -> R8 {
    return R8(ar_kc[b], ar_kc[b + min(1u, m)], ar_kc[b + min(2u, m)], ar_kc[b + min(3u, m)],
              ar_kc[b + min(4u, m)], ar_kc[b + min(5u, m)], ar_kc[b + min(6u, m)], ar_kc[b + min(7u, m)]);
}
fn ar_vc8(b: u32, m: u32) -> R8 {
    return R8(ar_vc[b], ar_vc[b + min(1u, m)], ar_vc[b + min(2u, m)], ar_vc[b + min(3u, m)],
              ar_vc[b + min(4u, m)], ar_vc[b + min(5u, m)], ar_vc[b + min(6u, m)], ar_vc[b + min(7u, m)]);
}
fn arq_do8(b: u32, m: u32) -> R8 {
    return R8(arq_do[b], arq_do[b + min(1u, m)], arq_do[b + min(2u, m)], arq_do[b + min(3u, m)],
              arq_do[b + min(4u, m)], arq_do[b + min(5u, m)], arq_do[b + min(6u, m)], arq_do[b + min(7u, m)]);
}
fn arq_q8(b: u32, m: u32) -> R8 {
    return R8(arq_q[b], arq_q[b + min(1u, m)], arq_q[b + min(2u, m)], arq_q[b + min(3u, m)],
              arq_q[b + min(4u, m)], arq_q[b + min(5u, m)], arq_q[b + min(6u, m)], arq_q[b + min(7u, m)]);
}
fn arq_k8(b: u32, m: u32) -> R8 {
    return R8(arq_k[b], arq_k[b + min(1u, m)], arq_k[b + min(2u, m)], arq_k[b + min(3u, m)],
              arq_k[b + min(4u, m)], arq_k[b + min(5u, m)], arq_k[b + min(6u, m)], arq_k[b + min(7u, m)]);
}
fn arq_v8(b: u32, m: u32) -> R8 {
    return R8(arq_v[b], arq_v[b + min(1u, m)], arq_v[b + min(2u, m)], arq_v[b + min(3u, m)],
              arq_v[b + min(4u, m)], arq_v[b + min(5u, m)], arq_v[b + min(6u, m)], arq_v[b + min(7u, m)]);
}

// Stores of the first n (= D/4) vec4s of x at index b, when `ok` (a row of the block before T).
fn ar_out8(b: u32, n: u32, x: R8, ok: bool) {
    if (!ok) { return; }
    ar_out[b] = x.a;
    if (n > 1u) { ar_out[b + 1u] = x.b; } if (n > 2u) { ar_out[b + 2u] = x.c; } if (n > 3u) { ar_out[b + 3u] = x.d; }
    if (n > 4u) { ar_out[b + 4u] = x.e; } if (n > 5u) { ar_out[b + 5u] = x.f; } if (n > 6u) { ar_out[b + 6u] = x.g; }
    if (n > 7u) { ar_out[b + 7u] = x.h; }
}
fn arq_dq8(b: u32, n: u32, x: R8, ok: bool) {
    if (!ok) { return; }
    arq_dq[b] = x.a;
    if (n > 1u) { arq_dq[b + 1u] = x.b; } if (n > 2u) { arq_dq[b + 2u] = x.c; } if (n > 3u) { arq_dq[b + 3u] = x.d; }
    if (n > 4u) { arq_dq[b + 4u] = x.e; } if (n > 5u) { arq_dq[b + 5u] = x.f; } if (n > 6u) { arq_dq[b + 6u] = x.g; }
    if (n > 7u) { arq_dq[b + 7u] = x.h; }
}
fn ark_dk8(b: u32, n: u32, x: R8, ok: bool) {
    if (!ok) { return; }
    ark_dk[b] = x.a;
    if (n > 1u) { ark_dk[b + 1u] = x.b; } if (n > 2u) { ark_dk[b + 2u] = x.c; } if (n > 3u) { ark_dk[b + 3u] = x.d; }
    if (n > 4u) { ark_dk[b + 4u] = x.e; } if (n > 5u) { ark_dk[b + 5u] = x.f; } if (n > 6u) { ark_dk[b + 6u] = x.g; }
    if (n > 7u) { ark_dk[b + 7u] = x.h; }
}
fn ark_dv8(b: u32, n: u32, x: R8, ok: bool) {
    if (!ok) { return; }
    ark_dv[b] = x.a;
    if (n > 1u) { ark_dv[b + 1u] = x.b; } if (n > 2u) { ark_dv[b + 2u] = x.c; } if (n > 3u) { ark_dv[b + 3u] = x.d; }
    if (n > 4u) { ark_dv[b + 4u] = x.e; } if (n > 5u) { ark_dv[b + 5u] = x.f; } if (n > 6u) { ark_dv[b + 6u] = x.g; }
    if (n > 7u) { ark_dv[b + 7u] = x.h; }
}

// An owned row: x (q; dkv: k), y (dq: dout; dkv: v), the sums acc (forward: sum P v;
// dq: dq; dkv: dk) and acc2 (dkv: dv), its last key (causal mask: later keys add
// nothing; dkv: its first query), the online softmax's max m and sum l, and dq's u = sum P dP.
struct Row { x: R8, y: R8, acc: R8, acc2: R8, last: u32, m: f32, l: f32, u: f32 };

fn row_new(x: R8, y: R8, last: u32) -> Row { return Row(x, y, R8(), R8(), last, NEG_BIG, 0.0, 0.0); }

// (c, e, new max) of the online softmax for key j with score s: c rescales the sums so
// far, e is the key's weight (0 past the row's last key)
fn soft_w(r: Row, j: u32, s_raw: f32) -> vec3<f32> {
    let ok = j <= r.last;
    let s = select(NEG_BIG, s_raw, ok);
    let x = exp(-abs(s - r.m));            // one exp: exp(m - s) if s is the new max, else exp(s - m)
    return vec3<f32>(select(1.0, x, s > r.m), select(x, 1.0, s > r.m) * f32(ok), max(r.m, s));
}

fn fw_step(r: Row, j: u32, k: R8, v: R8, scale: f32) -> Row {   // forward: acc = sum P v
    let w = soft_w(r, j, scale * r8_dot(r.x, k));
    return Row(r.x, r.y, r8_axpby(r.acc, w.x, v, w.y), r.acc2, r.last, w.z, r.l * w.x + w.y, 0.0);
}

fn fw_store(r: Row, qb: u32, D4: u32, ok: bool) {   // out row and lse of an owned row
    ar_out8(qb, D4, r8_scale(r.acc, 1.0 / r.l), ok);
    if (ok) { ar_lse[qb / D4] = r.m + log(r.l); }
}

@compute @workgroup_size(AR)
fn attention_forward_d32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ar_p;
    let g = gid.x + gid.y * nw.x * AR;
    let TB = (p.t + AB - 1u) / AB;
    if (g >= p.b * TB * p.h) { return; }
    let h = g % p.h;
    let b = g / p.h / TB;
    let t0 = (g / p.h % TB) * AB;
    let D4 = p.d / 4u;
    let m4 = D4 - 1u;
    let W4 = p.hkv * D4;
    let kb0 = b * p.s * W4 + (h / (p.h / p.hkv)) * D4;
    let e = p.t - 1u - t0;                        // rows of the block past T repeat row T-1
    let qs = p.h * D4;                            // from one query row to the next
    let q0 = ((b * p.t + t0) * p.h + h) * D4;
    let z = R8();
    let l0 = p.pos0 + kv_pos[0] + t0;
    var r0 = row_new(r8_owned(ar_q8(q0, m4), D4), z, l0);
    var r1 = row_new(r8_owned(ar_q8(q0 + min(1u, e) * qs, m4), D4), z, l0 + 1u);
    var r2 = row_new(r8_owned(ar_q8(q0 + min(2u, e) * qs, m4), D4), z, l0 + 2u);
    var r3 = row_new(r8_owned(ar_q8(q0 + min(3u, e) * qs, m4), D4), z, l0 + 3u);
    for (var j = 0u; j <= l0 + min(AB - 1u, e); j++) {
        let k = ar_kc8(kb0 + j * W4, m4);
        let v = ar_vc8(kb0 + j * W4, m4);
        r0 = fw_step(r0, j, k, v, p.scale); r1 = fw_step(r1, j, k, v, p.scale);
        r2 = fw_step(r2, j, k, v, p.scale); r3 = fw_step(r3, j, k, v, p.scale);
    }
    fw_store(r0, q0, D4, true); fw_store(r1, q0 + qs, D4, e >= 1u);
    fw_store(r2, q0 + 2u * qs, D4, e >= 2u); fw_store(r3, q0 + 3u * qs, D4, e >= 3u);
}

fn dq_stats(r: Row, j: u32, k: R8, v: R8, scale: f32) -> Row {   // dq's first sweep: m, l, u
    let w = soft_w(r, j, scale * r8_dot(r.x, k));
    return Row(r.x, r.y, r.acc, r.acc2, r.last, w.z, r.l * w.x + w.y, r.u * w.x + w.y * r8_dot(r.y, v));
}

fn dq_lse(r: Row) -> Row {   // after the first sweep: m = lse, u = Dsum
    return Row(r.x, r.y, r.acc, r.acc2, r.last, r.m + log(r.l), r.l, r.u / r.l);
}

fn dq_step(r: Row, j: u32, k: R8, v: R8, scale: f32) -> Row {   // dq's second sweep: acc = sum dS k
    let ds = exp(scale * r8_dot(r.x, k) - r.m) * (r8_dot(r.y, v) - r.u);
    return Row(r.x, r.y, r8_fma(r.acc, select(0.0, ds, j <= r.last), k), r.acc2, r.last, r.m, r.l, r.u);
}

fn dq_store(r: Row, qb: u32, D4: u32, scale: f32, ok: bool) {
    arq_dq8(qb, D4, r8_scale(r.acc, scale), ok);
    if (ok) { arq_stats[2u * (qb / D4)] = r.m; arq_stats[2u * (qb / D4) + 1u] = r.u; }
}

@compute @workgroup_size(AR)
fn attention_backward_dq_d32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = arq_p;
    let g = gid.x + gid.y * nw.x * AR;
    let TB = (p.t + AB - 1u) / AB;
    if (g >= p.b * TB * p.h) { return; }
    let h = g % p.h;
    let b = g / p.h / TB;
    let t0 = (g / p.h % TB) * AB;
    let D4 = p.d / 4u;
    let m4 = D4 - 1u;
    let K4 = p.hkv * D4;
    let kb0 = b * p.t * K4 + (h / (p.h / p.hkv)) * D4;
    let e = p.t - 1u - t0;
    let qs = p.h * D4;
    let q0 = ((b * p.t + t0) * p.h + h) * D4;
    var r0 = row_new(r8_owned(arq_q8(q0, m4), D4), r8_owned(arq_do8(q0, m4), D4), t0);
    var r1 = row_new(r8_owned(arq_q8(q0 + min(1u, e) * qs, m4), D4), r8_owned(arq_do8(q0 + min(1u, e) * qs, m4), D4), t0 + 1u);
    var r2 = row_new(r8_owned(arq_q8(q0 + min(2u, e) * qs, m4), D4), r8_owned(arq_do8(q0 + min(2u, e) * qs, m4), D4), t0 + 2u);
    var r3 = row_new(r8_owned(arq_q8(q0 + min(3u, e) * qs, m4), D4), r8_owned(arq_do8(q0 + min(3u, e) * qs, m4), D4), t0 + 3u);
    let last = t0 + min(AB - 1u, e);
    for (var j = 0u; j <= last; j++) {
        let k = arq_k8(kb0 + j * K4, m4);
        let v = arq_v8(kb0 + j * K4, m4);
        r0 = dq_stats(r0, j, k, v, p.scale); r1 = dq_stats(r1, j, k, v, p.scale);
        r2 = dq_stats(r2, j, k, v, p.scale); r3 = dq_stats(r3, j, k, v, p.scale);
    }
    r0 = dq_lse(r0); r1 = dq_lse(r1); r2 = dq_lse(r2); r3 = dq_lse(r3);
    for (var j = 0u; j <= last; j++) {
        let k = arq_k8(kb0 + j * K4, m4);
        let v = arq_v8(kb0 + j * K4, m4);
        r0 = dq_step(r0, j, k, v, p.scale); r1 = dq_step(r1, j, k, v, p.scale);
        r2 = dq_step(r2, j, k, v, p.scale); r3 = dq_step(r3, j, k, v, p.scale);
    }
    dq_store(r0, q0, D4, p.scale, true); dq_store(r1, q0 + qs, D4, p.scale, e >= 1u);
    dq_store(r2, q0 + 2u * qs, D4, p.scale, e >= 2u); dq_store(r3, q0 + 3u * qs, D4, p.scale, e >= 3u);
}

// attention_backward_dq_d32s: attention_backward_dq_d32 with the forward's saved out and lse
// (bindings 7 out[N, H*D] read, 8 lse[N, H] read): its first sweep over the keys is then
// one dot per row, Dsum = dout . out, and lse is read (the forward's online softmax gives the
// same bits as the sweep's); 3 of dq's 5 D-long products per (query, key) pair are left.
@group(0) @binding(7) var<storage, read> arq_out: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read> arq_lse: array<f32>;

fn arq_out8(b: u32, m: u32) -> R8 {
    return R8(arq_out[b], arq_out[b + min(1u, m)], arq_out[b + min(2u, m)], arq_out[b + min(3u, m)],
              arq_out[b + min(4u, m)], arq_out[b + min(5u, m)], arq_out[b + min(6u, m)], arq_out[b + min(7u, m)]);
}

fn dq_saved(qb: u32, m4: u32, last: u32) -> Row {   // an owned row with m = lse, u = Dsum from the forward
    let D4 = m4 + 1u;
    let r = row_new(r8_owned(arq_q8(qb, m4), D4), r8_owned(arq_do8(qb, m4), D4), last);
    return Row(r.x, r.y, r.acc, r.acc2, r.last, arq_lse[qb / D4], r.l, r8_dot(r.y, arq_out8(qb, m4)));
}

@compute @workgroup_size(AR)
fn attention_backward_dq_d32s(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = arq_p;
    let g = gid.x + gid.y * nw.x * AR;
    let TB = (p.t + AB - 1u) / AB;
    if (g >= p.b * TB * p.h) { return; }
    let h = g % p.h;
    let b = g / p.h / TB;
    let t0 = (g / p.h % TB) * AB;
    let D4 = p.d / 4u;
    let m4 = D4 - 1u;
    let K4 = p.hkv * D4;
    let kb0 = b * p.t * K4 + (h / (p.h / p.hkv)) * D4;
    let e = p.t - 1u - t0;
    let qs = p.h * D4;
    let q0 = ((b * p.t + t0) * p.h + h) * D4;
    var r0 = dq_saved(q0, m4, t0);
    var r1 = dq_saved(q0 + min(1u, e) * qs, m4, t0 + 1u);
    var r2 = dq_saved(q0 + min(2u, e) * qs, m4, t0 + 2u);
    var r3 = dq_saved(q0 + min(3u, e) * qs, m4, t0 + 3u);
    let last = t0 + min(AB - 1u, e);
    for (var j = 0u; j <= last; j++) {
        let k = arq_k8(kb0 + j * K4, m4);
        let v = arq_v8(kb0 + j * K4, m4);
        r0 = dq_step(r0, j, k, v, p.scale); r1 = dq_step(r1, j, k, v, p.scale);
        r2 = dq_step(r2, j, k, v, p.scale); r3 = dq_step(r3, j, k, v, p.scale);
    }
    dq_store(r0, q0, D4, p.scale, true); dq_store(r1, q0 + qs, D4, p.scale, e >= 1u);
    dq_store(r2, q0 + 2u * qs, D4, p.scale, e >= 2u); dq_store(r3, q0 + 3u * qs, D4, p.scale, e >= 3u);
}

// dkv: owned key row r (x = k, y = v, last = its own position: queries before it are
// masked) meets query i of head h: q, dout, and (lse, Dsum) = st
fn dkv_step(r: Row, i: u32, q: R8, dout: R8, st: vec2<f32>, scale: f32) -> Row {
    let pr = select(0.0, exp(scale * r8_dot(r.x, q) - st.x), i >= r.last);
    let ds = pr * (r8_dot(r.y, dout) - st.y);
    return Row(r.x, r.y, r8_fma(r.acc, ds, q), r8_fma(r.acc2, pr, dout), r.last, r.m, r.l, r.u);
}

fn dkv_store(r: Row, kb: u32, D4: u32, scale: f32, ok: bool) {
    ark_dk8(kb, D4, r8_scale(r.acc, scale), ok);
    ark_dv8(kb, D4, r.acc2, ok);
}

@compute @workgroup_size(AR)
fn attention_backward_dkv_d32(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let p = ark_p;
    let g = gid.x + gid.y * nw.x * AR;
    let TB = (p.t + AB - 1u) / AB;
    if (g >= p.b * TB * p.hkv) { return; }
    let kvh = g % p.hkv;
    let b = g / p.hkv / TB;
    let t0 = (g / p.hkv % TB) * AB;
    let rep = p.h / p.hkv;
    let D4 = p.d / 4u;
    let m4 = D4 - 1u;
    let e = p.t - 1u - t0;
    let ks = p.hkv * D4;                          // from one key row to the next
    let k0 = ((b * p.t + t0) * p.hkv + kvh) * D4;
    var r0 = row_new(r8_owned(arq_k8(k0, m4), D4), r8_owned(arq_v8(k0, m4), D4), t0);
    var r1 = row_new(r8_owned(arq_k8(k0 + min(1u, e) * ks, m4), D4), r8_owned(arq_v8(k0 + min(1u, e) * ks, m4), D4), t0 + 1u);
    var r2 = row_new(r8_owned(arq_k8(k0 + min(2u, e) * ks, m4), D4), r8_owned(arq_v8(k0 + min(2u, e) * ks, m4), D4), t0 + 2u);
    var r3 = row_new(r8_owned(arq_k8(k0 + min(3u, e) * ks, m4), D4), r8_owned(arq_v8(k0 + min(3u, e) * ks, m4), D4), t0 + 3u);
    for (var hr = 0u; hr < rep; hr++) {
        let h = kvh * rep + hr;
        for (var i = t0; i < p.t; i++) {             // the sequence's queries from the block's first row on
            let qi = (b * p.t + i) * p.h + h;
            let q = arq_q8(qi * D4, m4);
            let dout = arq_do8(qi * D4, m4);
            let st = vec2<f32>(ark_stats[2u * qi], ark_stats[2u * qi + 1u]);
            r0 = dkv_step(r0, i, q, dout, st, p.scale); r1 = dkv_step(r1, i, q, dout, st, p.scale);
            r2 = dkv_step(r2, i, q, dout, st, p.scale); r3 = dkv_step(r3, i, q, dout, st, p.scale);
        }
    }
    dkv_store(r0, k0, D4, p.scale, true); dkv_store(r1, k0 + ks, D4, p.scale, e >= 1u);
    dkv_store(r2, k0 + 2u * ks, D4, p.scale, e >= 2u); dkv_store(r3, k0 + 3u * ks, D4, p.scale, e >= 3u);
}
