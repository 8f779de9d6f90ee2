// hello.wgsl — the smallest real kernel: y = a * x + y over n floats.
// Proves the whole loop (Python -> WGSL -> GPU -> Python) in both backends.
//
// axpy: 0 params AxpyParams {a, n} | 1 x[n] read | 2 y[n] read_write
// dispatch: ceil(n / 256) workgroups, split over x and y (see gpu.groups_1d).

struct AxpyParams { a: f32, n: u32 };

@group(0) @binding(0) var<uniform> params: AxpyParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn axpy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if (i < params.n) {
        y[i] = params.a * x[i] + y[i];
    }
}
