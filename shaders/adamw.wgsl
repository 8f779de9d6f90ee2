// adamw.wgsl — torch.optim.AdamW over the flat parameter arena, in place, gradients
// zeroed after use (unless ZERO_G is false: a trainer whose first micro-batch writes
// the gradients instead of adding saves those 4 bytes per parameter). Hyperparameters arrive in the params uniform (written every step,
// so a scheduler may change lr without recompiling); the step counter, the gradient
// multiplier and the skip flag live in the GPU state buffer that grad_norm.wgsl fills.
//
// Math, per element, with gr = g * state.gmul (gmul = clip factor / num_target_tokens):
//   p = p * (1 - lr*wd)                        decoupled decay first (decay arrives precomputed)
//   m = lerp(m, gr, 1 - b1)                    = b1*m + (1-b1)*gr, in torch's lerp_ form
//   v = b2*v + (1-b2)*gr*gr
//   p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
// with step_size = lr / (1 - b1^t), bc2_sqrt = sqrt(1 - b2^t): the same as
// p - lr * (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps), eps outside the square root.
// 1 - b^t is computed as -expm1(t * ln b), ln b from the host in double precision, so a
// beta2 of 0.999 rounded to f32 does not cost the bias correction 1e-5 of accuracy.
//
// State: the prelude's 16-word optimizer state, filled by grad_norm.wgsl.
//
// adamw_begin: 0 params AdamWParams | 1 state read_write          one workgroup of one invocation
//   plain = 1 (the separate-ops path): gmul = 1, skip = 0 first. Then, unless skip:
//   t = ++step, step_size and bc2_sqrt as above. A skipped step leaves t alone.
// adamw:       0 params AdamWParams | 1 p[n/4] | 2 g[n/4] | 3 m[n/4] | 4 v[n/4] vec4 read_write |
//              5 state read                       ceil(n4/(256*PER)) workgroups, split over x, y
//   Each invocation updates PER vec4s, WG apart (override; more loads in flight per thread).
//   skip = 1: only g = 0 (nothing with ZERO_G false). Zero padding stays zero (g = m = v = p = 0 gives p = 0).

struct AdamWParams {
    lr: f32, decay: f32, omb1: f32, b2: f32,
    omb2: f32, eps: f32, ln_b1: f32, ln_b2: f32,
    n4: u32, plain: u32,
};

@group(0) @binding(0) var<uniform> hp: AdamWParams;

// exp(x) - 1 without cancellation for small |x| (WGSL has no expm1).
fn expm1(x: f32) -> f32 {
    if (abs(x) < 0.25) {
        var term = x;
        var sum = x;
        for (var k = 2; k < 11; k++) {
            term *= x / f32(k);
            sum += term;
        }
        return sum;
    }
    return exp(x) - 1.0;
}

@group(0) @binding(1) var<storage, read_write> begin_state: State;

@compute @workgroup_size(1)
fn adamw_begin() {
    if (hp.plain == 1u) {
        begin_state.gmul = 1.0;
        begin_state.skip = 0u;
    }
    if (begin_state.skip == 0u) {
        let t = begin_state.step + 1u;
        begin_state.step = t;
        let bc1 = -expm1(f32(t) * hp.ln_b1);
        let bc2 = -expm1(f32(t) * hp.ln_b2);
        begin_state.step_size = hp.lr / bc1;
        begin_state.bc2_sqrt = sqrt(bc2);
    }
}

@group(0) @binding(1) var<storage, read_write> p: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> g: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> m: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> v: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> state: State;

override PER: u32 = 1u;  // vec4s per invocation (ops/adamw.py PER_THREAD)
override ZERO_G: bool = true;  // zero g after use (false: the next step's first backward writes it)

fn adamw_one(i: u32) {
    if (state.skip != 0u) {
        if (ZERO_G) { g[i] = vec4<f32>(0.0); }
        return;
    }
    let gr = g[i] * state.gmul;
    let m0 = m[i];
    var mm: vec4<f32>;
    if (hp.omb1 < 0.5) {  // torch's lerp: the formula depends on which side of 0.5 the weight is
        mm = m0 + hp.omb1 * (gr - m0);
    } else {
        mm = gr - (gr - m0) * (1.0 - hp.omb1);
    }
    let vv = v[i] * hp.b2 + hp.omb2 * gr * gr;
    let denom = sqrt(vv) / state.bc2_sqrt + hp.eps;
    p[i] = p[i] * hp.decay - state.step_size * (mm / denom);
    m[i] = mm;
    v[i] = vv;
    if (ZERO_G) { g[i] = vec4<f32>(0.0); }
}

@compute @workgroup_size(WG)
fn adamw(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
         @builtin(num_workgroups) nw: vec3<u32>) {
    let base = (wid.x + wid.y * nw.x) * WG * PER + lid.x;
    for (var j = 0u; j < PER; j++) {
        let i = base + j * WG;
        if (i < hp.n4) { adamw_one(i); }
    }
}
