"""Time the ternary matmul kernels (forward and input gradient) at given shapes, with
forced split-K slice counts, against numpy for correctness. Native only (numpy).

    python -m bitlora.bench.matmul [--shapes 256x2560x2560,256x2560x6912,256x6912x2560]
        [--variants FILE.wgsl --fwd-variants E1,E2 --bwd-variants E3] [--reps 20]

A shape is NxIxO (rows x inputs x outputs). Prints ms per call (min over repeated
batches of `reps` dispatches in one submit) and effective TMAC/s.
"""
from __future__ import annotations

import argparse
import asyncio
import pathlib
import struct
import time

import numpy as np

from bitlora import gpu
from bitlora.ops import splitk


def pack(codes):
    O, W16 = codes.shape
    packed = np.zeros((O, W16 // 16), np.uint32)
    for k in range(16):
        packed |= codes[:, k::16].astype(np.uint32) << (2 * k)
    return packed


async def main(args):
    dev = await gpu.get_device("native")
    print(dev.describe())
    await dev.prepare(splitk.kernel_specs())
    variants = pathlib.Path(args.variants).read_text() if args.variants else None
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        N, I, O = map(int, shape.split("x"))
        words = -(-I // 16)
        codes = rng.integers(0, 3, (O, words * 16)).astype(np.uint8)
        codes[:, I:] = 1
        t = codes[:, :I].astype(np.float64) - 1
        bw = dev.buffer(4 * O * words, "w", data=pack(codes))
        xq = rng.integers(-128, 128, (N, I)).astype(np.float32)
        s = rng.uniform(0.5, 2, N).astype(np.float32)
        dy = rng.standard_normal((N, O)).astype(np.float32)
        bx, bs, bdy = dev.buffer(4 * N * I, "x", data=xq), dev.buffer(4 * N, "s", data=s), dev.buffer(4 * N * O, "dy", data=dy)
        y, dx = dev.buffer(4 * N * O, "y"), dev.buffer(4 * N * I, "dx")
        want_y = (xq.astype(np.float64) @ t.T) * 0.5 / s[:, None]
        want_dx = dy.astype(np.float64) @ t * 0.5
        macs = N * I * O
        kernels = [] if args.no_current else [("fwd", "bitlinear.wgsl", "bitlinear_forward", 64, 4),
                                              ("bwd", "bitlinear.wgsl", "bitlinear_backward_input", 128, 16)]
        if variants:
            kernels += [("fwd", None, e, 64, 4 if "unrolled" in e else 2) for e in args.fwd_variants.split(",") if e]
            kernels += [("bwd", None, e, 128, 16) for e in args.bwd_variants.split(",") if e]
        for kind, shader, entry, tile_w, unit in kernels:
            k = await (dev.kernel(shader, entry) if shader else dev.compile(variants, entry, label=entry))
            K = words if kind == "fwd" else O
            cols = O if kind == "fwd" else I
            tiles = -(-(cols if kind == "fwd" else words * 16) // tile_w) * -(-N // 64)
            for split in args.splits:
                slices, per = splitk.plan(tiles, K, unit, split)
                part = splitk.scratch(dev, slices * N * cols)
                if kind == "fwd":
                    binds, out = [bx, bs, bw, y, part], y
                    params = struct.pack("<IIIfIII", N, I, O, 0.5, 0, per, int(slices > 1))
                    groups = (-(-O // 64), -(-N // 64), slices)
                else:
                    binds, out = [bdy, bw, dx, part], dx
                    params = struct.pack("<IIIfIII", N, I, O, 0.5, 0, per, int(slices > 1))
                    groups = (-(-words // (tile_w // 16)), -(-N // 64), slices)

                async def record():
                    dev.dispatch(k, binds, groups=groups, params=params)
                    if slices > 1:
                        splitk.reduce(dev, part, bs if kind == "fwd" else None, out, N * cols, slices, cols, 0.5, False)

                await record()
                got = np.frombuffer(await dev.read(out), np.float32).reshape(N, cols)
                want = want_y if kind == "fwd" else want_dx
                err = np.abs(got - want).max() / np.abs(want).max()
                best = 1e9
                for _ in range(3):
                    await dev.read(out, 0, 4)
                    t0 = time.perf_counter()
                    for _ in range(args.reps):
                        await record()
                    await dev.read(out, 0, 4)
                    best = min(best, (time.perf_counter() - t0) / args.reps)
                print(f"{shape:>16} {kind} {entry:26} split {slices:2d}: {best * 1e3:8.3f} ms  "
                      f"{macs / best / 1e12:6.2f} TMAC/s  err {err:.1e}", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="256x2560x2560,256x2560x6912,256x6912x2560,256x2560x640")
    ap.add_argument("--variants", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--fwd-variants", default="", help="forward entry points in --variants")
    ap.add_argument("--bwd-variants", default="", help="input-gradient entry points in --variants")
    ap.add_argument("--no-current", action="store_true", help="skip the kernels in shaders/")
    ap.add_argument("--splits", type=lambda v: [None if x == "auto" else int(x) for x in v.split(",")],
                    default=[None, 1, 2, 4, 8])
    asyncio.run(main(ap.parse_args()))
