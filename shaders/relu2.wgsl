// relu2.wgsl — BitNet's MLP gating (before ffn_sub_norm) and its backward, in the two
// activations a BitNet checkpoint may name (config hidden_act; docs/FORMATS.md):
//   relu2 (b1.58 2B-4T):  h = relu(g)^2 * u,   dg = 2 relu(g) u dh,   du = relu(g)^2 dh
//   silu (1bitLLM, the GGUF arch `bitnet`):  h = silu(g) * u,  silu(g) = g sigmoid(g),
//         dg = u dh sigmoid(g) (1 + g (1 - sigmoid(g))),   du = silu(g) dh
// (all overwrite). The backward needs g and u, so forward keeps them.
//
// relu2_gating_forward
//   0 params Relu2Params {count = N*F} | 1 g[N, F] read | 2 u[N, F] read | 3 h[N, F] write
// relu2_gating_backward
//   0 params Relu2Params {count} | 1 dh[N, F] read | 2 g[N, F] read | 3 u[N, F] read |
//   4 dg[N, F] write | 5 du[N, F] write
// silu_gating_forward, silu_gating_backward: the same bindings as their relu2 twins
// (the forward's arithmetic is the prelude's `gating`, shared with matvec.wgsl)
// dispatch (all): ceil(count / 256) workgroups split over x, y
//
// CPU variants (Device.kind "cpu", count % 4 == 0; ops/relu2.py picks them): *_cpu, the
// same math and bindings seen as vec4, four elements per invocation (a CPU rasteriser
// pays per load, nearly as much for a vec4 as for a float): ceil(count / 1024)
// workgroups (256) split over x, y.

struct Relu2Params { count: u32 };
@group(0) @binding(0) var<uniform> p: Relu2Params;   // both entry points
@group(0) @binding(1) var<storage, read> g: array<f32>;
@group(0) @binding(2) var<storage, read> u: array<f32>;
@group(0) @binding(3) var<storage, read_write> h: array<f32>;

@compute @workgroup_size(WG)
fn relu2_gating_forward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wid.x + wid.y * nw.x) * WG + lid.x;
    if (i >= p.count) { return; }
    h[i] = gating(GATE_RELU2, g[i], u[i]);
}

@group(0) @binding(1) var<storage, read> gt_dh: array<f32>;
@group(0) @binding(2) var<storage, read> gt_g: array<f32>;
@group(0) @binding(3) var<storage, read> gt_u: array<f32>;
@group(0) @binding(4) var<storage, read_write> gt_dg: array<f32>;
@group(0) @binding(5) var<storage, read_write> gt_du: array<f32>;

@compute @workgroup_size(WG)
fn relu2_gating_backward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                         @builtin(num_workgroups) nw: vec3<u32>) {
    let k = (wid.x + wid.y * nw.x) * WG + lid.x;
    if (k >= p.count) { return; }
    let a = max(gt_g[k], 0.0);
    let dh = gt_dh[k];
    gt_dg[k] = 2.0 * a * gt_u[k] * dh;
    gt_du[k] = a * a * dh;
}

@compute @workgroup_size(WG)
fn silu_gating_forward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wid.x + wid.y * nw.x) * WG + lid.x;
    if (i >= p.count) { return; }
    h[i] = gating(GATE_SILU, g[i], u[i]);
}

@compute @workgroup_size(WG)
fn silu_gating_backward(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                        @builtin(num_workgroups) nw: vec3<u32>) {
    let k = (wid.x + wid.y * nw.x) * WG + lid.x;
    if (k >= p.count) { return; }
    let x = gt_g[k];
    let sg = sigmoid(x);
    let dh = gt_dh[k];
    gt_dg[k] = gt_u[k] * dh * sg * (1.0 + x * (1.0 - sg));
    gt_du[k] = x * sg * dh;
}

// ---------------------------------------------------------------------------- CPU variants
@group(0) @binding(1) var<storage, read> gc_g: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> gc_u: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> gc_h: array<vec4<f32>>;

fn gc_index(lid: vec3<u32>, wid: vec3<u32>, nw: vec3<u32>) -> u32 { return (wid.x + wid.y * nw.x) * WG + lid.x; }

@compute @workgroup_size(WG)
fn relu2_gating_forward_cpu(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                            @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gc_index(lid, wid, nw);
    if (i >= p.count / 4u) { return; }
    let r = max(gc_g[i], vec4<f32>(0.0));
    gc_h[i] = r * r * gc_u[i];
}

@compute @workgroup_size(WG)
fn silu_gating_forward_cpu(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                           @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gc_index(lid, wid, nw);
    if (i >= p.count / 4u) { return; }
    let x = gc_g[i];
    gc_h[i] = x * sigmoid4(x) * gc_u[i];
}

@group(0) @binding(1) var<storage, read> gb_dh: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> gb_g: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> gb_u: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> gb_dg: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> gb_du: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn relu2_gating_backward_cpu(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                             @builtin(num_workgroups) nw: vec3<u32>) {
    let k = gc_index(lid, wid, nw);
    if (k >= p.count / 4u) { return; }
    let a = max(gb_g[k], vec4<f32>(0.0));
    let dh = gb_dh[k];
    gb_dg[k] = 2.0 * a * gb_u[k] * dh;
    gb_du[k] = a * a * dh;
}

@compute @workgroup_size(WG)
fn silu_gating_backward_cpu(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                            @builtin(num_workgroups) nw: vec3<u32>) {
    let k = gc_index(lid, wid, nw);
    if (k >= p.count / 4u) { return; }
    let x = gb_g[k];
    let sg = sigmoid4(x);
    let dh = gb_dh[k];
    gb_dg[k] = gb_u[k] * dh * sg * (1.0 + x * (1.0 - sg));
    gb_du[k] = x * sg * dh;
}

fn sigmoid4(x: vec4<f32>) -> vec4<f32> {   // sigmoid of each component, as sigmoid
    let e = exp(-abs(x));
    return select(e / (1.0 + e), 1.0 / (1.0 + e), x >= vec4<f32>(0.0));
}
