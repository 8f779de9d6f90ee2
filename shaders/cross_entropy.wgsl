// cross_entropy.wgsl — masked next-token cross-entropy over the vocabulary, forward
// and backward in one pass, written over the logits in place (logits[N, V] become
// dlogits[N, V]: a [N, V] f32 buffer is the largest activation, so no second one).
//
// Math, per row n with target t = targets[n] (already shifted: the label of the
// NEXT token; t < 0, e.g. -100, or t >= V means "masked", as HF's ignore_index):
//   lse[n]     = log sum_j exp(logits[n, j])              (max-shifted, online)
//   losses[n]  = lse[n] - logits[n, t]                    (0 for a masked row)
//   dlogits[n, j] = grad_scale * (exp(logits[n, j] - lse[n]) - [j == t])
//                                                         (0 everywhere for a masked row)
// grad_scale is the loss normalisation, 1 / (number of target tokens of the whole
// optimizer step), so dlogits is d(mean loss)/d(logits).
//
// Entry points:
// cross_entropy_forward_backward:
//   0 params CrossEntropyParams {N, V, grad_scale} | 1 logits[N, V] read_write (-> dlogits) |
//   2 targets[N] i32 read | 3 losses[N] write
//   dispatch: one workgroup (256) per row, N workgroups split over x, y (gpu.groups_1d);
//   the row is walked with a stride of 256, so any V (128256 included) works.
// cross_entropy_sum:
//   0 params CrossEntropySumParams {N} | 1 losses[N] read | 2 loss_sum[1] read_write
//   dispatch: one workgroup. loss_sum[0] += sum_n losses[n] (accumulates over the
//   micro-batches of a step; clear it at the start of the step).
//
// CPU variants (Device.kind "cpu"; a CPU runs a workgroup as a loop on one thread, SIMD
// across invocations, so: no barriers, no workgroup memory):
// cross_entropy_forward_backward_rows (V % 4 == 0): bindings as above, logits seen as
//   vec4; one row per invocation (4 online (max, sum) pairs, one per vec4 lane, merged at
//   the end), CER rows per workgroup: ceil(N / CER) workgroups split over x, y.
// cross_entropy_sum_serial: bindings as cross_entropy_sum; one invocation adds the N
//   losses in order. dispatch: one workgroup.

var<workgroup> sh_m: array<f32, WG>;
var<workgroup> sh_l: array<f32, WG>;
var<workgroup> sh_t: f32;

// ----------------------------------------------------------------------------
struct CrossEntropyParams { n: u32, v: u32, grad_scale: f32 };
@group(0) @binding(0) var<uniform> cp: CrossEntropyParams;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read> targets: array<i32>;
@group(0) @binding(3) var<storage, read_write> losses: array<f32>;

@compute @workgroup_size(WG)
fn cross_entropy_forward_backward(@builtin(local_invocation_id) lid3: vec3<u32>,
                                  @builtin(workgroup_id) wid: vec3<u32>,
                                  @builtin(num_workgroups) nw: vec3<u32>) {
    let lid = lid3.x;
    let n = wid.x + wid.y * nw.x;
    if (n >= cp.n) { return; }  // uniform per workgroup
    let V = cp.v;
    let base = n * V;
    let t = targets[n];
    let valid = t >= 0 && u32(t) < V;

    // online (max, sum of exp) per thread, then a tree combine
    var m = NEG_BIG;
    var l = 0.0;
    for (var j = lid; j < V; j += WG) {
        let z = logits[base + j];
        if (z > m) { l = l * exp(m - z) + 1.0; m = z; } else { l += exp(z - m); }
    }
    sh_m[lid] = m;
    sh_l[lid] = l;
    if (lid == 0u) { var zt = 0.0; if (valid) { zt = logits[base + u32(t)]; } sh_t = zt; }
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (lid < s) {
            let m1 = sh_m[lid];
            let m2 = sh_m[lid + s];
            let mm = max(m1, m2);
            sh_l[lid] = sh_l[lid] * exp(m1 - mm) + sh_l[lid + s] * exp(m2 - mm);
            sh_m[lid] = mm;
        }
        workgroupBarrier();
    }
    let lse = sh_m[0] + log(sh_l[0]);
    let zt = sh_t;
    storageBarrier();  // every read of the row (thread 0's logits[t] too) before any write

    if (lid == 0u) { losses[n] = select(0.0, lse - zt, valid); }
    let gs = select(0.0, cp.grad_scale, valid);
    for (var j = lid; j < V; j += WG) {
        var p = exp(logits[base + j] - lse);
        if (valid && j == u32(t)) { p -= 1.0; }
        logits[base + j] = gs * p;
    }
}

// ----------------------------------------------------------------------------
struct CrossEntropySumParams { n: u32 };
@group(0) @binding(0) var<uniform> sp: CrossEntropySumParams;
@group(0) @binding(1) var<storage, read> losses_in: array<f32>;
@group(0) @binding(2) var<storage, read_write> loss_sum: array<f32>;

@compute @workgroup_size(WG)
fn cross_entropy_sum(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    var acc = 0.0;
    for (var i = lid; i < sp.n; i += WG) { acc += losses_in[i]; }
    let total = wg_sum(lid, acc, WG);
    if (lid == 0u) { loss_sum[0] = loss_sum[0] + total; }
}

// ---------------------------------------------------------------------------- CPU variants
const CER: u32 = 16u;  // rows (invocations) per workgroup

@group(0) @binding(0) var<uniform> cr_p: CrossEntropyParams;
@group(0) @binding(1) var<storage, read_write> cr_logits: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> cr_targets: array<i32>;
@group(0) @binding(3) var<storage, read_write> cr_losses: array<f32>;

@compute @workgroup_size(CER)
fn cross_entropy_forward_backward_rows(@builtin(global_invocation_id) gid: vec3<u32>,
                                       @builtin(num_workgroups) nw: vec3<u32>) {
    let n = gid.x + gid.y * nw.x * CER;
    if (n >= cr_p.n) { return; }
    let V4 = cr_p.v / 4u;
    let base = n * V4;
    let t = cr_targets[n];
    let valid = t >= 0 && u32(t) < cr_p.v;
    var m = vec4<f32>(NEG_BIG);
    var l = vec4<f32>(0.0);
    for (var j = 0u; j < V4; j++) {
        let z = cr_logits[base + j];
        let mm = max(m, z);
        l = l * exp(m - mm) + exp(z - mm);
        m = mm;
    }
    let mx = max(max(m.x, m.y), max(m.z, m.w));
    let ls = l * exp(m - mx);
    let lse = mx + log((ls.x + ls.y) + (ls.z + ls.w));
    var zt = 0.0;
    if (valid) { zt = cr_logits[base + u32(t) / 4u][u32(t) % 4u]; }
    cr_losses[n] = select(0.0, lse - zt, valid);
    let gs = select(0.0, cr_p.grad_scale, valid);
    for (var j = 0u; j < V4; j++) {
        var p = exp(cr_logits[base + j] - lse);
        if (valid && j == u32(t) / 4u) { p[u32(t) % 4u] -= 1.0; }
        cr_logits[base + j] = gs * p;
    }
}

@group(0) @binding(0) var<uniform> cs_p: CrossEntropySumParams;
@group(0) @binding(1) var<storage, read> cs_losses: array<f32>;
@group(0) @binding(2) var<storage, read_write> cs_sum: array<f32>;

@compute @workgroup_size(1)
fn cross_entropy_sum_serial() {
    var acc = 0.0;
    for (var i = 0u; i < cs_p.n; i++) { acc += cs_losses[i]; }
    cs_sum[0] = cs_sum[0] + acc;
}
