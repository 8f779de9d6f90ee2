// rope.wgsl — rotary position embedding with HF's rotate_half convention, in place,
// and its backward (the inverse rotation). For j < D/2, with c = cos[pos, j], s = sin[pos, j]:
//   forward   y[j] = x[j] c - x[j + D/2] s,    y[j + D/2] = x[j + D/2] c + x[j] s
//   backward  dx[j] = dy[j] c + dy[j + D/2] s,  dx[j + D/2] = dy[j + D/2] c - dy[j] s
// pos = pos0 + n % T (row n is token n % T of its sequence; pos0 > 0 when decoding
// with a KV cache; the backward runs over whole sequences, pos0 = 0). The tables hold
// cos/sin of pos * inv_freq[j], inv_freq[j] = 1 / theta^(2j/D), computed in f32 on the
// host as HF does (ops/rope.py rope_tables). H is this tensor's head count: H for q,
// Hkv for k.
//
// rope_forward
//   0 params RopeParams {N, T, H, D, pos0} | 1 x[N, H*D] read_write | 2 cos[P, D/2] read |
//   3 sin[P, D/2] read
// rope_backward
//   0 params RopeBackwardParams {N, T, H, D} | 1 g[N, H*D] read_write (dy in, dx out) |
//   2 cos[T, D/2] read | 3 sin[T, D/2] read
// dispatch (both): ceil(N*H*D/2 / 256) workgroups split over x, y
//
// CPU variants (Device.kind "cpu", D % 8 == 0; ops/rope.py picks them): rope_forward_cpu,
// rope_backward_cpu, the same math and bindings seen as vec4, four j per invocation (a
// CPU rasteriser pays per load, nearly as much for a vec4 as for a float):
// ceil(N*H*D/8 / 256) workgroups split over x, y.

struct RopeParams { n: u32, t: u32, h: u32, d: u32, pos0: u32 };
@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;       // both entry points: x / g[N, H*D]
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;

@compute @workgroup_size(256)
fn rope_forward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wid.x + wid.y * nw.x) * 256u + lid.x;
    let half = p.d / 2u;
    if (i >= p.n * p.h * half) { return; }
    let j = i % half;
    let nh = i / half;            // n * H + head
    let n = nh / p.h;
    let pos = p.pos0 + n % p.t;
    let c = cos_t[pos * half + j];
    let s = sin_t[pos * half + j];
    let a = nh * p.d + j;
    let x1 = x[a];
    let x2 = x[a + half];
    x[a] = x1 * c - x2 * s;
    x[a + half] = x2 * c + x1 * s;
}

struct RopeBackwardParams { n: u32, t: u32, h: u32, d: u32 };
@group(0) @binding(0) var<uniform> rp_p: RopeBackwardParams;

@compute @workgroup_size(WG)
fn rope_backward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nw: vec3<u32>) {
    let half = rp_p.d / 2u;
    let k = (wid.x + wid.y * nw.x) * WG + lid.x;  // = (n * H + h) * D/2 + j
    if (k >= rp_p.n * rp_p.h * half) { return; }
    let j = k % half;
    let nh = k / half;
    let t = (nh / rp_p.h) % rp_p.t;
    let c = cos_t[t * half + j];
    let s = sin_t[t * half + j];
    let i0 = nh * rp_p.d + j;
    let a = x[i0];
    let b = x[i0 + half];
    x[i0] = a * c + b * s;
    x[i0 + half] = b * c - a * s;
}

// rope_kv_store   a forward over a KV cache (decoding): RoPE on q in place and on k as
//   it goes into the cache, v copied beside it — rope_forward on q and k, then
//   attention.wgsl's kv_store, in one dispatch with the same arithmetic (the same bits).
//   Row n = b*T + t is at position pos0 + t; k_cache[b, pos0 + t, :] = rope(k[n, :]);
//   pos0 is the uniform's plus kv_pos[0], the cache's length on the GPU (attention.wgsl
//   kv_advance), so a decoding step records the same dispatch at every position.
//   slices > 0: q, k and v are the split sums of the int8 forward before (bitlinear.wgsl
//   bitlinear_forward_i8 over q, k, v; its reduce, splitk_reduce_parts, done here with the
//   same arithmetic): a value is (sum_z part[z, n, col]) * scale_p / s[n], a row of part
//   holding q, k and v side by side (H*D + 2 Hkv*D columns); bindings 2 and 3 are part and
//   s, and q is written rotated as before (k and v themselves are not written).
//   0 params RopeKvParams {B, T, H, Hkv, D, S, pos0, slices, scale_q, scale_k, scale_v} |
//   1 q[N, H*D] read_write | 2 k[N, Hkv*D] (or part) read | 3 v[N, Hkv*D] (or s[N]) read |
//   4 k_cache[B, S, Hkv*D] read_write | 5 v_cache[B, S, Hkv*D] read_write |
//   6 cos[P, D/2] read | 7 sin[P, D/2] read | 8 kv_pos[1] u32 read
//   dispatch: ceil(N*(H + Hkv)*D/2 / 256) workgroups split over x, y; an invocation
//   rotates one pair (j, j + D/2) of a q or k head, and a k head's also copies v's pair.
struct RopeKvParams {
    b: u32, t: u32, h: u32, hkv: u32, d: u32, s: u32, pos0: u32, slices: u32,
    scale_q: f32, scale_k: f32, scale_v: f32,
};
@group(0) @binding(0) var<uniform> rk_p: RopeKvParams;
@group(0) @binding(1) var<storage, read_write> rk_q: array<f32>;
@group(0) @binding(2) var<storage, read> rk_k: array<f32>;
@group(0) @binding(3) var<storage, read> rk_v: array<f32>;
@group(0) @binding(4) var<storage, read_write> rk_kc: array<f32>;
@group(0) @binding(5) var<storage, read_write> rk_vc: array<f32>;
@group(0) @binding(6) var<storage, read> rk_cos: array<f32>;
@group(0) @binding(7) var<storage, read> rk_sin: array<f32>;
@group(0) @binding(8) var<storage, read> rk_pos: array<u32>;

// Column col of row n of q (p 0), k (1) or v (2): read, or reduced from the split sums
fn rk_in(n: u32, p: u32, col: u32) -> f32 {
    let W = rk_p.hkv * rk_p.d;
    if (rk_p.slices == 0u) {
        if (p == 0u) { return rk_q[n * rk_p.h * rk_p.d + col]; }
        if (p == 1u) { return rk_k[n * W + col]; }
        return rk_v[n * W + col];
    }
    let total = rk_p.h * rk_p.d + 2u * W;
    let count = rk_p.b * rk_p.t * total;
    let e = n * total + select(rk_p.h * rk_p.d + (p - 1u) * W, 0u, p == 0u) + col;
    var acc = 0.0;
    for (var z = 0u; z < rk_p.slices; z++) { acc += rk_k[z * count + e]; }
    let scale = select(select(rk_p.scale_v, rk_p.scale_k, p == 1u), rk_p.scale_q, p == 0u);
    return acc * scale / rk_v[n];
}

@compute @workgroup_size(256)
fn rope_kv_store(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nw: vec3<u32>) {
    let p = rk_p;
    let i = (wid.x + wid.y * nw.x) * 256u + lid.x;
    let half = p.d / 2u;
    let heads = p.h + p.hkv;
    if (i >= p.b * p.t * heads * half) { return; }
    let j = i % half;
    let n = i / half / heads;
    let h = (i / half) % heads;
    let pos = p.pos0 + rk_pos[0] + n % p.t;
    let c = rk_cos[pos * half + j];
    let s = rk_sin[pos * half + j];
    if (h < p.h) {
        let a = (n * p.h + h) * p.d + j;
        let x1 = rk_in(n, 0u, h * p.d + j);
        let x2 = rk_in(n, 0u, h * p.d + j + half);
        rk_q[a] = x1 * c - x2 * s;
        rk_q[a + half] = x2 * c + x1 * s;
        return;
    }
    let W = p.hkv * p.d;
    let col = (h - p.h) * p.d + j;
    let dst = ((n / p.t) * p.s + pos) * W + col;
    let x1 = rk_in(n, 1u, col);
    let x2 = rk_in(n, 1u, col + half);
    rk_kc[dst] = x1 * c - x2 * s;
    rk_kc[dst + half] = x2 * c + x1 * s;
    rk_vc[dst] = rk_in(n, 2u, col);
    rk_vc[dst + half] = rk_in(n, 2u, col + half);
}

// ---------------------------------------------------------------------------- CPU variants
@group(0) @binding(1) var<storage, read_write> rc_x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> rc_cos: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> rc_sin: array<vec4<f32>>;

@compute @workgroup_size(256)
fn rope_forward_cpu(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wid.x + wid.y * nw.x) * 256u + lid.x;   // = (n * H + head) * D/8 + j/4
    let q = p.d / 8u;
    if (i >= p.n * p.h * q) { return; }
    let j = i % q;
    let nh = i / q;
    let pos = p.pos0 + (nh / p.h) % p.t;
    let c = rc_cos[pos * q + j];
    let s = rc_sin[pos * q + j];
    let a = nh * 2u * q + j;
    let x1 = rc_x[a];
    let x2 = rc_x[a + q];
    rc_x[a] = x1 * c - x2 * s;
    rc_x[a + q] = x2 * c + x1 * s;
}

@compute @workgroup_size(WG)
fn rope_backward_cpu(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nw: vec3<u32>) {
    let q = rp_p.d / 8u;
    let k = (wid.x + wid.y * nw.x) * WG + lid.x;
    if (k >= rp_p.n * rp_p.h * q) { return; }
    let j = k % q;
    let nh = k / q;
    let t = (nh / rp_p.h) % rp_p.t;
    let c = rc_cos[t * q + j];
    let s = rc_sin[t * q + j];
    let i0 = nh * 2u * q + j;
    let a = rc_x[i0];
    let b = rc_x[i0 + q];
    rc_x[i0] = a * c + b * s;
    rc_x[i0 + q] = b * c - a * s;
}
