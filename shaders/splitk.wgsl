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
// splitk_reduce_parts   the same for bitlinear_forward_i8's parts (up to three projections
//   of one input, their outputs side by side in part[z, N, O0 + O1 + O2]): column c of row
//   n is output o of part p, and y_p[n, o] (= or +=) (sum_z part) * scale_p / s[n] (the same
//   arithmetic as splitk_reduce's).
//   0 params SplitkPartsParams {count = N*(O0+O1+O2), slices, o0, o1, o2, scale0, scale1,
//   scale2, accumulate, act} | 1 part read | 2 s[N] read | 3 y0[N, O0] | 4 y1[N, O1] |
//   5 y2[N, O2] read_write (an absent part's a spare)
//   dispatch: ceil(count / 256) workgroups split over x, y
// splitk_reduce_gated   splitk_reduce_parts of the MLP's gate and up projections (two
//   parts, O0 = O1 = F, written, not added) and their gating (relu2.wgsl) in one pass: an
//   invocation reduces g[n, c] and u[n, c], writes both and h[n, c] = gating(act, g, u)
//   into y2[N, F] (the same arithmetic as the two kernels: the same bits).
//   Bindings as splitk_reduce_parts, count = N*F, o2 = 0.

// sum_z part[z * count + e] added in slice order, four slices' loads issued together (a
// reduce of many slices, the LoRA gradients' ~26, had one load in flight a turn; the same
// bits; not yet timed on a GPU)
fn slice_sum(e: u32, count: u32, slices: u32) -> f32 {
    var acc = 0.0;
    var z = 0u;
    for (; z + 4u <= slices; z += 4u) {
        let v0 = part[z * count + e];
        let v1 = part[(z + 1u) * count + e];
        let v2 = part[(z + 2u) * count + e];
        let v3 = part[(z + 3u) * count + e];
        acc += v0;
        acc += v1;
        acc += v2;
        acc += v3;
    }
    for (; z < slices; z++) { acc += part[z * count + e]; }
    return acc;
}

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
    let acc = slice_sum(e, p.count, p.slices);
    var v = acc * p.scale;
    if (p.use_s != 0u) { v = v / s[e / p.m]; }
    if (p.accumulate != 0u) { y[e] = y[e] + v; } else { y[e] = v; }
}

struct SplitkPartsParams {
    count: u32, slices: u32, o0: u32, o1: u32, o2: u32, scale0: f32, scale1: f32, scale2: f32, accumulate: u32,
    act: u32,
};
@group(0) @binding(0) var<uniform> sp: SplitkPartsParams;
@group(0) @binding(4) var<storage, read_write> y1: array<f32>;
@group(0) @binding(5) var<storage, read_write> y2: array<f32>;

@compute @workgroup_size(256)
fn splitk_reduce_parts(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nw: vec3<u32>) {
    let e = (wid.x + wid.y * nw.x) * 256u + lid.x;
    if (e >= sp.count) { return; }
    let total = sp.o0 + sp.o1 + sp.o2;
    let n = e / total;
    let c = e % total;
    let acc = slice_sum(e, sp.count, sp.slices);
    var scale = sp.scale0;   // column c is output o of part p: y_p[n, o]
    var i = n * sp.o0 + c;
    var which = 0u;
    if (c >= sp.o0 + sp.o1) {
        scale = sp.scale2;
        i = n * sp.o2 + c - sp.o0 - sp.o1;
        which = 2u;
    } else if (c >= sp.o0) {
        scale = sp.scale1;
        i = n * sp.o1 + c - sp.o0;
        which = 1u;
    }
    var v = acc * scale / s[n];
    if (which == 0u) { if (sp.accumulate != 0u) { v = y[i] + v; } y[i] = v; }
    if (which == 1u) { if (sp.accumulate != 0u) { v = y1[i] + v; } y1[i] = v; }
    if (which == 2u) { if (sp.accumulate != 0u) { v = y2[i] + v; } y2[i] = v; }
}

@compute @workgroup_size(256)
fn splitk_reduce_gated(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nw: vec3<u32>) {
    let e = (wid.x + wid.y * nw.x) * 256u + lid.x;
    if (e >= sp.count) { return; }
    let n = e / sp.o0;
    let at = e + n * sp.o0;     // g's column in part's row n (of 2 F); u's is F further
    let all = 2u * sp.count;
    var ag = 0.0;
    var au = 0.0;
    for (var z = 0u; z < sp.slices; z++) {
        ag += part[z * all + at];
        au += part[z * all + at + sp.o0];
    }
    let g = ag * sp.scale0 / s[n];
    let u = au * sp.scale1 / s[n];
    y[e] = g;
    y1[e] = u;
    y2[e] = gating(sp.act, g, u);
}
