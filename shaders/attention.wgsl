// attention.wgsl — causal softmax attention with GQA over a KV cache, forward.
// Query row n = b*T + t (token t of sequence b, at position pos = pos0 + t) attends
// to cache positions 0..pos of sequence b; query head h reads KV head h / (H/Hkv)
// (HF repeat_kv). The new tokens' k, v must already be in the cache (the model copies
// them there); for a whole sequence at once pos0 = 0 and S may equal T.
//   s_j = scale * q . k_j,  out = sum_j softmax(s)_j v_j   (f32, online softmax)
// lse[n, h] = log sum_j exp(s_j) is saved (the backward recomputes P from it).
//
// attention_forward
//   0 params {B, T, H, Hkv, D, S, pos0, scale} | 1 q[N, H*D] read (post-RoPE) |
//   2 k_cache[B, S, Hkv*D] read | 3 v_cache[B, S, Hkv*D] read | 4 out[N, H*D] write |
//   5 lse[N, H] write
//   dispatch: one workgroup (64) per (n, h): N*H workgroups split over x, y. D <= 256.
//   Keys go 64 at a time: one score per thread, then every thread updates its
//   (up to 4) output dims with the chunk's probabilities from workgroup memory.
//
// kv_store   the new tokens' k, v rows into the cache at positions pos0..pos0+T-1
//   k_cache[b, pos0 + t, :] = k[b*T + t, :], same for v (a kernel, not buffer copies:
//   all of a forward stays one compute pass)
//   0 params {B, T, S, W = Hkv*D, pos0} | 1 k[N, W] read | 2 v[N, W] read |
//   3 k_cache[B, S, W] write | 4 v_cache[B, S, W] write
//   dispatch: ceil(N*W / 256) workgroups split over x, y

const WG: u32 = 64u;
struct AttParams { b: u32, t: u32, h: u32, hkv: u32, d: u32, s: u32, pos0: u32, scale: f32 };
@group(0) @binding(0) var<uniform> p: AttParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> kc: array<f32>;
@group(0) @binding(3) var<storage, read> vc: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<storage, read_write> lse: array<f32>;
var<workgroup> q_sh: array<f32, 256>;
var<workgroup> p_sh: array<f32, WG>;
var<workgroup> red: array<f32, WG>;

@compute @workgroup_size(WG)
fn attention_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let g = wid.x + wid.y * nw.x;
    let N = p.b * p.t;
    if (g >= N * p.h) { return; }   // uniform per workgroup
    let n = g / p.h;
    let h = g % p.h;
    let b = n / p.t;
    let pos = p.pos0 + n % p.t;
    let kvh = h / (p.h / p.hkv);
    let D = p.d;
    let W = p.hkv * D;
    for (var d = lid; d < D; d += WG) { q_sh[d] = q[n * p.h * D + h * D + d]; }
    workgroupBarrier();
    var m = -3.0e38;
    var l = 0.0;
    var acc = vec4<f32>(0.0);   // dims lid + 64e: a vector, not a loop-indexed array (NVIDIA)
    let nkeys = pos + 1u;
    for (var j0 = 0u; j0 < nkeys; j0 += WG) {
        let j = j0 + lid;
        var sc = -3.0e38;
        if (j < nkeys) {
            let kb = (b * p.s + j) * W + kvh * D;
            var dot = 0.0;
            for (var d = 0u; d < D; d++) { dot += q_sh[d] * kc[kb + d]; }
            sc = dot * p.scale;
        }
        red[lid] = sc;
        workgroupBarrier();
        for (var st = WG / 2u; st > 0u; st = st >> 1u) {
            if (lid < st) { red[lid] = max(red[lid], red[lid + st]); }
            workgroupBarrier();
        }
        let m_new = max(m, red[0]);
        workgroupBarrier();
        var pj = 0.0;
        if (j < nkeys) { pj = exp(sc - m_new); }
        p_sh[lid] = pj;
        red[lid] = pj;
        workgroupBarrier();
        for (var st = WG / 2u; st > 0u; st = st >> 1u) {
            if (lid < st) { red[lid] += red[lid + st]; }
            workgroupBarrier();
        }
        let corr = exp(m - m_new);
        l = l * corr + red[0];
        m = m_new;
        let jend = min(WG, nkeys - j0);
        acc *= corr;
        let d0 = min(lid, D - 1u);
        let d1 = min(lid + WG, D - 1u);
        let d2 = min(lid + 2u * WG, D - 1u);
        let d3 = min(lid + 3u * WG, D - 1u);
        for (var jj = 0u; jj < jend; jj++) {
            let pj = p_sh[jj];
            let vb = (b * p.s + j0 + jj) * W + kvh * D;
            acc.x += pj * vc[vb + d0];
            if (D > WG) { acc.y += pj * vc[vb + d1]; }
            if (D > 2u * WG) {
                acc.z += pj * vc[vb + d2];
                acc.w += pj * vc[vb + d3];
            }
        }
        workgroupBarrier();
    }
    for (var e = 0u; e < 4u; e++) {
        let d = lid + e * WG;
        if (d < D) { out[n * p.h * D + h * D + d] = acc[e] / l; }
    }
    if (lid == 0u) { lse[n * p.h + h] = m + log(l); }
}

struct StoreParams { b: u32, t: u32, s: u32, w: u32, pos0: u32 };
@group(0) @binding(0) var<uniform> sp: StoreParams;
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
