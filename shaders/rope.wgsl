// rope.wgsl — rotary position embedding with HF's rotate_half convention, in place:
//   y = x cos + rotate_half(x) sin, i.e. for j < D/2, with c = cos[pos, j], s = sin[pos, j]:
//     y[j] = x[j] c - x[j + D/2] s,   y[j + D/2] = x[j + D/2] c + x[j] s
//   pos = pos0 + n % T (row n is token n % T of its sequence; pos0 > 0 when decoding
//   with a KV cache). The tables hold cos/sin of pos * inv_freq[j],
//   inv_freq[j] = 1 / theta^(2j/D), computed in f32 on the host as HF does.
//   (rope_backward, the inverse rotation, is in backward.wgsl.)
//
// rope_forward
//   0 params {N, T, H, D, pos0} | 1 x[N, H*D] read_write | 2 cos[P, D/2] read |
//   3 sin[P, D/2] read      (H is this tensor's head count: H for q, Hkv for k)
//   dispatch: ceil(N*H*D/2 / 256) workgroups split over x, y

struct RopeParams { n: u32, t: u32, h: u32, d: u32, pos0: u32 };
@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
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
