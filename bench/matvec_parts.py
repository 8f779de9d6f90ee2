"""Where a decoding step's matrix-vector time goes, on a GPU (native wgpu-py).

    python -m bitlora.bench.matvec_parts [--groups qkv,o,gate_up,down] [--layers 30] [--reps 8]

For each of a 2B-4T layer's input groups (q,k,v; o; gate,up; down with its gated norm),
30 layers' worth of random packed weights (distinct buffers, as a decoding step reads
them: no cache serves a repeat), and the microseconds per call of:

- norm_matvec as ops/matvec.py records it (and with one row block a workgroup where it
  would batch them);
- rmsnorm_quant + ternary_matvec, the unfused pair (the path of an adapted group);
- ternary_matvec alone (its int8 row already in a buffer);
- norm_matvec's two halves apart (bench-only entry points below, same bindings and grid):
  the norm without the weights, and the product without the norm;
- an empty kernel of the same grid and bindings, and a vec4 copy of the weights' bytes.

Each figure is a program of `reps` x `layers` dispatches replayed in one submit and
waited for, less an empty submit's time, per dispatch. Not a test: the sums are not
checked (tests/test_decode_kernels.py does that)."""
from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import os
import struct

from bitlora import gpu
from bitlora.ops import matvec

from .steps import _copy_kernel_gb_per_s, _idle_s, _replay_s

# Bench-only entry points on matvec.wgsl's bindings. Each reads every binding norm_matvec
# binds (behind a branch no uniform takes) so that its layout is norm_matvec's.
PARTS_WGSL = """
fn mp_touch() {   // bindings 1-7 in the layout; never runs (accumulate is 0 or 1)
    if (mv_p.accumulate == 77u) {
        mv_y0[0] = nm_x[0] + nm_w[0] + f32(mv_w[0].x) + mv_y1[0] + mv_y2[0] + nm_u[0];
    }
}

@compute @workgroup_size(MV_WG)
fn mp_norm_only(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nw: vec3<u32>) {
    mp_touch();
    let lid = lid3.x;
    let st = nm_norm(lid);
    let s = st.x;
    let total = st.y;
    if (lid == 0u) { mv_y0[(wid.x + wid.y * nw.x) % mv_p.o0] = s + total + f32(nm_xq[1].x); }
}

@compute @workgroup_size(MV_WG)
fn mp_product_only(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(num_workgroups) nw: vec3<u32>) {
    mp_touch();
    let lid = lid3.x;
    let C = mv_p.c;
    for (var e = lid; e < 4u * ((C + 15u) / 16u); e += MV_WG) { nm_xq[e / 4u][e % 4u] = bitcast<u32>(nm_x[e % C]); }
    workgroupBarrier();
    let lane = lid % MV_TPR;
    let at = mv_locate((wid.x + wid.y * nw.x) * (MV_WG / MV_TPR) + lid / MV_TPR);
    var dot = 0;
    if (at.x < 3u) {
        for (var k = lane; k < mv_p.w4; k += MV_TPR) {
            dot += nm_dot(mv_w[at.z + k], k);
        }
    }
    mv_part[lid] = dot;
    workgroupBarrier();
    if (lane == 0u && at.x < 3u) {
        var sum = 0;
        for (var l = 0u; l < MV_TPR; l++) { sum += mv_part[lid + l]; }
        mv_put(at.x, at.y, mv_value(at.x, at.y, sum, 1.0, 0.0));
    }
}

@compute @workgroup_size(MV_WG)
fn mp_empty(@builtin(local_invocation_id) lid3: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
            @builtin(num_workgroups) nw: vec3<u32>) {
    mp_touch();
    if (lid3.x == 0u) { mv_y0[(wid.x + wid.y * nw.x) % mv_p.o0] = 1.0; }
}

@group(0) @binding(3) var<storage, read> mp_src: array<vec4<u32>>;
@group(0) @binding(4) var<storage, read_write> mp_dst: array<vec4<u32>>;

@compute @workgroup_size(256)
fn mp_copy(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    if (mv_p.accumulate == 77u) { mp_dst[0].x = u32(nm_x[0] + nm_w[0] + mv_y1[0] + mv_y2[0] + nm_u[0]); }
    let i = gid.x + gid.y * nw.x * 256u;
    if (i < arrayLength(&mp_src) && i < arrayLength(&mp_dst)) { mp_dst[i] = mp_src[i]; }
}
"""

# name: (inputs I, outputs of each part, gating before the norm, accumulate into y)
GROUPS = {"qkv": (2560, (2560, 640, 640), None, False), "o": (2560, (2560,), None, True),
          "gate_up": (2560, (6912, 6912), None, False), "down": (6912, (2560,), "relu2", True)}


def _floats(n: int, seed: int, lo: float = -1.0, hi: float = 1.0) -> bytes:
    rnd = __import__("random").Random(seed)
    return struct.pack(f"<{n}f", *(rnd.uniform(lo, hi) for _ in range(n)))


async def _time(dev, idle: float, calls: list, reps: int) -> tuple:
    """us per dispatch of `calls` (functions recording one call each) repeated `reps` times,
    the dispatches per call, and (where the backend stamps times between dispatches) the
    us per call in place: the median program's stamps, summed over its dispatches."""
    prog = dev.record(lambda: [c() for _ in range(reps) for c in calls])
    await _replay_s(dev, prog, idle, 1)
    sec = await _replay_s(dev, prog, idle)
    stamped = None
    if getattr(dev.backend, "can_time", False):
        runs = sorted(sum(dev.backend.replay_timed(prog.prepared)) for _ in range(5))
        stamped = runs[len(runs) // 2] / (reps * len(calls)) * 1e6
    return sec / (reps * len(calls)) * 1e6, prog.dispatches, stamped


async def main(args) -> None:
    dev = await gpu.get_device("native")
    print(dev.describe(), flush=True)
    if dev.kind != "gpu":   # a CPU adapter runs the GPU kernels too (slowly): a smoke test
        print("not a GPU adapter: timing the GPU kernels anyway", flush=True)
    with dev.kind_as("gpu"):
        await _groups(dev, args)


async def _groups(dev, args) -> None:
    await dev.prepare(matvec.kernel_specs(kind="gpu"))
    files = importlib.resources.files("bitlora.shaders")
    code = files.joinpath("matvec.wgsl").read_text() + PARTS_WGSL + files.joinpath("prelude.wgsl").read_text()
    idle = await _idle_s(dev)
    nbytes = min(256 << 20, int(dev.limits.get("maxStorageBufferBindingSize", 1 << 27)))
    copy = await _copy_kernel_gb_per_s(dev, nbytes)
    print(f"vec4 copy kernel, {nbytes >> 20} MiB: {copy:.0f} GB/s read + written (a kernel at half of it reads its "
          "weights in the 'half copy' time below)", flush=True)
    for name in args.groups.split(","):
        I, Os, act, acc = GROUPS[name]
        consts = matvec._gate_constants(act)
        diag = {e: await dev.compile(code, e, consts, label=e)
                for e in ("mp_norm_only", "mp_product_only", "mp_empty", "mp_copy")}
        for nb in args.batches:
            diag[f"nm{nb}"] = await dev.compile(code, "norm_matvec", {**(consts or {}), "NM_BATCH": float(nb)}, label=f"nm{nb}")
        words = I // 16
        rows = sum(Os)
        layers = [dev.buffer(4 * rows * words, f"w{i}", data=os.urandom(4 * rows * words)) for i in range(args.layers)]
        x, nw, u = (dev.buffer(4 * I, n, data=_floats(I, j)) for j, n in enumerate(("x", "nw", "u")))
        ys = [dev.buffer(4 * O, f"y{j}") for j, O in enumerate(Os)]
        xq, qs = dev.buffer(4 * matvec.xq_words(I), "xq"), dev.buffer(8, "qs")
        nbuf = dev.buffer(4 * I, "normed")
        dev.write(qs, struct.pack("<2f", 1.0, 0.0))
        offs = [sum(Os[:j]) * words for j in range(len(Os))]
        parts = [(off, O, 0.01, y) for off, O, y in zip(offs, Os, ys)]
        gate = (act, x, u) if act else None
        full = parts + [(0, 0, 0.0, matvec.spare(dev, j)) for j in range(len(parts), matvec.MAX_PARTS)]
        ybufs = [p[3] for p in full]
        params = matvec.MATVEC.pack(words // 4, *(p[1] for p in full), offs[1] // 4 if len(Os) > 1 else 0,
                                    offs[2] // 4 if len(Os) > 2 else 0, 0.01, 0.01, 0.01, int(acc), 0, 0.0,
                                    matvec.NONE, matvec.NONE, matvec.NONE, 0, I, 1e-5)
        groups = -(-rows // (matvec.WG // matvec.TPR))

        def bench_only(entry, grid=groups):
            return lambda wb: dev.dispatch(diag[entry], [x, nw, wb, *ybufs, u], groups=grid, params=params)

        def fused(wb):
            matvec.norm_matvec(dev, x, nw, 1e-5, wb, parts, I, acc, gate)

        def fused_plain(wb):
            matvec.norm_matvec(dev, x, nw, 1e-5, wb, parts, I, acc, gate, batch=1)

        def pair(wb):
            matvec.rmsnorm_quant(dev, x, nw, nbuf, xq, qs, I, 1e-5, gate)
            matvec.ternary_matvec(dev, xq, qs, wb, parts, I, acc)

        def product(wb):
            matvec.ternary_matvec(dev, xq, qs, wb, parts, I, acc)

        def norm(wb):
            matvec.rmsnorm_quant(dev, x, nw, nbuf, xq, qs, I, 1e-5, gate)

        variants = [("norm_matvec (as recorded)", fused)]
        if matvec.nm_batch(groups) > 1:
            variants.append(("norm_matvec, 1 row block a workgroup", fused_plain))
        variants += [(f"norm_matvec, {nb} row blocks a workgroup", bench_only(f"nm{nb}", -(-groups // nb)))
                     for nb in args.batches]
        variants += [("rmsnorm_quant + ternary_matvec", pair), ("ternary_matvec alone", product),
                     ("rmsnorm_quant alone (1 workgroup)", norm),
                     ("norm_matvec's norm alone (its grid)", bench_only("mp_norm_only")),
                     ("norm_matvec's product alone (no norm)", bench_only("mp_product_only")),
                     ("empty kernel, same grid + bindings", bench_only("mp_empty")),
                     ("vec4 copy of the weights", bench_only("mp_copy", -(-rows * words // 4 // 256)))]
        mb = 4 * rows * words / 1e6
        print(f"{name}: I {I}, outputs {'+'.join(map(str, Os))}, {groups} workgroups, {mb:.2f} MB of weights a call"
              + (f", norm gated ({act})" if act else "") + f"; half copy {2 * mb * 1e3 / copy:.2f} us", flush=True)
        print("  us a call: replayed (in place, from timestamps)", flush=True)
        for label, fn in variants:
            us, n, placed = await _time(dev, idle, [lambda wb=wb, fn=fn: fn(wb) for wb in layers], args.reps)
            per = n / (args.reps * len(layers))
            print(f"  {us:8.2f}" + (f" ({placed:6.2f})" if placed is not None else "")
                  + f" us a call ({per:.0f} dispatch{'es' if per > 1 else ''})  {label}"
                  + (f"  {mb * 1e3 / us:.0f} GB/s" if "copy" in label or "matvec" in label else ""), flush=True)
        dev.destroy(*layers, x, nw, u, *ys, xq, qs, nbuf)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--groups", default=",".join(GROUPS))
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--reps", type=int, default=8)
    ap.add_argument("--batches", type=lambda v: [int(b) for b in v.split(",") if b], default=[],
                    help="also time norm_matvec with these NM_BATCH row blocks a workgroup (e.g. 1,2,4)")
    asyncio.run(main(ap.parse_args()))
