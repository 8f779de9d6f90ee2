// ---------------- forward variant: weights decoded into workgroup memory
struct LinParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, kw: u32, split: u32 };
@group(0) @binding(0) var<uniform> lp: LinParams;
@group(0) @binding(1) var<storage, read> l_xq: array<f32>;
@group(0) @binding(2) var<storage, read> l_s: array<f32>;
@group(0) @binding(3) var<storage, read> l_w: array<u32>;
@group(0) @binding(4) var<storage, read_write> l_y: array<f32>;
@group(0) @binding(5) var<storage, read_write> l_part: array<f32>;
var<workgroup> f_x: array<array<vec4<f32>, 8>, 64>;   // [row][col quad], 32 columns
var<workgroup> f_w: array<array<vec4<f32>, 8>, 64>;   // [output][col quad], decoded

fn ternary_quad(word: u32, q: u32) -> vec4<f32> {
    let b = word >> (8u * q);
    return vec4<f32>(vec4<u32>(b & 3u, (b >> 2u) & 3u, (b >> 4u) & 3u, (b >> 6u) & 3u)) - 1.0;
}

@compute @workgroup_size(16, 16)
fn fwd_shared(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = lp.n;
    let I = lp.i;
    let O = lp.o;
    let words = (I + 15u) / 16u;
    let n0 = wid.y * 64u;
    let o0 = wid.x * 64u;
    let wend = min(words, (wid.z + 1u) * lp.kw);
    var acc: array<vec4<f32>, 4>;
    for (var a = 0u; a < 4u; a++) { acc[a] = vec4<f32>(0.0); }
    for (var w0 = wid.z * lp.kw; w0 < wend; w0 += 2u) {
        for (var m = 0u; m < 8u; m++) {
            let e = lid + 256u * m;
            let r = e / 32u;
            let c = w0 * 16u + e % 32u;
            var v = 0.0;
            if (n0 + r < N && c < I) { v = l_xq[(n0 + r) * I + c]; }
            f_x[r][(e % 32u) / 4u][e % 4u] = v;
        }
        for (var m = 0u; m < 2u; m++) {           // 64 outputs x 8 quads
            let e = lid + 256u * m;
            let ol = e / 8u;
            let q = e % 8u;
            let wi = w0 + q / 4u;
            var word = 0x55555555u;
            if (o0 + ol < O && wi < wend) { word = l_w[(o0 + ol) * words + wi]; }
            f_w[ol][q] = ternary_quad(word, q % 4u);
        }
        workgroupBarrier();
        for (var q = 0u; q < 8u; q++) {
            let t0 = f_w[tx][q];
            let t1 = f_w[tx + 16u][q];
            let t2 = f_w[tx + 32u][q];
            let t3 = f_w[tx + 48u][q];
            for (var a = 0u; a < 4u; a++) {
                let xv = f_x[ty + 16u * a][q];
                acc[a] += vec4<f32>(dot(xv, t0), dot(xv, t1), dot(xv, t2), dot(xv, t3));
            }
        }
        workgroupBarrier();
    }
    for (var a = 0u; a < 4u; a++) {
        let n = n0 + ty + 16u * a;
        if (n >= N) { continue; }
        for (var b = 0u; b < 4u; b++) {
            let o = o0 + tx + 16u * b;
            if (o < O) {
                let idx = n * O + o;
                if (lp.split != 0u) { l_part[wid.z * N * O + idx] = acc[a][b]; continue; }
                let v = acc[a][b] * lp.scale / l_s[n];
                if (lp.accumulate != 0u) { l_y[idx] = l_y[idx] + v; } else { l_y[idx] = v; }
            }
        }
    }
}

// ---------------- backward variant: decoded weights in workgroup memory
struct BParams { n: u32, i: u32, o: u32, scale: f32, accumulate: u32, ko: u32, split: u32 };
@group(0) @binding(0) var<uniform> bp: BParams;
@group(0) @binding(1) var<storage, read> b_dy: array<f32>;
@group(0) @binding(2) var<storage, read> b_w: array<u32>;
@group(0) @binding(3) var<storage, read_write> b_dx: array<f32>;
@group(0) @binding(4) var<storage, read_write> b_part: array<f32>;
var<workgroup> b_dysh: array<array<vec4<f32>, 4>, 64>;   // [row][o quad], 16 o
var<workgroup> b_wsh: array<array<vec4<f32>, 32>, 16>;   // [o][col quad], 128 columns

@compute @workgroup_size(16, 16)
fn bwd_shared(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = bp.n;
    let I = bp.i;
    let O = bp.o;
    let W = (I + 15u) / 16u;
    let n0 = wid.y * 64u;
    let wq0 = wid.x * 8u;                      // first word of this tile (128 columns)
    let oend = min(O, (wid.z + 1u) * bp.ko);
    var acc: array<array<vec4<f32>, 2>, 4>;    // [row a][quad j]: row ty + 16a, quad tx + 16j
    for (var a = 0u; a < 4u; a++) { acc[a][0] = vec4<f32>(0.0); acc[a][1] = vec4<f32>(0.0); }
    for (var o0 = wid.z * bp.ko; o0 < oend; o0 += 16u) {
        for (var m = 0u; m < 4u; m++) {        // dy: 64 rows x 16 o
            let e = lid + 256u * m;
            let rr = e / 16u;
            let oo = e % 16u;
            var dv = 0.0;
            if (n0 + rr < N && o0 + oo < oend) { dv = b_dy[(n0 + rr) * O + o0 + oo]; }
            b_dysh[rr][oo / 4u][oo % 4u] = dv;
        }
        for (var m = 0u; m < 2u; m++) {        // w: 16 o x 32 quads, decoded
            let e = lid + 256u * m;
            let oo = e / 32u;
            let q = e % 32u;
            let wi = wq0 + q / 4u;
            var word = 0x55555555u;
            if (o0 + oo < oend && wi < W) { word = b_w[(o0 + oo) * W + wi]; }
            b_wsh[oo][q] = ternary_quad(word, q % 4u);
        }
        workgroupBarrier();
        for (var oq = 0u; oq < 4u; oq++) {
            var d: array<vec4<f32>, 4>;
            for (var a = 0u; a < 4u; a++) { d[a] = b_dysh[ty + 16u * a][oq]; }
            for (var k = 0u; k < 4u; k++) {
                let w0 = b_wsh[oq * 4u + k][tx];
                let w1 = b_wsh[oq * 4u + k][tx + 16u];
                for (var a = 0u; a < 4u; a++) {
                    let dd = d[a][k];
                    acc[a][0] += dd * w0;
                    acc[a][1] += dd * w1;
                }
            }
        }
        workgroupBarrier();
    }
    for (var a = 0u; a < 4u; a++) {
        let n = n0 + ty + 16u * a;
        if (n >= N) { continue; }
        for (var j = 0u; j < 2u; j++) {
            for (var c = 0u; c < 4u; c++) {
                let i = (wq0 * 4u + tx + 16u * j) * 4u + c;
                if (i < I) {
                    let idx = n * I + i;
                    if (bp.split != 0u) { b_part[wid.z * N * I + idx] = acc[a][j][c]; continue; }
                    let g = bp.scale * acc[a][j][c];
                    if (bp.accumulate != 0u) { b_dx[idx] = b_dx[idx] + g; } else { b_dx[idx] = g; }
                }
            }
        }
    }
}

// ---------------- forward, register decode, no function-local arrays (all unrolled)
@compute @workgroup_size(16, 16)
fn fwd_unrolled(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = lp.n;
    let I = lp.i;
    let O = lp.o;
    let words = (I + 15u) / 16u;
    let n0 = wid.y * 64u;
    let o0 = wid.x * 64u;
    let wend = min(words, (wid.z + 1u) * lp.kw);
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    let ob0 = (o0 + tx) * words;
    let ob1 = (o0 + tx + 16u) * words;
    let ob2 = (o0 + tx + 32u) * words;
    let ob3 = (o0 + tx + 48u) * words;
    let ok0 = o0 + tx < O;
    let ok1 = o0 + tx + 16u < O;
    let ok2 = o0 + tx + 32u < O;
    let ok3 = o0 + tx + 48u < O;
    for (var w0 = wid.z * lp.kw; w0 < wend; w0 += 4u) {
        for (var m = 0u; m < 16u; m++) {
            let e = lid + 256u * m;
            let r = e / 64u;
            let c = w0 * 16u + e % 64u;
            var v = 0.0;
            if (n0 + r < N && c < I) { v = l_xq[(n0 + r) * I + c]; }
            u_x[r][(e % 64u) / 4u][e % 4u] = v;
        }
        workgroupBarrier();
        for (var wd = 0u; wd < 4u; wd++) {
            let wi = w0 + wd;
            let inb = wi < wend;
            let w_0 = select(0x55555555u, l_w[ob0 + min(wi, words - 1u)], inb && ok0);
            let w_1 = select(0x55555555u, l_w[ob1 + min(wi, words - 1u)], inb && ok1);
            let w_2 = select(0x55555555u, l_w[ob2 + min(wi, words - 1u)], inb && ok2);
            let w_3 = select(0x55555555u, l_w[ob3 + min(wi, words - 1u)], inb && ok3);
            for (var q = 0u; q < 4u; q++) {
                let t0 = ternary_quad(w_0, q);
                let t1 = ternary_quad(w_1, q);
                let t2 = ternary_quad(w_2, q);
                let t3 = ternary_quad(w_3, q);
                let c = wd * 4u + q;
                let x0 = u_x[ty][c];
                let x1 = u_x[ty + 16u][c];
                let x2 = u_x[ty + 32u][c];
                let x3 = u_x[ty + 48u][c];
                acc0 += vec4<f32>(dot(x0, t0), dot(x0, t1), dot(x0, t2), dot(x0, t3));
                acc1 += vec4<f32>(dot(x1, t0), dot(x1, t1), dot(x1, t2), dot(x1, t3));
                acc2 += vec4<f32>(dot(x2, t0), dot(x2, t1), dot(x2, t2), dot(x2, t3));
                acc3 += vec4<f32>(dot(x3, t0), dot(x3, t1), dot(x3, t2), dot(x3, t3));
            }
        }
        workgroupBarrier();
    }
    fwd_store(n0 + ty, o0 + tx, acc0, wid.z);
    fwd_store(n0 + ty + 16u, o0 + tx, acc1, wid.z);
    fwd_store(n0 + ty + 32u, o0 + tx, acc2, wid.z);
    fwd_store(n0 + ty + 48u, o0 + tx, acc3, wid.z);
}
var<workgroup> u_x: array<array<vec4<f32>, 16>, 64>;

fn fwd_store(n: u32, o: u32, acc: vec4<f32>, z: u32) {
    if (n >= lp.n) { return; }
    for (var b = 0u; b < 4u; b++) {
        let oo = o + 16u * b;
        if (oo < lp.o) {
            let idx = n * lp.o + oo;
            if (lp.split != 0u) { l_part[z * lp.n * lp.o + idx] = acc[b]; continue; }
            let v = acc[b] * lp.scale / l_s[n];
            if (lp.accumulate != 0u) { l_y[idx] = l_y[idx] + v; } else { l_y[idx] = v; }
        }
    }
}

// ---------------- backward, shared decoded weights, unrolled registers
@compute @workgroup_size(16, 16)
fn bwd_unrolled(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>) {
    let tx = lid3.x;
    let ty = lid3.y;
    let lid = ty * 16u + tx;
    let N = bp.n;
    let I = bp.i;
    let O = bp.o;
    let W = (I + 15u) / 16u;
    let n0 = wid.y * 64u;
    let wq0 = wid.x * 8u;
    let oend = min(O, (wid.z + 1u) * bp.ko);
    var a00 = vec4<f32>(0.0); var a01 = vec4<f32>(0.0);
    var a10 = vec4<f32>(0.0); var a11 = vec4<f32>(0.0);
    var a20 = vec4<f32>(0.0); var a21 = vec4<f32>(0.0);
    var a30 = vec4<f32>(0.0); var a31 = vec4<f32>(0.0);
    for (var o0 = wid.z * bp.ko; o0 < oend; o0 += 16u) {
        for (var m = 0u; m < 4u; m++) {
            let e = lid + 256u * m;
            let rr = e / 16u;
            let oo = e % 16u;
            var dv = 0.0;
            if (n0 + rr < N && o0 + oo < oend) { dv = b_dy[(n0 + rr) * O + o0 + oo]; }
            b_dysh[rr][oo / 4u][oo % 4u] = dv;
        }
        for (var m = 0u; m < 2u; m++) {
            let e = lid + 256u * m;
            let oo = e / 32u;
            let q = e % 32u;
            let wi = wq0 + q / 4u;
            var word = 0x55555555u;
            if (o0 + oo < oend && wi < W) { word = b_w[(o0 + oo) * W + wi]; }
            b_wsh[oo][q] = ternary_quad(word, q % 4u);
        }
        workgroupBarrier();
        for (var oq = 0u; oq < 4u; oq++) {
            let d0 = b_dysh[ty][oq];
            let d1 = b_dysh[ty + 16u][oq];
            let d2 = b_dysh[ty + 32u][oq];
            let d3 = b_dysh[ty + 48u][oq];
            var w0 = b_wsh[oq * 4u][tx];
            var w1 = b_wsh[oq * 4u][tx + 16u];
            a00 += d0.x * w0; a01 += d0.x * w1; a10 += d1.x * w0; a11 += d1.x * w1;
            a20 += d2.x * w0; a21 += d2.x * w1; a30 += d3.x * w0; a31 += d3.x * w1;
            w0 = b_wsh[oq * 4u + 1u][tx];
            w1 = b_wsh[oq * 4u + 1u][tx + 16u];
            a00 += d0.y * w0; a01 += d0.y * w1; a10 += d1.y * w0; a11 += d1.y * w1;
            a20 += d2.y * w0; a21 += d2.y * w1; a30 += d3.y * w0; a31 += d3.y * w1;
            w0 = b_wsh[oq * 4u + 2u][tx];
            w1 = b_wsh[oq * 4u + 2u][tx + 16u];
            a00 += d0.z * w0; a01 += d0.z * w1; a10 += d1.z * w0; a11 += d1.z * w1;
            a20 += d2.z * w0; a21 += d2.z * w1; a30 += d3.z * w0; a31 += d3.z * w1;
            w0 = b_wsh[oq * 4u + 3u][tx];
            w1 = b_wsh[oq * 4u + 3u][tx + 16u];
            a00 += d0.w * w0; a01 += d0.w * w1; a10 += d1.w * w0; a11 += d1.w * w1;
            a20 += d2.w * w0; a21 += d2.w * w1; a30 += d3.w * w0; a31 += d3.w * w1;
        }
        workgroupBarrier();
    }
    let c0 = (wq0 * 4u + tx) * 4u;
    let c1 = (wq0 * 4u + tx + 16u) * 4u;
    bwd_store(n0 + ty, c0, a00, wid.z); bwd_store(n0 + ty, c1, a01, wid.z);
    bwd_store(n0 + ty + 16u, c0, a10, wid.z); bwd_store(n0 + ty + 16u, c1, a11, wid.z);
    bwd_store(n0 + ty + 32u, c0, a20, wid.z); bwd_store(n0 + ty + 32u, c1, a21, wid.z);
    bwd_store(n0 + ty + 48u, c0, a30, wid.z); bwd_store(n0 + ty + 48u, c1, a31, wid.z);
}

fn bwd_store(n: u32, i0: u32, acc: vec4<f32>, z: u32) {
    if (n >= bp.n) { return; }
    for (var c = 0u; c < 4u; c++) {
        let i = i0 + c;
        if (i < bp.i) {
            let idx = n * bp.i + i;
            if (bp.split != 0u) { b_part[z * bp.n * bp.i + idx] = acc[c]; continue; }
            let g = bp.scale * acc[c];
            if (bp.accumulate != 0u) { b_dx[idx] = b_dx[idx] + g; } else { b_dx[idx] = g; }
        }
    }
}
