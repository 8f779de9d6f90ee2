"""Latency probes for one-row kernels on a GPU: what a loop turn, a load in flight and a
workgroup reduction cost when a kernel is a chain of dependent steps (decoding's norms).

    python -m bitlora.bench.latency_probe [--cols 2560,6912] [--groups 1,160]

Each probe is a 256-invocation kernel over a row of C floats, dispatched back to back
(each writes the buffer the next reads, so they run one after another, as a decoding
step's kernels do), timed as a replayed program less an empty submit, per dispatch:

- loop1 / loop4 / loop8: the sum of squares over columns lid + 256 j, one load a loop
  turn or four / eight issued together in straight-line code (the same sum order);
- vec4: the same through 16-byte loads (columns 4 (lid + 256 j) .. + 3: another order);
- red3 / red30: 3 or 30 of the prelude's wg_sum after one loop1 pass;
- red30x2: 30 sums by a two-barrier evaluation of the same tree (straight-line code).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import struct

from bitlora import gpu

from .steps import _idle_s, _replay_s

PROBES = """
struct P { c: u32, pad0: u32, pad1: u32, pad2: u32 };
@group(0) @binding(0) var<uniform> pp: P;
@group(0) @binding(1) var<storage, read> px: array<f32>;
@group(0) @binding(2) var<storage, read_write> pout: array<f32>;
@group(0) @binding(1) var<storage, read> px4: array<vec4<f32>>;
var<workgroup> p_red32: array<vec4<f32>, 8>;

fn put(lid: u32, wid: u32, v: f32) { if (lid == 0u) { pout[wid] = v; } }

fn sq_loop1(lid: u32) -> f32 {
    var acc = 0.0;
    for (var c = lid; c < pp.c; c += 256u) { let v = px[c]; acc += v * v; }
    return acc;
}

@compute @workgroup_size(256)
fn loop1(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    put(l.x, w.x, wg_sum(l.x, sq_loop1(l.x), 256u));
}

fn at(c: u32) -> f32 { if (c < pp.c) { return px[c]; } return 0.0; }

@compute @workgroup_size(256)
fn loop4(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    var acc = 0.0;
    for (var c = l.x; c < pp.c; c += 1024u) {
        let a = at(c); let b = at(c + 256u); let d = at(c + 512u); let e = at(c + 768u);
        acc += a * a; acc += b * b; acc += d * d; acc += e * e;
    }
    put(l.x, w.x, wg_sum(l.x, acc, 256u));
}

@compute @workgroup_size(256)
fn loop8(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    var acc = 0.0;
    for (var c = l.x; c < pp.c; c += 2048u) {
        let a = at(c); let b = at(c + 256u); let d = at(c + 512u); let e = at(c + 768u);
        let a2 = at(c + 1024u); let b2 = at(c + 1280u); let d2 = at(c + 1536u); let e2 = at(c + 1792u);
        acc += a * a; acc += b * b; acc += d * d; acc += e * e;
        acc += a2 * a2; acc += b2 * b2; acc += d2 * d2; acc += e2 * e2;
    }
    put(l.x, w.x, wg_sum(l.x, acc, 256u));
}

@compute @workgroup_size(256)
fn vec4x(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    var acc = vec4<f32>(0.0);
    for (var i = l.x; i < pp.c / 4u; i += 256u) { let v = px4[i]; acc += v * v; }
    put(l.x, w.x, wg_sum(l.x, acc.x + acc.y + acc.z + acc.w, 256u));
}

@compute @workgroup_size(256)
fn red3(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    var t = sq_loop1(l.x);
    for (var i = 0u; i < 3u; i++) { t = wg_sum(l.x, t, 256u) * 1e-3; }
    put(l.x, w.x, t);
}

@compute @workgroup_size(256)
fn red30(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    var t = sq_loop1(l.x);
    for (var i = 0u; i < 30u; i++) { t = wg_sum(l.x, t, 256u) * 1e-3; }
    put(l.x, w.x, t);
}

fn sum2(lid: u32, x: f32) -> f32 {   // wg_sum(lid, x, 256)'s tree in two barriers
    wg_red[lid] = x;
    workgroupBarrier();
    if (lid < 32u) {
        let a = (wg_red[lid] + wg_red[lid + 128u]) + (wg_red[lid + 64u] + wg_red[lid + 192u]);
        let b = (wg_red[lid + 32u] + wg_red[lid + 160u]) + (wg_red[lid + 96u] + wg_red[lid + 224u]);
        p_red32[lid / 4u][lid % 4u] = a + b;
    }
    workgroupBarrier();
    let d0 = p_red32[0] + p_red32[4];
    let d1 = p_red32[1] + p_red32[5];
    let d2 = p_red32[2] + p_red32[6];
    let d3 = p_red32[3] + p_red32[7];
    let f = (d0 + d2) + (d1 + d3);
    return (f.x + f.z) + (f.y + f.w);
}

@compute @workgroup_size(256)
fn red30x2(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    var t = sq_loop1(l.x);
    for (var i = 0u; i < 30u; i++) { t = sum2(l.x, t) * 1e-3; }
    put(l.x, w.x, t);
}

@compute @workgroup_size(256)
fn empty(@builtin(local_invocation_id) l: vec3<u32>, @builtin(workgroup_id) w: vec3<u32>) {
    if (pp.c == 7u) { pout[0] = px[0]; }
    put(l.x, w.x, 1.0);
}
"""

ENTRIES = ("empty", "loop1", "loop4", "loop8", "vec4x", "red3", "red30", "red30x2")


async def main(args) -> None:
    dev = await gpu.get_device("native")
    print(dev.describe(), flush=True)
    prelude = importlib.resources.files("bitlora.shaders").joinpath("prelude.wgsl").read_text()
    ks = {e: await dev.compile(PROBES + prelude, e, label=e) for e in ENTRIES}
    idle = await _idle_s(dev)
    for C in map(int, args.cols.split(",")):
        x = dev.buffer(4 * C, "x", data=struct.pack(f"<{C}f", *[(i % 7) * 0.1 for i in range(C)]))
        out = dev.buffer(4 * 1024, "out")
        for g in map(int, args.groups.split(",")):
            line = []
            for e in ENTRIES:
                prog = dev.record(lambda: [dev.dispatch(ks[e], [x, out], groups=g, params=struct.pack("<4I", C, 0, 0, 0))
                                           for _ in range(args.reps)])
                await _replay_s(dev, prog, idle, 1)
                line.append(f"{e} {await _replay_s(dev, prog, idle) / args.reps * 1e6:6.2f}")
            print(f"C {C:5d}, {g:4d} workgroups (us a dispatch): " + ", ".join(line), flush=True)
        dev.destroy(x, out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cols", default="2560,6912")
    ap.add_argument("--groups", default="1,160,864")
    ap.add_argument("--reps", type=int, default=200)
    asyncio.run(main(ap.parse_args()))
