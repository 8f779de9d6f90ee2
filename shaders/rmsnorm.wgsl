// rmsnorm.wgsl — RMSNorm as HF BitNetRMSNorm computes it, in f32:
//   rstd[n] = 1 / sqrt(mean_c x[n, c]^2 + eps),  y[n, c] = w[c] * (x[n, c] * rstd[n])
// rstd is saved for rmsnorm_backward (backward.wgsl).
//
// rmsnorm_forward
//   0 params {N, C, eps} | 1 x[N, C] read | 2 w[C] read | 3 y[N, C] write | 4 rstd[N] write
//   dispatch: one workgroup (256) per row: N workgroups split over x, y

const WG: u32 = 256u;
struct NormParams { n: u32, c: u32, eps: f32 };
@group(0) @binding(0) var<uniform> p: NormParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> rstd: array<f32>;
var<workgroup> sh: array<f32, WG>;

@compute @workgroup_size(WG)
fn rmsnorm_forward(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= p.n) { return; }
    let base = n * p.c;
    var acc = 0.0;
    for (var c = lid; c < p.c; c += WG) { let v = x[base + c]; acc += v * v; }
    sh[lid] = acc;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) { sh[lid] += sh[lid + s]; }
        workgroupBarrier();
    }
    let r = inverseSqrt(sh[0] / f32(p.c) + p.eps);
    for (var c = lid; c < p.c; c += WG) { y[base + c] = w[c] * (x[base + c] * r); }
    if (lid == 0u) { rstd[n] = r; }
}
