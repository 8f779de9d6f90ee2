// bwd_variants.wgsl — candidate tilings of bitlinear_backward_input (bitlinear.wgsl), for
// `python -m bitlora.bench.matmul --kernels bwd --variants bench/bwd_variants.wgsl
//  --bwd-variants ENTRY:ROWS:COLS:UNIT,...`. Same bindings, uniform and split-K contract
// as the kernel in bitlinear.wgsl; every output's sum runs over o in the same order, so a
// variant gives the same bits.
//
// (The prefetching 64 x 128 tile measured here first as bwd_pf is now bitlinear.wgsl's
// kernel; compare a variant against `--kernels bwd`.)
// bwd_t88    128 x 128 tile, thread (tx, ty) rows 8ty .. 8ty+7 x column quads tx, tx+16:
//            64 sums; dy staged transposed [o][row] so a thread's 8 rows of one o are two
//            vec4 loads (8 dy registers, not 32 as in the 128-row tile that lost
//            occupancy). Per o: 4 workgroup loads for 64 multiply-adds (kept: 3 for 32).
//            H200, N = 1024: 0.83-2.2 ms against the kept kernel's 0.74-1.84 (before its
//            prefetch): slower at every 2B-4T width, not kept.

struct BitlinearBackwardParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, ko: u32, split: u32 };
@group(0) @binding(0) var<uniform> bl_p: BitlinearBackwardParams;
@group(0) @binding(1) var<storage, read> bl_dy: array<f32>;
@group(0) @binding(2) var<storage, read> bl_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> bl_dx: array<f32>;
@group(0) @binding(4) var<storage, read_write> bl_part: array<f32>;

fn bl_store(n: u32, i0: u32, acc: vec4<f32>, z: u32) {
    if (n >= bl_p.n) { return; }
    for (var c = 0u; c < 4u; c++) {
        let i = i0 + c;
        if (i < bl_p.i) {
            let idx = n * bl_p.i + i;
            if (bl_p.split != 0u) { bl_part[z * bl_p.n * bl_p.i + idx] = acc[c]; continue; }
            let g = bl_p.scale * acc[c];
            if (bl_p.accumulate != 0u) { bl_dx[idx] = bl_dx[idx] + g; } else { bl_dx[idx] = g; }
        }
    }
}

// ---------------------------------------------------------------------------- bwd_t88
var<workgroup> t8_dy: array<array<vec4<f32>, 32>, 16>;   // [o][row quad], 128 rows
var<workgroup> t8_w: array<array<vec4<f32>, 32>, 16>;    // [o][column quad], 128 columns

// one row of 8 sums: a thread's row r against its two column quads
struct Row8 { a: vec4<f32>, b: vec4<f32> };

fn fma8(acc: Row8, d: f32, w0: vec4<f32>, w1: vec4<f32>) -> Row8 {
    return Row8(acc.a + d * w0, acc.b + d * w1);
}

@compute @workgroup_size(16, 16)
fn bwd_t88(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = bl_p.n;
    let I = bl_p.i;
    let O = bl_p.o;
    let W = (I + 15u) / 16u;
    let n0 = wid.y * 128u;
    let wq0 = wid.x * 8u;
    let oend = min(O, (wid.z + 1u) * bl_p.ko);
    let z = vec4<f32>(0.0);
    var r0 = Row8(z, z); var r1 = Row8(z, z); var r2 = Row8(z, z); var r3 = Row8(z, z);
    var r4 = Row8(z, z); var r5 = Row8(z, z); var r6 = Row8(z, z); var r7 = Row8(z, z);
    for (var o0 = wid.z * bl_p.ko; o0 < oend; o0 += 16u) {
        // dy: 128 rows x 16 o as 512 vec4 loads along o (two per thread), stored transposed
        for (var m = 0u; m < 2u; m++) {
            let e = lid + 256u * m;
            let rr = e / 4u;
            let oq = e % 4u;
            var dv = vec4<f32>(0.0);
            let n = n0 + rr;
            let o = o0 + 4u * oq;
            if (n < N) {
                if (o + 3u < oend) {
                    let b = n * O + o;
                    dv = vec4<f32>(bl_dy[b], bl_dy[b + 1u], bl_dy[b + 2u], bl_dy[b + 3u]);
                } else {
                    for (var c = 0u; c < 4u; c++) { if (o + c < oend) { dv[c] = bl_dy[n * O + o + c]; } }
                }
            }
            t8_dy[4u * oq][rr / 4u][rr % 4u] = dv.x;
            t8_dy[4u * oq + 1u][rr / 4u][rr % 4u] = dv.y;
            t8_dy[4u * oq + 2u][rr / 4u][rr % 4u] = dv.z;
            t8_dy[4u * oq + 3u][rr / 4u][rr % 4u] = dv.w;
        }
        for (var m = 0u; m < 2u; m++) {
            let e = lid + 256u * m;
            let oo = e / 32u;
            let q = e % 32u;
            let wi = wq0 + q / 4u;
            var word = 0x55555555u;
            if (o0 + oo < oend && wi < W) { word = bl_w[(o0 + oo) * W + wi]; }
            t8_w[oo][q] = ternary_quad(word, q % 4u);
        }
        workgroupBarrier();
        for (var o = 0u; o < 16u; o++) {
            let da = t8_dy[o][2u * ty];
            let db = t8_dy[o][2u * ty + 1u];
            let w0 = t8_w[o][tx];
            let w1 = t8_w[o][tx + 16u];
            r0 = fma8(r0, da.x, w0, w1); r1 = fma8(r1, da.y, w0, w1);
            r2 = fma8(r2, da.z, w0, w1); r3 = fma8(r3, da.w, w0, w1);
            r4 = fma8(r4, db.x, w0, w1); r5 = fma8(r5, db.y, w0, w1);
            r6 = fma8(r6, db.z, w0, w1); r7 = fma8(r7, db.w, w0, w1);
        }
        workgroupBarrier();
    }
    let c0 = (wq0 * 4u + tx) * 4u;
    let c1 = (wq0 * 4u + tx + 16u) * 4u;
    let n = n0 + 8u * ty;
    bl_store(n, c0, r0.a, wid.z); bl_store(n, c1, r0.b, wid.z);
    bl_store(n + 1u, c0, r1.a, wid.z); bl_store(n + 1u, c1, r1.b, wid.z);
    bl_store(n + 2u, c0, r2.a, wid.z); bl_store(n + 2u, c1, r2.b, wid.z);
    bl_store(n + 3u, c0, r3.a, wid.z); bl_store(n + 3u, c1, r3.b, wid.z);
    bl_store(n + 4u, c0, r4.a, wid.z); bl_store(n + 4u, c1, r4.b, wid.z);
    bl_store(n + 5u, c0, r5.a, wid.z); bl_store(n + 5u, c1, r5.b, wid.z);
    bl_store(n + 6u, c0, r6.a, wid.z); bl_store(n + 6u, c1, r6.b, wid.z);
    bl_store(n + 7u, c0, r7.a, wid.z); bl_store(n + 7u, c1, r7.b, wid.z);
}
