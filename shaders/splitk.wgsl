// splitk.wgsl — the second pass of a matmul whose reduction was split over workgroups
// (grid z = slice): the slices' partial sums are added in slice order and scaled.
// Few rows (N = 256 tokens) leave a 64 x 64-tiled grid too small to fill a big GPU,
// so bitlinear_forward, bitlinear_backward_input and linear_backward_input can give
// each z a range of the reduction and write raw sums to part[z, N, M] instead.
//
// splitk_reduce   y[e] (= or +=) (sum_z part[z * count + e]) * scale (/ s[e / m] if use_s)
//   Integer partials (the ternary forward) add exactly, so the result has the same bits
//   as an unsplit run.
//   0 params SplitkParams {count = N*M, slices, m, scale, accumulate, use_s} | 1 part[slices, count] read |
//   2 s[N] read | 3 y[count] read_write
//   dispatch: ceil(count / 256) workgroups split over x, y

struct SplitkParams { count: u32, slices: u32, m: u32, scale: f32, accumulate: u32, use_s: u32 };
@group(0) @binding(0) var<uniform> p: SplitkParams;
@group(0) @binding(1) var<storage, read> part: array<f32>;
@group(0) @binding(2) var<storage, read> s: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn splitk_reduce(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                 @builtin(num_workgroups) nw: vec3<u32>) {
    let e = (wid.x + wid.y * nw.x) * 256u + lid.x;
    if (e >= p.count) { return; }
    var acc = 0.0;
    for (var z = 0u; z < p.slices; z++) { acc += part[z * p.count + e]; }
    var v = acc * p.scale;
    if (p.use_s != 0u) { v = v / s[e / p.m]; }
    if (p.accumulate != 0u) { y[e] = y[e] + v; } else { y[e] = v; }
}
