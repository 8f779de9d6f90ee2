"""Time the attention backward kernels (attention_backward_dq, _dkv) at given shapes,
against the float64 numpy reference; optionally also the same entry points from another
copy of attention.wgsl (e.g. an older commit's, with shaders/prelude.wgsl appended).
Native only (numpy).

    python -m bitlora.bench.attention [--shapes 1x256x20x5x128,4x68x4x2x32] [--reps 10]
        [--old FILE.wgsl]      # git show REV:shaders/attention.wgsl REV:shaders/prelude.wgsl > FILE.wgsl

A shape is BxTxHxHkvxD. Prints ms per call of each kernel (min over repeated batches
of `reps` dispatches in one submit) and the max relative error of dq, dk, dv.
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
        params = struct.pack("<IIIIIf", B, T, H, Hkv, D, D ** -0.5)
        for name, src, rows in sources:
            kq = await dev.compile(src, "attention_backward_dq")
            kkv = await dev.compile(src, "attention_backward_dkv")
            blocks = B * -(-T // rows)
            rq = lambda: dev.dispatch(kq, bufs + [dq, stats], groups=blocks * H, params=params)  # noqa: E731
            rkv = lambda: dev.dispatch(kkv, bufs + [stats, dk, dv], groups=blocks * Hkv, params=params)  # noqa: E731
            rq()
            rkv()
            err = ""
            if want is not None:
                got = [np.frombuffer(await dev.read(b), np.float32)[:w.size].reshape(w.shape) for b, w in zip((dq, dk, dv), want)]
                err = "  max rel err " + " ".join(f"{n}={np.abs(g - w).max() / np.abs(w).max():.1e}"
                                                  for n, g, w in zip(("dq", "dk", "dv"), got, want))
            tq = await timed(dev, rq, args.reps)
            tkv = await timed(dev, rkv, args.reps)
            print(f"{shape:>18} {name}: dq {tq:8.3f} ms  dkv {tkv:8.3f} ms  sum {tq + tkv:8.3f} ms{err}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="1x256x20x5x128,4x68x4x2x32")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--old", default="", help="another attention.wgsl (prelude included) to time beside the current one")
    ap.add_argument("--rows", type=int, default=8, help="rows per workgroup of the current kernels")
    ap.add_argument("--old-rows", type=int, default=1, help="rows per workgroup of the --old kernels")
    ap.add_argument("--no-check", dest="check", action="store_false", help="skip the numpy reference")
    asyncio.run(main(ap.parse_args()))
