// ffn.wgsl — BitNet's MLP gating (before ffn_sub_norm):  h = relu(g)^2 * u
// (relu2_gating_backward is in backward.wgsl; it needs g and u, so keep them.)
//
// relu2_gating_forward
//   0 params {count = N*F} | 1 g[N, F] read | 2 u[N, F] read | 3 h[N, F] write
//   dispatch: ceil(count / 256) workgroups split over x, y

struct GateParams { count: u32 };
@group(0) @binding(0) var<uniform> p: GateParams;
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> u: array<f32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(256)
fn relu2_gating_forward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wid.x + wid.y * nw.x) * 256u + lid.x;
    if (i >= p.count) { return; }
    let r = max(g[i], 0.0);
    h[i] = r * r * u[i];
}
