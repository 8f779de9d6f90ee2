"""Time the GPU LoRA kernels of one adapted projection (shaders/lora.wgsl): each plain
kernel beside its tile (*_tile, grad_x's in lora_grad_axb: the same bits), down also as a
split matmul (lora_down_mm) with its reduce, the split dA, dB sums with their reduce, and
the whole backward (ops.lora.lora_backward) with lora_grad_axb's parts in one dispatch
against a dispatch each, at given shapes. Native only.

    python -m bitlora.bench.lora_kernels [--shapes 1024x2560x2560x16,256x2560x640x8] [--reps 40] [--tq 1,2,8]

A shape is NxIxOxR (rows x inputs x outputs x rank), dropout 0.05. Prints ms per call:
`reps` dispatches of one kernel in one submit, best of 3 batches, less an empty submit's
time (the tiles are timed at every size, also where ops.lora would run the plain kernel).
"""
from __future__ import annotations

import argparse
import asyncio
import struct
import time

from bitlora import gpu
from bitlora.ops import lora, splitk

SHAPES = "1024x2560x2560x16,1024x2560x640x16,1024x2560x6912x16,1024x6912x2560x16,256x2560x2560x8,256x2560x640x8"


async def run(shapes: list, reps: int, tqs=()) -> list:
    dev = await gpu.get_device()
    await dev.prepare(lora.kernel_specs(training=True, kind="gpu"))
    await dev.prepare([(lora.SHADER, "lora_down_mm")])   # listed only with lora.MATMULS
    k = lambda e: dev.prepared(lora.SHADER, e, lora.tq_constants(e))  # noqa: E731
    idle = 1e9
    for _ in range(5):
        t = time.perf_counter()
        await dev.sync()
        idle = min(idle, time.perf_counter() - t)

    async def timed(calls) -> float:   # calls: [(kernel, bufs, groups, params)], or a function recording them
        best = 1e9
        for _ in range(3):
            for _ in range(reps):
                if callable(calls):
                    calls()
                    continue
                for kernel, bufs, groups, params in calls:
                    dev.dispatch(kernel, bufs, groups, params)
            t = time.perf_counter()
            await dev.sync()
            best = min(best, (time.perf_counter() - t - idle) / reps)
        return best * 1e3

    rows = []
    for N, I, O, R in shapes:
        s = lora.LoraShape(N, I, O, R, 2.0, 0.05, 7)
        P = s.params()
        f = lambda n, label: dev.buffer(4 * n, label)  # noqa: E731
        x, a, b, u, y = f(N * I, "x"), f(R * I, "a"), f(O * R, "b"), f(N * R, "u"), f(N * O, "y")
        dy, du, dx, f_da = f(N * O, "dy"), f(N * R, "du"), f(N * I, "dx"), f(R * I, "da")
        stream = dev.buffer(16, "stream", data=struct.pack("<4I", 3, 0, 0, 0))
        wide = (-(-N // lora.TRD), -(-R // lora.TK), 1)
        cols4 = lambda c, tq, wg=lora.WT: -(-(-(-N // (lora.TR * tq))) * (c // 4) // wg)  # noqa: E731
        row = {"shape": f"{N}x{I}x{O}x{R}"}
        boff, b_floats = lora._backward_scratch(N, I, O, R)
        scr, db = f(boff + b_floats, "scratch"), f(O * R, "db")   # dA's slices from 0, dB's from boff
        axb = [du, x, scr, stream, a, dx, db]   # lora_grad_axb's bindings
        axb_params = lambda per, ga, gx, gb: s.params(per, True, ga, gx, gb, boff, lora.split_plan(N, O, R)[0])  # noqa: E731
        gx = cols4(I, lora.TQ, lora.WG)
        for name, bufs, plain, tile in (
            ("lora_down", [x, a, u, stream], N * R, (k("lora_down_tile"), wide, P)),
            ("lora_up", [u, b, y], -(-N * O // 256), (k("lora_up_tile"), cols4(O, lora.TQ), P)),
            ("lora_grad_u", [dy, b, du], N * R, (k("lora_grad_u_tile"), wide, P)),
            ("lora_grad_x", [du, a, dx, stream], -(-N * I // 256), (k("lora_grad_axb"), gx, axb_params(0, 0, gx, 0))),
        ):
            tbufs = axb if name == "lora_grad_x" else bufs
            row[name] = (await timed([(k(name), bufs, plain, P)]), await timed([(tile[0], tbufs, tile[1], tile[2])]))
            if name == "lora_down":   # the split matmul and its reduce (ops.lora._down_mm), at every N
                slices, per = lora.mm_plan(N, I, R)
                part = f(slices * N * R, "part") if slices > 1 else u
                mm = (k("lora_down_mm"), [x, a, part, stream], (-(-N // lora.MMR), -(-R // 16), slices), s.params(per))
                reduce = (dev.prepared(splitk.SHADER, "splitk_reduce"), [part, part, u], -(-N * R // 256),
                          splitk.PARAMS.pack(N * R, slices, 1, 1.0, 0, 0))
                row["lora_down mm"] = (slices, await timed([mm] + ([reduce] if slices > 1 else [])))
            for tq in tqs if name in ("lora_up", "lora_grad_x") else ():   # the tile at other row-block turns (TQ)
                if name == "lora_up":
                    kt, groups, tp, tb = await dev.kernel(lora.SHADER, "lora_up_tile", {"TQ": tq}), cols4(O, tq), P, bufs
                else:
                    g = cols4(I, tq, lora.WG)
                    kt, groups, tp, tb = await dev.kernel(lora.SHADER, "lora_grad_axb", {"TQ": tq}), g, axb_params(0, 0, g, 0), axb
                row[f"{name} TQ={tq}"] = await timed([(kt, tb, groups, tp)])
        for name, cols in (("dB", O), ("dA", I)):
            slices, per = lora.split_plan(N, cols, R)
            count = cols * R
            g = f(count, "g")
            if name == "dB":
                split = (k("lora_grad_b_split"), [dy, u, scr.view(4 * boff, 4 * b_floats)],
                         (-(-cols // 256), -(-R // 4), slices), s.params(per, True))
                reduce = (k("lora_grad_axb"), axb, -(-count // 256), axb_params(0, 0, 0, -(-count // 256)))
            else:
                ga = -(-cols // 256) * -(-R // 4) * slices
                split = (k("lora_grad_axb"), axb, ga, axb_params(per, ga, 0, 0))
                reduce = (dev.prepared(splitk.SHADER, "splitk_reduce"), [scr, scr, g], -(-count // 256),
                          splitk.PARAMS.pack(count, slices, 1, 1.0, 1, 0))
            row[name] = (slices, await timed([split]), await timed([reduce]), await timed([split, reduce]))
        fused0 = lora.FUSED
        try:
            with dev.kind_as("gpu"):   # the GPU kernels, also on a CPU adapter
                for fused in (True, False):
                    lora.FUSED = fused
                    row["backward " + ("fused" if fused else "apart")] = await timed(
                        lambda: lora.lora_backward(dev, s, dy, x, a, b, u, f_da, db, du, stream, dx))
        finally:
            lora.FUSED = fused0
        rows.append(row)
        print(f"{row['shape']:>20}: " + "  ".join(f"{n[5:]} {row[n][0]:.4f} -> {row[n][1]:.4f}" for n in
                                                 ("lora_down", "lora_up", "lora_grad_u", "lora_grad_x"))
              + "".join(f"  {n[5:]} ({row[n][0]} slices, reduced) {row[n][1]:.4f}" for n in row if n.endswith(" mm"))
              + "".join(f"  {n} ({row[n][0]} slices) {row[n][1]:.4f} + reduce {row[n][2]:.4f} = {row[n][3]:.4f}"
                        for n in ("dB", "dA"))
              + "".join(f"  {n[5:]} {v:.4f}" for n, v in row.items() if "TQ=" in n)
              + "".join(f"  {n} {v:.4f}" for n, v in row.items() if n.startswith("backward")) + " ms", flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help="NxIxOxR,... (default: 2B-4T's projections at B's and A's N, R)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--tq", default="", help="also time lora_up_tile / lora_grad_x's tile at these TQ values (1,2,...)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]
    asyncio.run(run(shapes, args.reps, [int(v) for v in filter(None, args.tq.split(","))]))


if __name__ == "__main__":
    main()
