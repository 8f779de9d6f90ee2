// i8_variants.wgsl — tile shapes for the int8 ternary forward, timed against
// shaders/bitlinear_i8.wgsl by bench/matmul.py (--variants bench/i8_variants.wgsl).
// Same bindings and arithmetic as bitlinear_forward_i8 (read its header); only the tile
// and how the weights reach the dot products differ. bench/matmul.py appends the prelude.
//
// fwd_i8_raw     64 x 64, 4 x 4 per thread, 8 words per chunk: weights staged raw, each
//                thread decodes its 4 outputs' words itself (no decoded copy in workgroup memory)
// The rest keep decoded weights and activations in workgroup memory as [word][row / output]
// (as bitlinear_forward_i8):
// fwd_i8_r8      128 x 64, 8 rows x 4 outputs per thread, 4 words per chunk
// fwd_i8_r8k8    the same, 8 words per chunk (24 KiB of workgroup memory)
// fwd_i8_p8      64 x 128, 4 rows x 8 outputs per thread, 4 words per chunk
// fwd_i8_r8p8    128 x 128, 8 x 8 per thread, 4 words per chunk
// fwd_i8_kc16    bitlinear_forward_i8 with 16 words per chunk (32 KiB)
// Round 1 (the same tiles with [row / output][word] layouts, bank conflicts on the weight
// reads) measured on an H200 at 256 x 6912 x 2560, best split: raw 0.219 ms, r8 0.244,
// kc16 0.238, p8 0.305, r8p8 0.314, bitlinear_forward_i8 (then [output][word]) 0.381.

struct P { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, kw: u32, split: u32 };
@group(0) @binding(0) var<uniform> vp: P;
@group(0) @binding(1) var<storage, read> v_x: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> v_s: array<f32>;
@group(0) @binding(3) var<storage, read> v_w: array<u32>;
@group(0) @binding(4) var<storage, read_write> v_y: array<f32>;
@group(0) @binding(5) var<storage, read_write> v_part: array<f32>;

fn v_tern(w: u32) -> vec4<u32> {
    let c = (vec4<u32>(w) >> vec4<u32>(0u, 2u, 4u, 6u)) & vec4<u32>(0x03030303u);
    return (c + vec4<u32>(0x7f7f7f7fu)) ^ vec4<u32>(0x80808080u);
}
fn v_d16(x: vec4<u32>, t: vec4<u32>) -> i32 {
    return dot4I8Packed(x.x, t.x) + dot4I8Packed(x.y, t.y) + dot4I8Packed(x.z, t.z) + dot4I8Packed(x.w, t.w);
}
fn v_dots(x: vec4<u32>, t0: vec4<u32>, t1: vec4<u32>, t2: vec4<u32>, t3: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(v_d16(x, t0), v_d16(x, t1), v_d16(x, t2), v_d16(x, t3));
}
fn v_store(n: u32, o: u32, acc: vec4<i32>, z: u32) {
    if (n >= vp.n) { return; }
    for (var b = 0u; b < 4u; b++) {
        let oo = o + 16u * b;
        if (oo < vp.o) {
            let idx = n * vp.o + oo;
            if (vp.split != 0u) { v_part[z * vp.n * vp.o + idx] = f32(acc[b]); continue; }
            let v = f32(acc[b]) * vp.scale / v_s[n];
            if (vp.accumulate != 0u) { v_y[idx] = v_y[idx] + v; } else { v_y[idx] = v; }
        }
    }
}
fn v_xload(n: u32, wi: u32, wend: u32, G: u32) -> vec4<u32> {
    if (n < vp.n && wi < wend) { return v_x[n * G + wi]; }
    return vec4<u32>(0u);
}
fn v_wload(o: u32, wi: u32, wend: u32, G: u32) -> u32 {
    if (o < vp.o && wi < wend) { return v_w[o * G + wi]; }
    return 0x55555555u;
}

// ---------------------------------------------------------------- raw weights, per-thread decode
const RAW_KC: u32 = 8u;
var<workgroup> raw_x: array<array<vec4<u32>, RAW_KC>, 64>;
var<workgroup> raw_w: array<array<u32, 9>, 64>;   // RAW_KC + 1: no bank conflicts across outputs

@compute @workgroup_size(16, 16)
fn fwd_i8_raw(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 64u; let o0 = wid.x * 64u;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var a2 = vec4<i32>(0); var a3 = vec4<i32>(0);
    for (var w0 = wid.z * vp.kw; w0 < wend; w0 += RAW_KC) {
        for (var e = lid; e < 64u * RAW_KC; e += 256u) {
            let r = e / RAW_KC; let k = e % RAW_KC;
            raw_x[r][k] = v_xload(n0 + r, w0 + k, wend, G);
            raw_w[r][k] = v_wload(o0 + r, w0 + k, wend, G);
        }
        workgroupBarrier();
        for (var k = 0u; k < RAW_KC; k++) {
            let t0 = v_tern(raw_w[tx][k]); let t1 = v_tern(raw_w[tx + 16u][k]);
            let t2 = v_tern(raw_w[tx + 32u][k]); let t3 = v_tern(raw_w[tx + 48u][k]);
            a0 += v_dots(raw_x[ty][k], t0, t1, t2, t3);
            a1 += v_dots(raw_x[ty + 16u][k], t0, t1, t2, t3);
            a2 += v_dots(raw_x[ty + 32u][k], t0, t1, t2, t3);
            a3 += v_dots(raw_x[ty + 48u][k], t0, t1, t2, t3);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty + 16u, o0 + tx, a1, wid.z);
    v_store(n0 + ty + 32u, o0 + tx, a2, wid.z); v_store(n0 + ty + 48u, o0 + tx, a3, wid.z);
}

// ---------------------------------------------------------------- 128 rows x 64 outputs
const R8_KC: u32 = 4u;
var<workgroup> r8_x: array<array<vec4<u32>, 128>, R8_KC>;
var<workgroup> r8_t: array<array<vec4<u32>, 64>, R8_KC>;

@compute @workgroup_size(16, 16)
fn fwd_i8_r8(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 128u; let o0 = wid.x * 64u;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var a2 = vec4<i32>(0); var a3 = vec4<i32>(0);
    var a4 = vec4<i32>(0); var a5 = vec4<i32>(0); var a6 = vec4<i32>(0); var a7 = vec4<i32>(0);
    for (var w0 = wid.z * vp.kw; w0 < wend; w0 += R8_KC) {
        for (var e = lid; e < 128u * R8_KC; e += 256u) {
            let r = e / R8_KC; let k = e % R8_KC;
            r8_x[k][r] = v_xload(n0 + r, w0 + k, wend, G);
        }
        for (var e = lid; e < 64u * R8_KC; e += 256u) {
            let r = e / R8_KC; let k = e % R8_KC;
            r8_t[k][r] = v_tern(v_wload(o0 + r, w0 + k, wend, G));
        }
        workgroupBarrier();
        for (var k = 0u; k < R8_KC; k++) {
            let t0 = r8_t[k][tx]; let t1 = r8_t[k][tx + 16u]; let t2 = r8_t[k][tx + 32u]; let t3 = r8_t[k][tx + 48u];
            a0 += v_dots(r8_x[k][ty], t0, t1, t2, t3);
            a1 += v_dots(r8_x[k][ty + 16u], t0, t1, t2, t3);
            a2 += v_dots(r8_x[k][ty + 32u], t0, t1, t2, t3);
            a3 += v_dots(r8_x[k][ty + 48u], t0, t1, t2, t3);
            a4 += v_dots(r8_x[k][ty + 64u], t0, t1, t2, t3);
            a5 += v_dots(r8_x[k][ty + 80u], t0, t1, t2, t3);
            a6 += v_dots(r8_x[k][ty + 96u], t0, t1, t2, t3);
            a7 += v_dots(r8_x[k][ty + 112u], t0, t1, t2, t3);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty + 16u, o0 + tx, a1, wid.z);
    v_store(n0 + ty + 32u, o0 + tx, a2, wid.z); v_store(n0 + ty + 48u, o0 + tx, a3, wid.z);
    v_store(n0 + ty + 64u, o0 + tx, a4, wid.z); v_store(n0 + ty + 80u, o0 + tx, a5, wid.z);
    v_store(n0 + ty + 96u, o0 + tx, a6, wid.z); v_store(n0 + ty + 112u, o0 + tx, a7, wid.z);
}

const R8K8: u32 = 8u;
var<workgroup> r8k8_x: array<array<vec4<u32>, 128>, R8K8>;
var<workgroup> r8k8_t: array<array<vec4<u32>, 64>, R8K8>;

@compute @workgroup_size(16, 16)
fn fwd_i8_r8k8(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 128u; let o0 = wid.x * 64u;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var a2 = vec4<i32>(0); var a3 = vec4<i32>(0);
    var a4 = vec4<i32>(0); var a5 = vec4<i32>(0); var a6 = vec4<i32>(0); var a7 = vec4<i32>(0);
    for (var w0 = wid.z * vp.kw; w0 < wend; w0 += R8K8) {
        for (var e = lid; e < 128u * R8K8; e += 256u) {
            let r = e / R8K8; let k = e % R8K8;
            r8k8_x[k][r] = v_xload(n0 + r, w0 + k, wend, G);
        }
        for (var e = lid; e < 64u * R8K8; e += 256u) {
            let r = e / R8K8; let k = e % R8K8;
            r8k8_t[k][r] = v_tern(v_wload(o0 + r, w0 + k, wend, G));
        }
        workgroupBarrier();
        for (var k = 0u; k < R8K8; k++) {
            let t0 = r8k8_t[k][tx]; let t1 = r8k8_t[k][tx + 16u]; let t2 = r8k8_t[k][tx + 32u]; let t3 = r8k8_t[k][tx + 48u];
            a0 += v_dots(r8k8_x[k][ty], t0, t1, t2, t3);
            a1 += v_dots(r8k8_x[k][ty + 16u], t0, t1, t2, t3);
            a2 += v_dots(r8k8_x[k][ty + 32u], t0, t1, t2, t3);
            a3 += v_dots(r8k8_x[k][ty + 48u], t0, t1, t2, t3);
            a4 += v_dots(r8k8_x[k][ty + 64u], t0, t1, t2, t3);
            a5 += v_dots(r8k8_x[k][ty + 80u], t0, t1, t2, t3);
            a6 += v_dots(r8k8_x[k][ty + 96u], t0, t1, t2, t3);
            a7 += v_dots(r8k8_x[k][ty + 112u], t0, t1, t2, t3);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty + 16u, o0 + tx, a1, wid.z);
    v_store(n0 + ty + 32u, o0 + tx, a2, wid.z); v_store(n0 + ty + 48u, o0 + tx, a3, wid.z);
    v_store(n0 + ty + 64u, o0 + tx, a4, wid.z); v_store(n0 + ty + 80u, o0 + tx, a5, wid.z);
    v_store(n0 + ty + 96u, o0 + tx, a6, wid.z); v_store(n0 + ty + 112u, o0 + tx, a7, wid.z);
}

// ---------------------------------------------------------------- 64 rows x 128 outputs
const P8_KC: u32 = 4u;
var<workgroup> p8_x: array<array<vec4<u32>, 64>, P8_KC>;
var<workgroup> p8_t: array<array<vec4<u32>, 128>, P8_KC>;

@compute @workgroup_size(16, 16)
fn fwd_i8_p8(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 64u; let o0 = wid.x * 128u;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var a2 = vec4<i32>(0); var a3 = vec4<i32>(0);
    var b0 = vec4<i32>(0); var b1 = vec4<i32>(0); var b2 = vec4<i32>(0); var b3 = vec4<i32>(0);
    for (var w0 = wid.z * vp.kw; w0 < wend; w0 += P8_KC) {
        for (var e = lid; e < 64u * P8_KC; e += 256u) {
            let r = e / P8_KC; let k = e % P8_KC;
            p8_x[k][r] = v_xload(n0 + r, w0 + k, wend, G);
        }
        for (var e = lid; e < 128u * P8_KC; e += 256u) {
            let r = e / P8_KC; let k = e % P8_KC;
            p8_t[k][r] = v_tern(v_wload(o0 + r, w0 + k, wend, G));
        }
        workgroupBarrier();
        for (var k = 0u; k < P8_KC; k++) {
            let t0 = p8_t[k][tx]; let t1 = p8_t[k][tx + 16u]; let t2 = p8_t[k][tx + 32u]; let t3 = p8_t[k][tx + 48u];
            let t4 = p8_t[k][tx + 64u]; let t5 = p8_t[k][tx + 80u]; let t6 = p8_t[k][tx + 96u]; let t7 = p8_t[k][tx + 112u];
            let x0 = p8_x[k][ty]; let x1 = p8_x[k][ty + 16u]; let x2 = p8_x[k][ty + 32u]; let x3 = p8_x[k][ty + 48u];
            a0 += v_dots(x0, t0, t1, t2, t3); b0 += v_dots(x0, t4, t5, t6, t7);
            a1 += v_dots(x1, t0, t1, t2, t3); b1 += v_dots(x1, t4, t5, t6, t7);
            a2 += v_dots(x2, t0, t1, t2, t3); b2 += v_dots(x2, t4, t5, t6, t7);
            a3 += v_dots(x3, t0, t1, t2, t3); b3 += v_dots(x3, t4, t5, t6, t7);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty + 16u, o0 + tx, a1, wid.z);
    v_store(n0 + ty + 32u, o0 + tx, a2, wid.z); v_store(n0 + ty + 48u, o0 + tx, a3, wid.z);
    v_store(n0 + ty, o0 + 64u + tx, b0, wid.z); v_store(n0 + ty + 16u, o0 + 64u + tx, b1, wid.z);
    v_store(n0 + ty + 32u, o0 + 64u + tx, b2, wid.z); v_store(n0 + ty + 48u, o0 + 64u + tx, b3, wid.z);
}

// ---------------------------------------------------------------- 128 x 128
const Q_KC: u32 = 4u;
var<workgroup> q_x: array<array<vec4<u32>, 128>, Q_KC>;
var<workgroup> q_t: array<array<vec4<u32>, 128>, Q_KC>;

@compute @workgroup_size(16, 16)
fn fwd_i8_r8p8(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 128u; let o0 = wid.x * 128u;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var a2 = vec4<i32>(0); var a3 = vec4<i32>(0);
    var a4 = vec4<i32>(0); var a5 = vec4<i32>(0); var a6 = vec4<i32>(0); var a7 = vec4<i32>(0);
    var b0 = vec4<i32>(0); var b1 = vec4<i32>(0); var b2 = vec4<i32>(0); var b3 = vec4<i32>(0);
    var b4 = vec4<i32>(0); var b5 = vec4<i32>(0); var b6 = vec4<i32>(0); var b7 = vec4<i32>(0);
    for (var w0 = wid.z * vp.kw; w0 < wend; w0 += Q_KC) {
        for (var e = lid; e < 128u * Q_KC; e += 256u) {
            let r = e / Q_KC; let k = e % Q_KC;
            q_x[k][r] = v_xload(n0 + r, w0 + k, wend, G);
            q_t[k][r] = v_tern(v_wload(o0 + r, w0 + k, wend, G));
        }
        workgroupBarrier();
        for (var k = 0u; k < Q_KC; k++) {
            let t0 = q_t[k][tx]; let t1 = q_t[k][tx + 16u]; let t2 = q_t[k][tx + 32u]; let t3 = q_t[k][tx + 48u];
            let t4 = q_t[k][tx + 64u]; let t5 = q_t[k][tx + 80u]; let t6 = q_t[k][tx + 96u]; let t7 = q_t[k][tx + 112u];
            var x = q_x[k][ty];        a0 += v_dots(x, t0, t1, t2, t3); b0 += v_dots(x, t4, t5, t6, t7);
            x = q_x[k][ty + 16u];      a1 += v_dots(x, t0, t1, t2, t3); b1 += v_dots(x, t4, t5, t6, t7);
            x = q_x[k][ty + 32u];      a2 += v_dots(x, t0, t1, t2, t3); b2 += v_dots(x, t4, t5, t6, t7);
            x = q_x[k][ty + 48u];      a3 += v_dots(x, t0, t1, t2, t3); b3 += v_dots(x, t4, t5, t6, t7);
            x = q_x[k][ty + 64u];      a4 += v_dots(x, t0, t1, t2, t3); b4 += v_dots(x, t4, t5, t6, t7);
            x = q_x[k][ty + 80u];      a5 += v_dots(x, t0, t1, t2, t3); b5 += v_dots(x, t4, t5, t6, t7);
            x = q_x[k][ty + 96u];      a6 += v_dots(x, t0, t1, t2, t3); b6 += v_dots(x, t4, t5, t6, t7);
            x = q_x[k][ty + 112u];     a7 += v_dots(x, t0, t1, t2, t3); b7 += v_dots(x, t4, t5, t6, t7);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty + 16u, o0 + tx, a1, wid.z);
    v_store(n0 + ty + 32u, o0 + tx, a2, wid.z); v_store(n0 + ty + 48u, o0 + tx, a3, wid.z);
    v_store(n0 + ty + 64u, o0 + tx, a4, wid.z); v_store(n0 + ty + 80u, o0 + tx, a5, wid.z);
    v_store(n0 + ty + 96u, o0 + tx, a6, wid.z); v_store(n0 + ty + 112u, o0 + tx, a7, wid.z);
    v_store(n0 + ty, o0 + 64u + tx, b0, wid.z); v_store(n0 + ty + 16u, o0 + 64u + tx, b1, wid.z);
    v_store(n0 + ty + 32u, o0 + 64u + tx, b2, wid.z); v_store(n0 + ty + 48u, o0 + 64u + tx, b3, wid.z);
    v_store(n0 + ty + 64u, o0 + 64u + tx, b4, wid.z); v_store(n0 + ty + 80u, o0 + 64u + tx, b5, wid.z);
    v_store(n0 + ty + 96u, o0 + 64u + tx, b6, wid.z); v_store(n0 + ty + 112u, o0 + 64u + tx, b7, wid.z);
}

// ---------------------------------------------------------------- 64 x 64, 16 words per chunk
const K16: u32 = 16u;
var<workgroup> k16_x: array<array<vec4<u32>, 64>, K16>;
var<workgroup> k16_t: array<array<vec4<u32>, 64>, K16>;

@compute @workgroup_size(16, 16)
fn fwd_i8_kc16(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 64u; let o0 = wid.x * 64u;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var a2 = vec4<i32>(0); var a3 = vec4<i32>(0);
    for (var w0 = wid.z * vp.kw; w0 < wend; w0 += K16) {
        for (var e = lid; e < 64u * K16; e += 256u) {
            let r = e / K16; let k = e % K16;
            k16_x[k][r] = v_xload(n0 + r, w0 + k, wend, G);
            k16_t[k][r] = v_tern(v_wload(o0 + r, w0 + k, wend, G));
        }
        workgroupBarrier();
        for (var k = 0u; k < K16; k++) {
            let t0 = k16_t[k][tx]; let t1 = k16_t[k][tx + 16u]; let t2 = k16_t[k][tx + 32u]; let t3 = k16_t[k][tx + 48u];
            a0 += v_dots(k16_x[k][ty], t0, t1, t2, t3);
            a1 += v_dots(k16_x[k][ty + 16u], t0, t1, t2, t3);
            a2 += v_dots(k16_x[k][ty + 32u], t0, t1, t2, t3);
            a3 += v_dots(k16_x[k][ty + 48u], t0, t1, t2, t3);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty + 16u, o0 + tx, a1, wid.z);
    v_store(n0 + ty + 32u, o0 + tx, a2, wid.z); v_store(n0 + ty + 48u, o0 + tx, a3, wid.z);
}

// ---------------------------------------------------------------- prefetching
// fwd_i8_pf      bitlinear_forward_i8's tile with the next chunk's activations and weight
//                words loaded into registers while the current chunk is multiplied (as
//                bitlinear_backward_input does since it paid 20-28 % there). H200, best
//                split, 2B-4T widths at 256 and 1024 rows: within -3 % .. +1 % of the kept
//                kernel (the int8 kernel's chunks are short: 8 words); not kept.
var<workgroup> pf_x: array<array<vec4<u32>, 64>, 8>;
var<workgroup> pf_t: array<array<vec4<u32>, 64>, 8>;

@compute @workgroup_size(16, 16)
fn fwd_i8_pf(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 64u; let o0 = wid.x * 64u;
    let wbeg = wid.z * vp.kw;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    // staging slots e = lid and lid + 256: row / output e / 8, word e % 8
    let r0 = lid / 8u; let r1 = r0 + 32u; let k = lid % 8u;
    var x0 = v_xload(n0 + r0, wbeg + k, wend, G); var x1 = v_xload(n0 + r1, wbeg + k, wend, G);
    var w0 = v_wload(o0 + r0, wbeg + k, wend, G); var w1 = v_wload(o0 + r1, wbeg + k, wend, G);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var a2 = vec4<i32>(0); var a3 = vec4<i32>(0);
    for (var c = wbeg; c < wend; c += 8u) {
        pf_x[k][r0] = x0; pf_x[k][r1] = x1;
        pf_t[k][r0] = v_tern(w0); pf_t[k][r1] = v_tern(w1);
        workgroupBarrier();
        let c1 = c + 8u;
        x0 = v_xload(n0 + r0, c1 + k, wend, G); x1 = v_xload(n0 + r1, c1 + k, wend, G);
        w0 = v_wload(o0 + r0, c1 + k, wend, G); w1 = v_wload(o0 + r1, c1 + k, wend, G);
        for (var kk = 0u; kk < 8u; kk++) {
            let t0 = pf_t[kk][tx]; let t1 = pf_t[kk][tx + 16u]; let t2 = pf_t[kk][tx + 32u]; let t3 = pf_t[kk][tx + 48u];
            a0 += v_dots(pf_x[kk][ty], t0, t1, t2, t3);
            a1 += v_dots(pf_x[kk][ty + 16u], t0, t1, t2, t3);
            a2 += v_dots(pf_x[kk][ty + 32u], t0, t1, t2, t3);
            a3 += v_dots(pf_x[kk][ty + 48u], t0, t1, t2, t3);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty + 16u, o0 + tx, a1, wid.z);
    v_store(n0 + ty + 32u, o0 + tx, a2, wid.z); v_store(n0 + ty + 32u + 16u, o0 + tx, a3, wid.z);
}

// ---------------------------------------------------------------- 32-row tiles (a short prompt)
// fwd_i8_s32p8   32 x 128, rows ty, ty + 16 x outputs tx + 16b (b < 8) a thread: 64
//                dot4I8Packed a word for 10 workgroup loads (the kept 32-row tile: 32 for 6);
//                4 words a chunk (10 KiB), the next chunk loaded while this one is multiplied
// fwd_i8_s32w    32 x 64 on 128 invocations, rows ty + 8a (a < 4) x outputs tx + 16b (b < 4):
//                the 64-row tile's 16 sums a thread on half the threads, 8 words a chunk
const S8_KC: u32 = 4u;
var<workgroup> s8_x: array<array<vec4<u32>, 32>, S8_KC>;
var<workgroup> s8_t: array<array<vec4<u32>, 128>, S8_KC>;

@compute @workgroup_size(16, 16)
fn fwd_i8_s32p8(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 32u; let o0 = wid.x * 128u;
    let wbeg = wid.z * vp.kw;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    // staging: activations row lid / 4 (threads below 128), weights outputs lid / 4 and + 64; word lid % 4
    let r = lid / 4u; let k = lid % 4u;
    var x0 = vec4<u32>(0u);
    if (lid < 128u) { x0 = v_xload(n0 + r, wbeg + k, wend, G); }
    var w0 = v_wload(o0 + r, wbeg + k, wend, G); var w1 = v_wload(o0 + r + 64u, wbeg + k, wend, G);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var b0 = vec4<i32>(0); var b1 = vec4<i32>(0);
    for (var c = wbeg; c < wend; c += S8_KC) {
        if (lid < 128u) { s8_x[k][r] = x0; }
        s8_t[k][r] = v_tern(w0); s8_t[k][r + 64u] = v_tern(w1);
        workgroupBarrier();
        let c1 = c + S8_KC;
        if (lid < 128u) { x0 = v_xload(n0 + r, c1 + k, wend, G); }
        w0 = v_wload(o0 + r, c1 + k, wend, G); w1 = v_wload(o0 + r + 64u, c1 + k, wend, G);
        for (var kk = 0u; kk < S8_KC; kk++) {
            let t0 = s8_t[kk][tx]; let t1 = s8_t[kk][tx + 16u]; let t2 = s8_t[kk][tx + 32u]; let t3 = s8_t[kk][tx + 48u];
            let t4 = s8_t[kk][tx + 64u]; let t5 = s8_t[kk][tx + 80u]; let t6 = s8_t[kk][tx + 96u]; let t7 = s8_t[kk][tx + 112u];
            let xa = s8_x[kk][ty]; let xb = s8_x[kk][ty + 16u];
            a0 += v_dots(xa, t0, t1, t2, t3); a1 += v_dots(xa, t4, t5, t6, t7);
            b0 += v_dots(xb, t0, t1, t2, t3); b1 += v_dots(xb, t4, t5, t6, t7);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty, o0 + tx + 64u, a1, wid.z);
    v_store(n0 + ty + 16u, o0 + tx, b0, wid.z); v_store(n0 + ty + 16u, o0 + tx + 64u, b1, wid.z);
}

var<workgroup> sw_x: array<array<vec4<u32>, 32>, 8>;
var<workgroup> sw_t: array<array<vec4<u32>, 64>, 8>;

@compute @workgroup_size(16, 8)
fn fwd_i8_s32w(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = l.x; let ty = l.y; let lid = ty * 16u + tx;
    let G = (vp.i + 15u) / 16u;
    let n0 = wid.y * 32u; let o0 = wid.x * 64u;
    let wbeg = wid.z * vp.kw;
    let wend = min(G, (wid.z + 1u) * vp.kw);
    // staging: rows lid / 8 and + 16, outputs lid / 8 + 16j (j < 4); word lid % 8
    let r = lid / 8u; let k = lid % 8u;
    var x0 = v_xload(n0 + r, wbeg + k, wend, G); var x1 = v_xload(n0 + r + 16u, wbeg + k, wend, G);
    var w0 = v_wload(o0 + r, wbeg + k, wend, G); var w1 = v_wload(o0 + r + 16u, wbeg + k, wend, G);
    var w2 = v_wload(o0 + r + 32u, wbeg + k, wend, G); var w3 = v_wload(o0 + r + 48u, wbeg + k, wend, G);
    var a0 = vec4<i32>(0); var a1 = vec4<i32>(0); var a2 = vec4<i32>(0); var a3 = vec4<i32>(0);
    for (var c = wbeg; c < wend; c += 8u) {
        sw_x[k][r] = x0; sw_x[k][r + 16u] = x1;
        sw_t[k][r] = v_tern(w0); sw_t[k][r + 16u] = v_tern(w1); sw_t[k][r + 32u] = v_tern(w2); sw_t[k][r + 48u] = v_tern(w3);
        workgroupBarrier();
        let c1 = c + 8u;
        x0 = v_xload(n0 + r, c1 + k, wend, G); x1 = v_xload(n0 + r + 16u, c1 + k, wend, G);
        w0 = v_wload(o0 + r, c1 + k, wend, G); w1 = v_wload(o0 + r + 16u, c1 + k, wend, G);
        w2 = v_wload(o0 + r + 32u, c1 + k, wend, G); w3 = v_wload(o0 + r + 48u, c1 + k, wend, G);
        for (var kk = 0u; kk < 8u; kk++) {
            let t0 = sw_t[kk][tx]; let t1 = sw_t[kk][tx + 16u]; let t2 = sw_t[kk][tx + 32u]; let t3 = sw_t[kk][tx + 48u];
            a0 += v_dots(sw_x[kk][ty], t0, t1, t2, t3);
            a1 += v_dots(sw_x[kk][ty + 8u], t0, t1, t2, t3);
            a2 += v_dots(sw_x[kk][ty + 16u], t0, t1, t2, t3);
            a3 += v_dots(sw_x[kk][ty + 24u], t0, t1, t2, t3);
        }
        workgroupBarrier();
    }
    v_store(n0 + ty, o0 + tx, a0, wid.z); v_store(n0 + ty + 8u, o0 + tx, a1, wid.z);
    v_store(n0 + ty + 16u, o0 + tx, a2, wid.z); v_store(n0 + ty + 24u, o0 + tx, a3, wid.z);
}
