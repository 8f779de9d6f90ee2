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
// bwd_88p    bwd_t88 with the kept kernel's prefetch and conflict-free transposed dy stores
// bwd_84p    the same rows x one column quad (128 x 64, 32 sums). H200, N = 1024, best of
//            1-6 slices, ms (kept kernel / 88p / 84p): 2560 -> 2560 0.675 / 0.682 / 0.913,
//            6912 -> 2560 1.552 / 1.547 / 2.137, 2560 -> 6912 1.529 / 1.592 / 2.207, 640 ->
//            2560 0.259 / 0.291 / 0.366: no tile shape beat the kept one. Not kept.
// bwd_fma    the kept kernel with fma() for its multiply-adds: the same bits and within 3-5 %
//            (0.653 against 0.684 ms at 2560 x 2560, two slices; equal elsewhere), so NVIDIA
//            already fuses naga's multiply and add. The kept kernel is 35-42 % of the
//            measured in-register fma peak (28.3 TMAC/s, `--peak 8192`) at every tiling tried.

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

// ---------------------------------------------------------------------------- bwd_88p, bwd_84p
// 128-row tiles with the kept kernel's prefetch (the next 16 o's loads issued before this
// chunk's products): dy staged transposed [o][row quad] so a thread's 8 rows of one o are
// two vec4 loads. A thread stages dy as vec4s along o of one row (lanes: consecutive rows,
// so the transposed scalar stores hit 32 banks). bwd_88p: 128 x 128, rows 8ty .. 8ty+7 x
// column quads tx, tx+16 (64 sums; per o 4 workgroup loads, 6 wavefronts for 64 products).
// bwd_84p: 128 x 64, rows 8ty .. 8ty+7 x column quad tx (32 sums; 3 loads, 4 wavefronts).
var<workgroup> p8_dy: array<array<vec4<f32>, 32>, 16>;   // [o][row quad], 128 rows
var<workgroup> p8_w: array<array<vec4<f32>, 32>, 16>;    // [o][column quad], up to 128 columns

fn p8_dy4(n: u32, o: u32, oend: u32) -> vec4<f32> {   // dy[n, o .. o+3], 0 past the slice's or the rows' end
    var v = vec4<f32>(0.0);
    if (n < bl_p.n) {
        let b = n * bl_p.o + o;
        if (o + 3u < oend) {
            v = vec4<f32>(bl_dy[b], bl_dy[b + 1u], bl_dy[b + 2u], bl_dy[b + 3u]);
        } else {
            if (o < oend) { v.x = bl_dy[b]; }
            if (o + 1u < oend) { v.y = bl_dy[b + 1u]; }
            if (o + 2u < oend) { v.z = bl_dy[b + 2u]; }
        }
    }
    return v;
}

fn p8_w_at(o: u32, wi: u32, oend: u32) -> u32 {   // word wi of w_packed row o, zeros (code 1) past the edges
    if (o < oend && wi < (bl_p.i + 15u) / 16u) { return bl_w[o * ((bl_p.i + 15u) / 16u) + wi]; }
    return 0x55555555u;
}

fn p8_put_dy(r: u32, q: u32, v: vec4<f32>) {   // row r's dy of o quad q, transposed
    p8_dy[4u * q][r / 4u][r % 4u] = v.x;
    p8_dy[4u * q + 1u][r / 4u][r % 4u] = v.y;
    p8_dy[4u * q + 2u][r / 4u][r % 4u] = v.z;
    p8_dy[4u * q + 3u][r / 4u][r % 4u] = v.w;
}

@compute @workgroup_size(16, 16)
fn bwd_88p(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 128u;
    let wq0 = wid.x * 8u;
    let obeg = wid.z * bl_p.ko;
    let oend = min(bl_p.o, (wid.z + 1u) * bl_p.ko);
    let sr = lid % 128u;          // staged dy row; o quads sq, sq + 2
    let sq = lid / 128u;
    let wo = lid / 32u;           // staged weights: o wo, wo + 8, column quad lid % 32
    let wq = lid % 32u;
    let wi = wq0 + wq / 4u;
    var pd0 = p8_dy4(n0 + sr, obeg + 4u * sq, oend); var pd1 = p8_dy4(n0 + sr, obeg + 4u * sq + 8u, oend);
    var pw0 = p8_w_at(obeg + wo, wi, oend); var pw1 = p8_w_at(obeg + wo + 8u, wi, oend);
    let z = vec4<f32>(0.0);
    var a0 = z; var b0 = z; var a1 = z; var b1 = z; var a2 = z; var b2 = z; var a3 = z; var b3 = z;
    var a4 = z; var b4 = z; var a5 = z; var b5 = z; var a6 = z; var b6 = z; var a7 = z; var b7 = z;
    for (var o0 = obeg; o0 < oend; o0 += 16u) {
        p8_put_dy(sr, sq, pd0);
        p8_put_dy(sr, sq + 2u, pd1);
        p8_w[wo][wq] = ternary_quad(pw0, wq % 4u);
        p8_w[wo + 8u][wq] = ternary_quad(pw1, wq % 4u);
        workgroupBarrier();
        let o1 = o0 + 16u;
        pd0 = p8_dy4(n0 + sr, o1 + 4u * sq, oend); pd1 = p8_dy4(n0 + sr, o1 + 4u * sq + 8u, oend);
        pw0 = p8_w_at(o1 + wo, wi, oend); pw1 = p8_w_at(o1 + wo + 8u, wi, oend);
        for (var o = 0u; o < 16u; o++) {
            let da = p8_dy[o][2u * ty];
            let db = p8_dy[o][2u * ty + 1u];
            let w0 = p8_w[o][tx];
            let w1 = p8_w[o][tx + 16u];
            a0 += da.x * w0; b0 += da.x * w1; a1 += da.y * w0; b1 += da.y * w1;
            a2 += da.z * w0; b2 += da.z * w1; a3 += da.w * w0; b3 += da.w * w1;
            a4 += db.x * w0; b4 += db.x * w1; a5 += db.y * w0; b5 += db.y * w1;
            a6 += db.z * w0; b6 += db.z * w1; a7 += db.w * w0; b7 += db.w * w1;
        }
        workgroupBarrier();
    }
    let c0 = (wq0 * 4u + tx) * 4u;
    let c1 = (wq0 * 4u + tx + 16u) * 4u;
    let n = n0 + 8u * ty;
    bl_store(n, c0, a0, wid.z); bl_store(n, c1, b0, wid.z);
    bl_store(n + 1u, c0, a1, wid.z); bl_store(n + 1u, c1, b1, wid.z);
    bl_store(n + 2u, c0, a2, wid.z); bl_store(n + 2u, c1, b2, wid.z);
    bl_store(n + 3u, c0, a3, wid.z); bl_store(n + 3u, c1, b3, wid.z);
    bl_store(n + 4u, c0, a4, wid.z); bl_store(n + 4u, c1, b4, wid.z);
    bl_store(n + 5u, c0, a5, wid.z); bl_store(n + 5u, c1, b5, wid.z);
    bl_store(n + 6u, c0, a6, wid.z); bl_store(n + 6u, c1, b6, wid.z);
    bl_store(n + 7u, c0, a7, wid.z); bl_store(n + 7u, c1, b7, wid.z);
}

@compute @workgroup_size(16, 16)
fn bwd_84p(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 128u;
    let wq0 = wid.x * 4u;
    let obeg = wid.z * bl_p.ko;
    let oend = min(bl_p.o, (wid.z + 1u) * bl_p.ko);
    let sr = lid % 128u;
    let sq = lid / 128u;
    let wo = lid / 16u;           // staged weights: o wo, column quad lid % 16
    let wq = lid % 16u;
    let wi = wq0 + wq / 4u;
    var pd0 = p8_dy4(n0 + sr, obeg + 4u * sq, oend); var pd1 = p8_dy4(n0 + sr, obeg + 4u * sq + 8u, oend);
    var pw0 = p8_w_at(obeg + wo, wi, oend);
    let z = vec4<f32>(0.0);
    var a0 = z; var a1 = z; var a2 = z; var a3 = z; var a4 = z; var a5 = z; var a6 = z; var a7 = z;
    for (var o0 = obeg; o0 < oend; o0 += 16u) {
        p8_put_dy(sr, sq, pd0);
        p8_put_dy(sr, sq + 2u, pd1);
        p8_w[wo][wq] = ternary_quad(pw0, wq % 4u);
        workgroupBarrier();
        let o1 = o0 + 16u;
        pd0 = p8_dy4(n0 + sr, o1 + 4u * sq, oend); pd1 = p8_dy4(n0 + sr, o1 + 4u * sq + 8u, oend);
        pw0 = p8_w_at(o1 + wo, wi, oend);
        for (var o = 0u; o < 16u; o++) {
            let da = p8_dy[o][2u * ty];
            let db = p8_dy[o][2u * ty + 1u];
            let w0 = p8_w[o][tx];
            a0 += da.x * w0; a1 += da.y * w0; a2 += da.z * w0; a3 += da.w * w0;
            a4 += db.x * w0; a5 += db.y * w0; a6 += db.z * w0; a7 += db.w * w0;
        }
        workgroupBarrier();
    }
    let c0 = (wq0 * 4u + tx) * 4u;
    let n = n0 + 8u * ty;
    bl_store(n, c0, a0, wid.z); bl_store(n + 1u, c0, a1, wid.z); bl_store(n + 2u, c0, a2, wid.z);
    bl_store(n + 3u, c0, a3, wid.z); bl_store(n + 4u, c0, a4, wid.z); bl_store(n + 5u, c0, a5, wid.z);
    bl_store(n + 6u, c0, a6, wid.z); bl_store(n + 6u + 1u, c0, a7, wid.z);
}

// ---------------------------------------------------------------------------- bwd_fma
// The kept kernel with its multiply-adds written as fma(): whether NVIDIA's compiler fuses
// `a += d * w` from naga's SPIR-V (an OpFMul and an OpFAdd) by itself. Same bits if it does.
var<workgroup> fm_dy_sh: array<array<vec4<f32>, 4>, 64>;
var<workgroup> fm_w_sh: array<array<vec4<f32>, 32>, 16>;

fn fm_dy_at(n: u32, o: u32, oend: u32) -> f32 {
    if (n < bl_p.n && o < oend) { return bl_dy[n * bl_p.o + o]; }
    return 0.0;
}

@compute @workgroup_size(16, 16)
fn bwd_fma(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let wq0 = wid.x * 8u;
    let obeg = wid.z * bl_p.ko;
    let oend = min(bl_p.o, (wid.z + 1u) * bl_p.ko);
    // this thread's staging slots: dy (row lid/16 + 16m, o lid%16), w (o (lid + 256m)/32, quad lid%32)
    let sr = lid / 16u;
    let so = lid % 16u;
    let wo0 = lid / 32u;
    let wq = lid % 32u;
    let wi = wq0 + wq / 4u;
    var p0 = fm_dy_at(n0 + sr, obeg + so, oend); var p1 = fm_dy_at(n0 + sr + 16u, obeg + so, oend);
    var p2 = fm_dy_at(n0 + sr + 32u, obeg + so, oend); var p3 = fm_dy_at(n0 + sr + 48u, obeg + so, oend);
    var pw0 = p8_w_at(obeg + wo0, wi, oend); var pw1 = p8_w_at(obeg + wo0 + 8u, wi, oend);
    var a00 = vec4<f32>(0.0); var a01 = vec4<f32>(0.0);
    var a10 = vec4<f32>(0.0); var a11 = vec4<f32>(0.0);
    var a20 = vec4<f32>(0.0); var a21 = vec4<f32>(0.0);
    var a30 = vec4<f32>(0.0); var a31 = vec4<f32>(0.0);
    for (var o0 = obeg; o0 < oend; o0 += 16u) {
        fm_dy_sh[sr][so / 4u][so % 4u] = p0;
        fm_dy_sh[sr + 16u][so / 4u][so % 4u] = p1;
        fm_dy_sh[sr + 32u][so / 4u][so % 4u] = p2;
        fm_dy_sh[sr + 48u][so / 4u][so % 4u] = p3;
        fm_w_sh[wo0][wq] = ternary_quad(pw0, wq % 4u);
        fm_w_sh[wo0 + 8u][wq] = ternary_quad(pw1, wq % 4u);
        workgroupBarrier();
        let o1 = o0 + 16u;
        p0 = fm_dy_at(n0 + sr, o1 + so, oend); p1 = fm_dy_at(n0 + sr + 16u, o1 + so, oend);
        p2 = fm_dy_at(n0 + sr + 32u, o1 + so, oend); p3 = fm_dy_at(n0 + sr + 48u, o1 + so, oend);
        pw0 = p8_w_at(o1 + wo0, wi, oend); pw1 = p8_w_at(o1 + wo0 + 8u, wi, oend);
        for (var oq = 0u; oq < 4u; oq++) {
            let d0 = fm_dy_sh[ty][oq];
            let d1 = fm_dy_sh[ty + 16u][oq];
            let d2 = fm_dy_sh[ty + 32u][oq];
            let d3 = fm_dy_sh[ty + 48u][oq];
            var w0 = fm_w_sh[oq * 4u][tx];
            var w1 = fm_w_sh[oq * 4u][tx + 16u];
            a00 = fma(vec4<f32>(d0.x), w0, a00); a01 = fma(vec4<f32>(d0.x), w1, a01); a10 = fma(vec4<f32>(d1.x), w0, a10); a11 = fma(vec4<f32>(d1.x), w1, a11);
            a20 = fma(vec4<f32>(d2.x), w0, a20); a21 = fma(vec4<f32>(d2.x), w1, a21); a30 = fma(vec4<f32>(d3.x), w0, a30); a31 = fma(vec4<f32>(d3.x), w1, a31);
            w0 = fm_w_sh[oq * 4u + 1u][tx];
            w1 = fm_w_sh[oq * 4u + 1u][tx + 16u];
            a00 = fma(vec4<f32>(d0.y), w0, a00); a01 = fma(vec4<f32>(d0.y), w1, a01); a10 = fma(vec4<f32>(d1.y), w0, a10); a11 = fma(vec4<f32>(d1.y), w1, a11);
            a20 = fma(vec4<f32>(d2.y), w0, a20); a21 = fma(vec4<f32>(d2.y), w1, a21); a30 = fma(vec4<f32>(d3.y), w0, a30); a31 = fma(vec4<f32>(d3.y), w1, a31);
            w0 = fm_w_sh[oq * 4u + 2u][tx];
            w1 = fm_w_sh[oq * 4u + 2u][tx + 16u];
            a00 = fma(vec4<f32>(d0.z), w0, a00); a01 = fma(vec4<f32>(d0.z), w1, a01); a10 = fma(vec4<f32>(d1.z), w0, a10); a11 = fma(vec4<f32>(d1.z), w1, a11);
            a20 = fma(vec4<f32>(d2.z), w0, a20); a21 = fma(vec4<f32>(d2.z), w1, a21); a30 = fma(vec4<f32>(d3.z), w0, a30); a31 = fma(vec4<f32>(d3.z), w1, a31);
            w0 = fm_w_sh[oq * 4u + 3u][tx];
            w1 = fm_w_sh[oq * 4u + 3u][tx + 16u];
            a00 = fma(vec4<f32>(d0.w), w0, a00); a01 = fma(vec4<f32>(d0.w), w1, a01); a10 = fma(vec4<f32>(d1.w), w0, a10); a11 = fma(vec4<f32>(d1.w), w1, a11);
            a20 = fma(vec4<f32>(d2.w), w0, a20); a21 = fma(vec4<f32>(d2.w), w1, a21); a30 = fma(vec4<f32>(d3.w), w0, a30); a31 = fma(vec4<f32>(d3.w), w1, a31);
        }
        workgroupBarrier();
    }
    let c0 = (wq0 * 4u + tx) * 4u;
    let c1 = (wq0 * 4u + tx + 16u) * 4u;
    bl_store(n0 + ty, c0, a00, wid.z); bl_store(n0 + ty, c1, a01, wid.z);
    bl_store(n0 + ty + 16u, c0, a10, wid.z); bl_store(n0 + ty + 16u, c1, a11, wid.z);
    bl_store(n0 + ty + 32u, c0, a20, wid.z); bl_store(n0 + ty + 32u, c1, a21, wid.z);
    bl_store(n0 + ty + 48u, c0, a30, wid.z); bl_store(n0 + ty + 48u, c1, a31, wid.z);
}


// ---------------------------------------------------------------------------- bwd_k32_v4, bwd_2s_v4
// The kept kernel (dy read as vec4s at binding 5: entries ending in _v4 get it) with fewer
// barriers per product. bwd_k32_v4: chunks of 32 o, not 16 (two barriers per 32 o, two
// dy quads and four weight words prefetched a thread; 24 KB of workgroup memory; split
// unit 32). bwd_2s_v4: 16-o chunks in two staging buffers, one barrier per chunk (the next
// chunk is stored into the other buffer while no thread reads it). Both sum o in order,
// as the kept kernel: the same bits.
@group(0) @binding(5) var<storage, read> v4_dy4: array<vec4<f32>>;
var<workgroup> k32_dy: array<array<vec4<f32>, 8>, 64>;    // [row][o quad], 32 o
var<workgroup> k32_w: array<array<vec4<f32>, 32>, 32>;    // [o][column quad]
var<workgroup> s2_dy: array<array<array<vec4<f32>, 4>, 64>, 2>;   // [buffer][row][o quad]
var<workgroup> s2_w: array<array<array<vec4<f32>, 32>, 16>, 2>;   // [buffer][o][column quad]

struct V4Sums { a00: vec4<f32>, a01: vec4<f32>, a10: vec4<f32>, a11: vec4<f32>,
                a20: vec4<f32>, a21: vec4<f32>, a30: vec4<f32>, a31: vec4<f32> };

fn v4_dy_quad(n: u32, o: u32, oend: u32) -> vec4<f32> {   // dy[n, o .. o+3], 0 past the edges
    if (n >= bl_p.n) { return vec4<f32>(0.0); }
    let at = n * bl_p.o + o;
    if (bl_p.o % 4u == 0u && o + 3u < oend) { return v4_dy4[at / 4u]; }
    var v = vec4<f32>(0.0);
    for (var c = 0u; c < 4u; c++) {
        if (o + c < oend) { v[c] = bl_dy[at + c]; }
    }
    return v;
}

// one o of a quad's products: dy values d0..d3 of the thread's rows against weights w0, w1
fn v4_o(acc: V4Sums, d0: f32, d1: f32, d2: f32, d3: f32, w0: vec4<f32>, w1: vec4<f32>) -> V4Sums {
    var s = acc;
    s.a00 += d0 * w0; s.a01 += d0 * w1; s.a10 += d1 * w0; s.a11 += d1 * w1;
    s.a20 += d2 * w0; s.a21 += d2 * w1; s.a30 += d3 * w0; s.a31 += d3 * w1;
    return s;
}

fn k32_oq(acc: V4Sums, oq: u32, ty: u32, tx: u32) -> V4Sums {
    let d0 = k32_dy[ty][oq]; let d1 = k32_dy[ty + 16u][oq];
    let d2 = k32_dy[ty + 32u][oq]; let d3 = k32_dy[ty + 48u][oq];
    var s = v4_o(acc, d0.x, d1.x, d2.x, d3.x, k32_w[oq * 4u][tx], k32_w[oq * 4u][tx + 16u]);
    s = v4_o(s, d0.y, d1.y, d2.y, d3.y, k32_w[oq * 4u + 1u][tx], k32_w[oq * 4u + 1u][tx + 16u]);
    s = v4_o(s, d0.z, d1.z, d2.z, d3.z, k32_w[oq * 4u + 2u][tx], k32_w[oq * 4u + 2u][tx + 16u]);
    return v4_o(s, d0.w, d1.w, d2.w, d3.w, k32_w[oq * 4u + 3u][tx], k32_w[oq * 4u + 3u][tx + 16u]);
}

fn s2_oq(acc: V4Sums, b: u32, oq: u32, ty: u32, tx: u32) -> V4Sums {
    let d0 = s2_dy[b][ty][oq]; let d1 = s2_dy[b][ty + 16u][oq];
    let d2 = s2_dy[b][ty + 32u][oq]; let d3 = s2_dy[b][ty + 48u][oq];
    var s = v4_o(acc, d0.x, d1.x, d2.x, d3.x, s2_w[b][oq * 4u][tx], s2_w[b][oq * 4u][tx + 16u]);
    s = v4_o(s, d0.y, d1.y, d2.y, d3.y, s2_w[b][oq * 4u + 1u][tx], s2_w[b][oq * 4u + 1u][tx + 16u]);
    s = v4_o(s, d0.z, d1.z, d2.z, d3.z, s2_w[b][oq * 4u + 2u][tx], s2_w[b][oq * 4u + 2u][tx + 16u]);
    return v4_o(s, d0.w, d1.w, d2.w, d3.w, s2_w[b][oq * 4u + 3u][tx], s2_w[b][oq * 4u + 3u][tx + 16u]);
}

fn v4_store_all(acc: V4Sums, n0: u32, ty: u32, wq0: u32, tx: u32, z: u32) {
    let c0 = (wq0 * 4u + tx) * 4u;
    let c1 = (wq0 * 4u + tx + 16u) * 4u;
    bl_store(n0 + ty, c0, acc.a00, z); bl_store(n0 + ty, c1, acc.a01, z);
    bl_store(n0 + ty + 16u, c0, acc.a10, z); bl_store(n0 + ty + 16u, c1, acc.a11, z);
    bl_store(n0 + ty + 32u, c0, acc.a20, z); bl_store(n0 + ty + 32u, c1, acc.a21, z);
    bl_store(n0 + ty + 48u, c0, acc.a30, z); bl_store(n0 + ty + 48u, c1, acc.a31, z);
}

@compute @workgroup_size(16, 16)
fn bwd_k32_v4(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let wq0 = wid.x * 8u;
    let obeg = wid.z * bl_p.ko;
    let oend = min(bl_p.o, (wid.z + 1u) * bl_p.ko);
    let sr = lid / 4u;       // staged dy: row sr, o quads sq and sq + 4
    let sq = lid % 4u;
    let wo0 = lid / 32u;     // staged weights: o wo0 + 8m (m < 4), column quad lid % 32
    let wq = lid % 32u;
    let wi = wq0 + wq / 4u;
    var p0 = v4_dy_quad(n0 + sr, obeg + 4u * sq, oend); var p1 = v4_dy_quad(n0 + sr, obeg + 16u + 4u * sq, oend);
    var pw0 = p8_w_at(obeg + wo0, wi, oend); var pw1 = p8_w_at(obeg + wo0 + 8u, wi, oend);
    var pw2 = p8_w_at(obeg + wo0 + 16u, wi, oend); var pw3 = p8_w_at(obeg + wo0 + 24u, wi, oend);
    var acc = V4Sums();
    for (var o0 = obeg; o0 < oend; o0 += 32u) {
        k32_dy[sr][sq] = p0; k32_dy[sr][sq + 4u] = p1;
        k32_w[wo0][wq] = ternary_quad(pw0, wq % 4u); k32_w[wo0 + 8u][wq] = ternary_quad(pw1, wq % 4u);
        k32_w[wo0 + 16u][wq] = ternary_quad(pw2, wq % 4u); k32_w[wo0 + 24u][wq] = ternary_quad(pw3, wq % 4u);
        workgroupBarrier();
        let o1 = o0 + 32u;
        p0 = v4_dy_quad(n0 + sr, o1 + 4u * sq, oend); p1 = v4_dy_quad(n0 + sr, o1 + 16u + 4u * sq, oend);
        pw0 = p8_w_at(o1 + wo0, wi, oend); pw1 = p8_w_at(o1 + wo0 + 8u, wi, oend);
        pw2 = p8_w_at(o1 + wo0 + 16u, wi, oend); pw3 = p8_w_at(o1 + wo0 + 24u, wi, oend);
        acc = k32_oq(acc, 0u, ty, tx); acc = k32_oq(acc, 1u, ty, tx);
        acc = k32_oq(acc, 2u, ty, tx); acc = k32_oq(acc, 3u, ty, tx);
        acc = k32_oq(acc, 4u, ty, tx); acc = k32_oq(acc, 5u, ty, tx);
        acc = k32_oq(acc, 6u, ty, tx); acc = k32_oq(acc, 7u, ty, tx);
        workgroupBarrier();
    }
    v4_store_all(acc, n0, ty, wq0, tx, wid.z);
}

@compute @workgroup_size(16, 16)
fn bwd_2s_v4(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let n0 = wid.y * 64u;
    let wq0 = wid.x * 8u;
    let obeg = wid.z * bl_p.ko;
    let oend = min(bl_p.o, (wid.z + 1u) * bl_p.ko);
    let sr = lid / 4u;
    let sq = lid % 4u;
    let wo0 = lid / 32u;
    let wq = lid % 32u;
    let wi = wq0 + wq / 4u;
    s2_dy[0][sr][sq] = v4_dy_quad(n0 + sr, obeg + 4u * sq, oend);
    s2_w[0][wo0][wq] = ternary_quad(p8_w_at(obeg + wo0, wi, oend), wq % 4u);
    s2_w[0][wo0 + 8u][wq] = ternary_quad(p8_w_at(obeg + wo0 + 8u, wi, oend), wq % 4u);
    workgroupBarrier();
    var acc = V4Sums();
    var b = 0u;
    for (var o0 = obeg; o0 < oend; o0 += 16u) {
        let o1 = o0 + 16u;
        let p = v4_dy_quad(n0 + sr, o1 + 4u * sq, oend);
        let pw0 = p8_w_at(o1 + wo0, wi, oend); let pw1 = p8_w_at(o1 + wo0 + 8u, wi, oend);
        acc = s2_oq(acc, b, 0u, ty, tx); acc = s2_oq(acc, b, 1u, ty, tx);
        acc = s2_oq(acc, b, 2u, ty, tx); acc = s2_oq(acc, b, 3u, ty, tx);
        let nb = 1u - b;    // read last in the turn before, whose barrier all threads passed
        s2_dy[nb][sr][sq] = p;
        s2_w[nb][wo0][wq] = ternary_quad(pw0, wq % 4u);
        s2_w[nb][wo0 + 8u][wq] = ternary_quad(pw1, wq % 4u);
        workgroupBarrier();
        b = nb;
    }
    v4_store_all(acc, n0, ty, wq0, tx, wid.z);
}
