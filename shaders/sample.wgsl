// sample.wgsl — the next token, chosen on the GPU from one row of logits, so that a
// decoding step sends back 4 bytes (its id) instead of V floats, and the next step's
// embedding reads the id where this kernel left it: a host can submit several steps
// ahead and read their ids back later (model.py agenerate).
//
// sample_token
//   temperature <= 0 (greedy): the first index of the largest logit (torch.argmax's,
//     HF's greedy search's).
//   temperature > 0: nucleus sampling. p_i = exp((l_i - max) / temperature) / z; the kept
//     set is {p_i >= theta}, theta the largest value whose set still holds top_p of the
//     probability (32 bisection steps over [0, 1]; top_p >= 1 keeps every token): the
//     smallest set of most likely tokens reaching top_p, as HF's TopPLogitsWarper keeps.
//     The token is drawn from the kept set, in vocabulary order, at u * (its mass) with
//     u = pcg(seed ^ pcg(n)) / 2^24 in [0, 1) (its top 24 bits): a seed and a step give
//     one token.
//   Then tok[0] = id (the next step's embedding input), out[n] = id, state.n = n + 1.
//   0 params SampleParams {V} | 1 logits[V] read |
//   2 state[4] read_write: {n u32 (tokens chosen so far), seed u32, temperature f32, top_p f32} |
//   3 tok[1] u32 read_write | 4 out[M] u32 read_write (ids in order; n >= M is not kept)
//   dispatch: one workgroup of SP_WG threads (256; CPU adapters 16: ops/sample.py). They
//   read strided columns for the maximum and the sums, contiguous chunks of V / SP_WG for
//   the draw (a prefix sum over the chunks finds the one that holds it).

struct SampleParams { v: u32 };
@group(0) @binding(0) var<uniform> sp: SampleParams;
@group(0) @binding(1) var<storage, read> sp_logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> sp_state: array<u32>;
@group(0) @binding(3) var<storage, read_write> sp_tok: array<u32>;
@group(0) @binding(4) var<storage, read_write> sp_out: array<u32>;
override SP_WG: u32 = 256u;   // threads of the one workgroup (a power of two, at most WG)
var<workgroup> sp_val: array<f32, WG>;
var<workgroup> sp_idx: array<u32, WG>;
var<workgroup> sp_temp: f32;
var<workgroup> sp_top_p: f32;
var<workgroup> sp_total: f32;
var<workgroup> sp_pick: u32;

fn sp_prob(i: u32, m: f32, t: f32, z: f32) -> f32 {   // p_i
    return exp((sp_logits[i] - m) / t) / z;
}

@compute @workgroup_size(SP_WG)
fn sample_token(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let V = sp.v;
    // the largest logit, first index among equals
    var best = NEG_BIG;
    var bi = 0u;
    var i0 = lid;
    for (; i0 + 3u * SP_WG < V; i0 += 4u * SP_WG) {   // four loads in flight, compared in column order
        let v0 = sp_logits[i0];
        let v1 = sp_logits[i0 + SP_WG];
        let v2 = sp_logits[i0 + 2u * SP_WG];
        let v3 = sp_logits[i0 + 3u * SP_WG];
        if (v0 > best || i0 == lid) { best = v0; bi = i0; }
        if (v1 > best) { best = v1; bi = i0 + SP_WG; }
        if (v2 > best) { best = v2; bi = i0 + 2u * SP_WG; }
        if (v3 > best) { best = v3; bi = i0 + 3u * SP_WG; }
    }
    for (var i = i0; i < V; i += SP_WG) {
        let v = sp_logits[i];
        if (v > best || i == lid) { best = v; bi = i; }
    }
    sp_val[lid] = best;
    sp_idx[lid] = select(0xffffffffu, bi, lid < V);
    if (lid == 0u) {
        sp_temp = bitcast<f32>(sp_state[2]);
        sp_top_p = bitcast<f32>(sp_state[3]);
    }
    workgroupBarrier();
    for (var s = SP_WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let b = sp_val[lid + s];
            let ib = sp_idx[lid + s];
            if (b > sp_val[lid] || (b == sp_val[lid] && ib < sp_idx[lid])) {
                sp_val[lid] = b;
                sp_idx[lid] = ib;
            }
        }
        workgroupBarrier();
    }
    let m = sp_val[0];
    if (lid == 0u) { sp_pick = sp_idx[0]; }
    let t = workgroupUniformLoad(&sp_temp);    // also the barrier before sp_val is reused
    if (t > 0.0) {
        var z = 0.0;
        for (var i = lid; i < V; i += SP_WG) { z += exp((sp_logits[i] - m) / t); }
        z = wg_sum(lid, z, SP_WG);
        let top_p = workgroupUniformLoad(&sp_top_p);
        var lo = 0.0;
        if (top_p < 1.0) {
            var hi = 1.0;
            for (var it = 0u; it < 32u; it++) {
                let mid = 0.5 * (lo + hi);
                var mass = 0.0;
                for (var i = lid; i < V; i += SP_WG) { let q = sp_prob(i, m, t, z); if (q >= mid) { mass += q; } }
                if (wg_sum(lid, mass, SP_WG) >= top_p) { lo = mid; } else { hi = mid; }
            }
        }
        let chunk = (V + SP_WG - 1u) / SP_WG;
        let i0 = min(lid * chunk, V);
        let i1 = min(i0 + chunk, V);
        var part = 0.0;
        for (var i = i0; i < i1; i++) { let q = sp_prob(i, m, t, z); if (q >= lo) { part += q; } }
        sp_val[lid] = part;
        workgroupBarrier();
        if (lid == 0u) {          // exclusive prefix sums of the chunks' kept mass
            var run = 0.0;
            for (var j = 0u; j < SP_WG; j++) { let v = sp_val[j]; sp_val[j] = run; run += v; }
            sp_total = run;
        }
        workgroupBarrier();
        let u = f32(pcg(sp_state[1] ^ pcg(sp_state[0])) >> 8u) / 16777216.0;
        let r = u * sp_total;
        let start = sp_val[lid];
        if (part > 0.0 && r >= start && r < start + part) {
            var run = start;
            var last = i0;
            var found = false;
            for (var i = i0; i < i1 && !found; i++) {
                let q = sp_prob(i, m, t, z);
                if (q >= lo) {
                    last = i;
                    run += q;
                    found = r < run;
                }
            }
            sp_pick = last;       // the chunk's last kept token if rounding left r past its sum
        }
    }
    workgroupBarrier();
    if (lid == 0u) {
        let n = sp_state[0];
        let tok = min(sp_pick, V - 1u);
        sp_tok[0] = tok;
        if (n < arrayLength(&sp_out)) { sp_out[n] = tok; }
        sp_state[0] = n + 1u;
    }
}
