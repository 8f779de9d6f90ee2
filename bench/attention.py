"""Time the attention kernels (attention_forward over a whole sequence, and on GPUs
attention_forward_tiled; attention_backward_dq, _dqs on GPUs (from the forward's out and
lse), _dkv) at given shapes, the GPU ones and the per-row CPU ones (`*_rows`, where D % 4 == 0),
against the float64 numpy reference; optionally also the same entry points from another
copy of attention.wgsl (e.g. an older commit's, with shaders/prelude.wgsl appended).
Native only (numpy).

    python -m bitlora.bench.attention [--shapes 1x256x20x5x128,4x128x4x2x32] [--reps 10]
        [--kinds gpu,cpu] [--old FILE.wgsl]   # git show REV:shaders/attention.wgsl REV:shaders/prelude.wgsl > FILE.wgsl

A shape is BxTxHxHkvxD. Prints ms per call of each kernel (min over repeated batches
of `reps` dispatches in one submit) and the max relative error of dq, dk, dv.
`--step` adds, per kind, the attention a training step records (ops.attention, which
on GPUs runs the 32-row kernels where D % 4 == 0 and D <= 128: attention_forward_q32,
_dqs_q32 from the forward's out and lse, _dkv_q32 and the reduces of shared KV heads'
dk, dv), forward and backward timed as wholes, with the kernels it dispatched named:

    python -m bitlora.bench.attention --shapes 2x512x20x5x128 --kinds gpu --step   # config B's
"""
from __future__ import annotations

import argparse
import asyncio
import pathlib
import struct
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "tests"))     # the numpy reference lives with the tests

from bitlora import gpu  # noqa: E402
from bitlora.gpu.device import read_shader  # noqa: E402
from bitlora.ops import attention, splitk  # noqa: E402
from bitlora.ops.attention import ROWS_WG, zero_pos  # noqa: E402


def reference(do, q, k, v, B, T, H, Hkv, D):
    from test_backward import attention_backward_ref
    return attention_backward_ref(*(a.astype(np.float64) for a in (do, q, k, v)), B, T, H, Hkv, D)


async def timed(dev, record, reps, batches=3):
    best = float("inf")
    for _ in range(batches):
        for _ in range(reps):
            record()
        await dev.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            record()
        await dev.sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best * 1e3


async def rel_errors(dev, grads, want) -> str:
    """"  max rel err dq=.. dk=.. dv=..": each of grads (dq, dk, dv buffers) against want's."""
    got = [np.frombuffer(await dev.read(b), np.float32)[:w.size].reshape(w.shape) for b, w in zip(grads, want)]
    return "  max rel err " + " ".join(f"{n}={np.abs(g - w).max() / np.abs(w).max():.1e}"
                                       for n, g, w in zip(("dq", "dk", "dv"), got, want))


async def main(args):
    dev = await gpu.get_device("native")
    print(dev.describe())
    sources = [("new", read_shader("attention.wgsl"), args.rows)]
    if args.old:
        sources.append(("old", pathlib.Path(args.old).read_text(), args.old_rows))
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        B, T, H, Hkv, D = map(int, shape.split("x"))
        N = B * T
        q, do = (rng.standard_normal((N, H * D)).astype(np.float32) for _ in range(2))
        k, v = (rng.standard_normal((N, Hkv * D)).astype(np.float32) for _ in range(2))
        bufs = [dev.buffer(4 * a.size, name, data=a) for a, name in ((do, "dout"), (q, "q"), (k, "k"), (v, "v"))]
        dq, dk, dv = dev.buffer(4 * N * H * D, "dq"), dev.buffer(4 * N * Hkv * D, "dk"), dev.buffer(4 * N * Hkv * D, "dv")
        stats = dev.buffer(4 * N * H * 2, "stats")
        want = reference(do, q, k, v, B, T, H, Hkv, D) if args.check else None
        out, lse = dev.buffer(4 * N * H * D, "out"), dev.buffer(4 * N * H, "lse")
        fparams = struct.pack("<IIIIIIIf", B, T, H, Hkv, D, T, 0, D ** -0.5)
        params = struct.pack("<IIIIIf", B, T, H, Hkv, D, D ** -0.5)
        for name, src, rows in sources:
            for kind in args.kinds.split(","):
                if kind == "cpu" and (D % 4 or "attention_forward_rows" not in src):
                    continue
                suffix = "_rows" if kind == "cpu" else ""
                kf = await dev.compile(src, "attention_forward" + suffix)
                kq = await dev.compile(src, "attention_backward_dq" + suffix)
                kkv = await dev.compile(src, "attention_backward_dkv" + suffix)
                tiled = kind == "gpu" and "fn attention_forward_tiled" in src
                kt = await dev.compile(src, "attention_forward_tiled") if tiled else None
                kqs = await dev.compile(src, "attention_backward_dqs") if kind == "gpu" and "fn attention_backward_dqs" in src else None
                blocks = B * -(-T // rows)
                gf, gq, gkv = ((-(-N * H // ROWS_WG), -(-N * H // ROWS_WG), -(-N * Hkv // ROWS_WG)) if kind == "cpu"
                               else (N * H, blocks * H, blocks * Hkv))
                # + kv_pos (0 here) and, for the GPU kernel, k again as vec4s (ops/attention.py)
                fb = bufs[1:] + [out, lse, zero_pos(dev)] + ([bufs[2]] if kind == "gpu" else [])
                rf = lambda: dev.dispatch(kf, fb, groups=gf, params=fparams)  # noqa: E731
                rq = lambda: dev.dispatch(kq, bufs + [dq, stats], groups=gq, params=params)  # noqa: E731
                rkv = lambda: dev.dispatch(kkv, bufs + [stats, dk, dv], groups=gkv, params=params)  # noqa: E731
                rq()
                rkv()
                err = ""
                if want is not None:
                    err = await rel_errors(dev, (dq, dk, dv), want)
                tf = await timed(dev, rf, args.reps)
                tq = await timed(dev, rq, args.reps)
                tkv = await timed(dev, rkv, args.reps)
                extra = ""
                if kt is not None:   # the tiled forward (whole sequences, prompts): 8-row blocks
                    tt = await timed(dev, lambda: dev.dispatch(kt, fb[:6], groups=B * -(-T // 8) * H, params=fparams),
                                     args.reps)
                    extra += f"  forward_tiled {tt:8.3f} ms"
                if kqs is not None:  # dq from the forward's out and lse (rf above wrote them)
                    rf()
                    tqs = await timed(dev, lambda: dev.dispatch(kqs, bufs + [dq, stats, out, lse], groups=gq,
                                                                 params=params), args.reps)
                    extra += f"  dqs {tqs:8.3f} ms"
                    if want is not None:
                        got = np.frombuffer(await dev.read(dq), np.float32)[:want[0].size].reshape(want[0].shape)
                        extra += f" (err {np.abs(got - want[0]).max() / np.abs(want[0]).max():.1e})"
                print(f"{shape:>18} {name} {kind}: forward {tf:8.3f} ms  dq {tq:8.3f} ms  dkv {tkv:8.3f} ms  "
                      f"backward {tq + tkv:8.3f} ms{extra}{err}", flush=True)
        if args.step:
            for kind in args.kinds.split(","):
                print(f"{shape:>18} step {kind}: " + await step_path(dev, kind, bufs, dq, dk, dv, stats, out, lse,
                                                                  (B, T, H, Hkv, D), want, args.reps), flush=True)


async def step_path(dev, kind, bufs, dq, dk, dv, stats, out, lse, shape, want, reps) -> str:
    """Time the attention a training step records (ops.attention under Device.kind_as(kind):
    on GPUs the 32-row kernels where D % 4 == 0 and D <= 128, dk and dv of shared KV heads
    added up after), forward and backward from the forward's out and lse, and check dq, dk,
    dv against the float64 reference."""
    B, T, H, Hkv, D = shape
    do, q, k, v = bufs
    await dev.prepare(attention.kernel_specs(training=True, kind=kind) + splitk.kernel_specs(training=True, kind=kind))
    with dev.kind_as(kind):
        fwd = lambda: attention.attention_forward(dev, q, k, v, out, lse, B, T, H, Hkv, D, S=T)  # noqa: E731
        bwd = lambda: attention.attention_backward(dev, do, q, k, v, dq, dk, dv, stats, B, T, H, Hkv, D,  # noqa: E731
                                                   out=out, lse=lse)
        prog = dev.record(lambda: (fwd(), bwd()))   # to name the kernels the step dispatches
        entries = [c[1].name.split(":")[-1] for c in prog.recorded if c[0] == "dispatch"]
        tf = await timed(dev, fwd, reps)
        fwd()
        tb = await timed(dev, bwd, reps)
    err = "" if want is None else await rel_errors(dev, (dq, dk, dv), want)
    return f"forward {tf:8.3f} ms  backward {tb:8.3f} ms  ({' '.join(entries)}){err}"


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x256x20x5x128,4x128x4x2x32")
    ap.add_argument("--kinds", default="gpu,cpu", help="the GPU kernels, the per-row CPU ones (D % 4 == 0), or both")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--old", default="", help="another attention.wgsl (prelude included) to time beside the current one")
    ap.add_argument("--rows", type=int, default=8, help="rows per workgroup of the current kernels")
    ap.add_argument("--old-rows", type=int, default=1, help="rows per workgroup of the --old kernels")
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the numpy reference")
    ap.add_argument("--step", action="store_true",
                    help="also time the attention a training step records (ops.attention), per --kinds")
    asyncio.run(main(ap.parse_args()))
