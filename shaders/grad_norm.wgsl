// grad_norm.wgsl — global gradient norm, clip factor and in-place gradient scaling
// over the gradient arena: every trainable tensor in one flat f32 buffer g[n].
//
// Layout (built by bitlora.optim.ParamArena): tensors start on 64-float boundaries,
// padding is zero, n is a multiple of 64. The arena is cut into blocks, each inside
// one tensor and at most BLOCK4 vec4 long (override, 4096 by default):
//   blocks[nb]  vec2<u32> (start4, count4)        in vec4 units
//   tensors[nt] vec2<u32> (first_block, end_block)
//
// Math (torch.nn.utils.clip_grad_norm_ on the loss-normalised gradient s*g, s = 1/num_target_tokens):
//   sumsq = sum over all tensors and elements of (s*g)^2      (two passes, no float atomics)
//   norm  = sqrt(sumsq)                                       (returned: the pre-clip norm)
//   clip  = min(1, max_norm / (norm + 1e-6))                  (1 when max_norm <= 0: no clipping)
//   gmul  = s * clip                                          (AdamW multiplies every g by it)
// A non-finite sumsq (a NaN or Inf gradient) skips the step: skip = 1, skipped += 1,
// gmul = 0; adamw.wgsl then leaves parameters and moments alone (AMP GradScaler's rule).
//
// State: the prelude's 16-word optimizer state (adamw.wgsl reads it).
//
// Entry points (dispatch rule after the bindings):
// sumsq_blocks:     0 params SumsqBlocksParams {scale} | 1 g[n/4] vec4 read | 2 blocks[nb] read | 3 partial[nb] write
//                   one workgroup per block (split over x, y): partial[b] = sum_b (scale*g)^2
// sumsq_finish:     0 params SumsqFinishParams {nb, scale, max_norm} | 1 partial[nb] read | 2 state read_write
//                   one workgroup: sumsq, norm, clip, gmul, skip as above
// sumsq_per_tensor: 0 params SumsqTensorParams {nt} | 1 partial[nb] read | 2 tensors[nt] read | 3 tsumsq[nt] write
//                   one workgroup per tensor (logging only; not part of the fused step)
// sumsq_accumulate: 0 params SumsqAccParams {nb} | 1 partial[nb] read | 2 acc[1] read_write
//                   one workgroup: acc[0] += sum of partial (the seed's accumulator)
// clip_from_acc:    0 params ClipParams {max_norm} | 1 acc[1] read | 2 state read_write
//                   one workgroup: norm = sqrt(acc[0]), clip as above into state
// scale_const:      0 params ScaleParams {factor, n4} | 1 g[n/4] vec4 read_write      ceil(n4/256) workgroups
// scale_by_clip:    0 params ScaleClipParams {n4} | 1 g[n/4] vec4 read_write | 2 state read ceil(n4/256) workgroups

override BLOCK4: u32 = 4096u;  // vec4s in a full block (ParamArena.block4), a multiple of WG

// WGSL has no isinf/isnan: an all-ones exponent means Inf or NaN.
fn is_finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

fn clip_factor(norm: f32, max_norm: f32) -> f32 {
    if (max_norm <= 0.0) { return 1.0; }
    return min(1.0, max_norm / (norm + 1e-6));
}

// ---------------------------------------------------------------- pass 1
struct SumsqBlocksParams { scale: f32 };
@group(0) @binding(0) var<uniform> bp: SumsqBlocksParams;
@group(0) @binding(1) var<storage, read> g_in: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> blocks: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> partial_out: array<f32>;

@compute @workgroup_size(WG)
fn sumsq_blocks(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nw: vec3<u32>) {
    let b = wid.x + wid.y * nw.x;
    if (b >= arrayLength(&blocks)) { return; }  // uniform per workgroup
    let blk = blocks[b];
    var acc = 0.0;
    if (blk.y == BLOCK4 && (BLOCK4 / WG) % 4u == 0u) {
        // a full block: a constant trip count and four independent loads per iteration
        // keep several loads of each thread in flight
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        var a2 = vec4<f32>(0.0);
        var a3 = vec4<f32>(0.0);
        for (var k = 0u; k < BLOCK4 / WG; k += 4u) {
            let at = blk.x + k * WG + lid.x;
            let x0 = g_in[at] * bp.scale;
            let x1 = g_in[at + WG] * bp.scale;
            let x2 = g_in[at + 2u * WG] * bp.scale;
            let x3 = g_in[at + 3u * WG] * bp.scale;
            a0 += x0 * x0;
            a1 += x1 * x1;
            a2 += x2 * x2;
            a3 += x3 * x3;
        }
        let a = (a0 + a1) + (a2 + a3);
        acc = (a.x + a.y) + (a.z + a.w);
    } else if (blk.y == BLOCK4) {
        var a = vec4<f32>(0.0);
        for (var k = 0u; k < BLOCK4 / WG; k++) {
            let x = g_in[blk.x + k * WG + lid.x] * bp.scale;
            a += x * x;
        }
        acc = (a.x + a.y) + (a.z + a.w);
    } else {
        for (var i = lid.x; i < blk.y; i += WG) {
            let x = g_in[blk.x + i] * bp.scale;
            acc += dot(x, x);
        }
    }
    let total = wg_sum(lid.x, acc, WG);
    if (lid.x == 0u) { partial_out[b] = total; }
}

// sumsq_blocks_cpu   sumsq_blocks for CPUs (Device.kind "cpu"; bindings as there): one
//   invocation per block, its sum in four private vec4s, no barriers (a CPU runs a
//   workgroup as a loop, and sumsq_blocks' eight barriers over 256 invocations cost
//   SwiftShader more than the sums). The sum is ordered differently from the tree's.
//   dispatch: ceil(nb / GC) workgroups split over x, y.
const GC: u32 = 8u;  // invocations (blocks) per workgroup of the CPU variants

@compute @workgroup_size(GC)
fn sumsq_blocks_cpu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let b = gid.x + gid.y * nw.x * GC;
    if (b >= arrayLength(&blocks)) { return; }
    let blk = blocks[b];
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0); var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    var k = 0u;
    for (; k + 3u < blk.y; k += 4u) {
        let x0 = g_in[blk.x + k] * bp.scale; let x1 = g_in[blk.x + k + 1u] * bp.scale;
        let x2 = g_in[blk.x + k + 2u] * bp.scale; let x3 = g_in[blk.x + k + 3u] * bp.scale;
        a0 += x0 * x0; a1 += x1 * x1; a2 += x2 * x2; a3 += x3 * x3;
    }
    for (; k < blk.y; k++) { let x = g_in[blk.x + k] * bp.scale; a0 += x * x; }
    let a = (a0 + a1) + (a2 + a3);
    partial_out[b] = (a.x + a.y) + (a.z + a.w);
}

// ---------------------------------------------------------------- pass 2
struct SumsqFinishParams { nb: u32, scale: f32, max_norm: f32 };
@group(0) @binding(0) var<uniform> fp: SumsqFinishParams;
@group(0) @binding(1) var<storage, read> partial_in: array<f32>;
@group(0) @binding(2) var<storage, read_write> state: State;

@compute @workgroup_size(WG)
fn sumsq_finish(@builtin(local_invocation_id) lid: vec3<u32>) {
    var acc = 0.0;
    for (var i = lid.x; i < fp.nb; i += WG) { acc += partial_in[i]; }
    let sumsq = wg_sum(lid.x, acc, WG);
    if (lid.x == 0u) { finish_state(sumsq); }
}

fn finish_state(sumsq: f32) {   // state.sumsq, norm, clip, gmul, skip from the sum
    let norm = sqrt(sumsq);
    state.sumsq = sumsq;
    state.norm = norm;
    if (is_finite(sumsq)) {
        let clip = clip_factor(norm, fp.max_norm);
        state.clip = clip;
        state.gmul = fp.scale * clip;
        state.skip = 0u;
    } else {
        state.clip = 0.0;
        state.gmul = 0.0;
        state.skip = 1u;
        state.skipped += 1u;
    }
}

// sumsq_finish_cpu   sumsq_finish for CPUs (bindings as there): one invocation sums the
//   partials in order, no barriers. dispatch: one workgroup.
@compute @workgroup_size(1)
fn sumsq_finish_cpu() {
    var acc = 0.0;
    for (var i = 0u; i < fp.nb; i++) { acc += partial_in[i]; }
    finish_state(acc);
}

// ---------------------------------------------------------------- per-tensor sums (logging)
struct SumsqTensorParams { nt: u32 };
@group(0) @binding(0) var<uniform> tp: SumsqTensorParams;
@group(0) @binding(1) var<storage, read> partial_t: array<f32>;
@group(0) @binding(2) var<storage, read> tensors: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> tsumsq: array<f32>;

@compute @workgroup_size(WG)
fn sumsq_per_tensor(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                    @builtin(num_workgroups) nw: vec3<u32>) {
    let t = wid.x + wid.y * nw.x;
    if (t >= tp.nt) { return; }
    let r = tensors[t];
    var acc = 0.0;
    for (var i = r.x + lid.x; i < r.y; i += WG) { acc += partial_t[i]; }
    let total = wg_sum(lid.x, acc, WG);
    if (lid.x == 0u) { tsumsq[t] = total; }
}

// ---------------------------------------------------------------- the seed's separate operations
struct SumsqAccParams { nb: u32 };
@group(0) @binding(0) var<uniform> ap: SumsqAccParams;
@group(0) @binding(1) var<storage, read> partial_a: array<f32>;
@group(0) @binding(2) var<storage, read_write> acc_rw: array<f32>;

@compute @workgroup_size(WG)
fn sumsq_accumulate(@builtin(local_invocation_id) lid: vec3<u32>) {
    var acc = 0.0;
    for (var i = lid.x; i < ap.nb; i += WG) { acc += partial_a[i]; }
    let total = wg_sum(lid.x, acc, WG);
    if (lid.x == 0u) { acc_rw[0] = acc_rw[0] + total; }
}

struct ClipParams { max_norm: f32 };
@group(0) @binding(0) var<uniform> cp: ClipParams;
@group(0) @binding(1) var<storage, read> acc_in: array<f32>;
@group(0) @binding(2) var<storage, read_write> clip_state: State;

@compute @workgroup_size(1)
fn clip_from_acc() {
    let sumsq = acc_in[0];
    let norm = sqrt(sumsq);
    clip_state.sumsq = sumsq;
    clip_state.norm = norm;
    clip_state.clip = clip_factor(norm, cp.max_norm);
}

struct ScaleParams { factor: f32, n4: u32 };
@group(0) @binding(0) var<uniform> sp: ScaleParams;
@group(0) @binding(1) var<storage, read_write> g_rw: array<vec4<f32>>;

@compute @workgroup_size(WG)
fn scale_const(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * WG;
    if (i < sp.n4) { g_rw[i] = g_rw[i] * sp.factor; }
}

struct ScaleClipParams { n4: u32 };
@group(0) @binding(0) var<uniform> scp: ScaleClipParams;
@group(0) @binding(1) var<storage, read_write> g_clip: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> scale_state: State;

@compute @workgroup_size(WG)
fn scale_by_clip(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * WG;
    if (i < scp.n4) { g_clip[i] = g_clip[i] * scale_state.clip; }
}
