"""Time the GPU LoRA kernels of one adapted projection (shaders/lora.wgsl): each plain
kernel beside its tile (*_tile: the same bits), down also as a split matmul
(lora_down_mm) with its reduce, and the split dA, dB sums with their reduce, at given shapes.
Native only.

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

    async def timed(calls) -> float:
        best = 1e9
        for _ in range(3):
            for _ in range(reps):
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
        dy, du, dx = f(N * O, "dy"), f(N * R, "du"), f(N * I, "dx")
        stream = dev.buffer(16, "stream", data=struct.pack("<4I", 3, 0, 0, 0))
        wide = (-(-N // lora.TRD), -(-R // lora.TK), 1)
        cols4 = lambda c, tq: -(-(-(-N // (lora.TR * tq))) * (c // 4) // lora.WT)  # noqa: E731
        row = {"shape": f"{N}x{I}x{O}x{R}"}
        for name, bufs, plain, tile in (
            ("lora_down", [x, a, u, stream], N * R, wide),
            ("lora_up", [u, b, y], -(-N * O // 256), cols4(O, lora.TQ)),
            ("lora_grad_u", [dy, b, du], N * R, wide),
            ("lora_grad_x", [du, a, dx, stream], -(-N * I // 256), cols4(I, lora.TQ)),
        ):
            row[name] = (await timed([(k(name), bufs, plain, P)]), await timed([(k(name + "_tile"), bufs, tile, P)]))
            if name == "lora_down":   # the split matmul and its reduce (ops.lora._down_mm), at every N
                slices, per = lora.mm_plan(N, I, R)
                part = f(slices * N * R, "part") if slices > 1 else u
                mm = (k("lora_down_mm"), [x, a, part, stream], (-(-N // lora.MMR), -(-R // 16), slices), s.params(per))
                reduce = (dev.prepared(splitk.SHADER, "splitk_reduce"), [part, part, u], -(-N * R // 256),
                          splitk.PARAMS.pack(N * R, slices, 1, 1.0, 0, 0))
                row["lora_down mm"] = (slices, await timed([mm] + ([reduce] if slices > 1 else [])))
            if name in ("lora_up", "lora_grad_x"):   # the tile at other row-block turns (lora.wgsl TQ)
                for tq in tqs:
                    kt = await dev.kernel(lora.SHADER, name + "_tile", {"TQ": tq})
                    row[f"{name} TQ={tq}"] = await timed([(kt, bufs, cols4(O if name == "lora_up" else I, tq), P)])
        for name, cols, ins in (("dB", O, [dy, u]), ("dA", I, [du, x])):
            slices, per = lora.split_plan(N, cols, R)
            count = cols * R
            part, g = f(slices * count, "part"), f(count, "g")
            entry = "lora_grad_b_split" if name == "dB" else "lora_grad_a_split"
            bufs = [ins[0], ins[1], part] + ([stream] if name == "dA" else [])
            split = (k(entry), bufs, (-(-cols // 256), -(-R // 4), slices), s.params(per, True))
            reduce = (dev.prepared(splitk.SHADER, "splitk_reduce"), [part, part, g], -(-count // 256),
                      splitk.PARAMS.pack(count, slices, 1, 1.0, 1, 0))
            row[name] = (slices, await timed([split]), await timed([reduce]), await timed([split, reduce]))
        rows.append(row)
        print(f"{row['shape']:>20}: " + "  ".join(f"{n[5:]} {row[n][0]:.4f} -> {row[n][1]:.4f}" for n in
                                                 ("lora_down", "lora_up", "lora_grad_u", "lora_grad_x"))
              + "".join(f"  {n[5:]} ({row[n][0]} slices, reduced) {row[n][1]:.4f}" for n in row if n.endswith(" mm"))
              + "".join(f"  {n} ({row[n][0]} slices) {row[n][1]:.4f} + reduce {row[n][2]:.4f} = {row[n][3]:.4f}"
                        for n in ("dB", "dA"))
              + "".join(f"  {n[5:]} {v:.4f}" for n, v in row.items() if "TQ=" in n) + " ms", flush=True)
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=SHAPES, help="NxIxOxR,... (default: 2B-4T's projections at B's and A's N, R)")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--tq", default="", help="also time lora_up_tile / lora_grad_x_tile at these TQ values (1,2,...)")
    args = ap.parse_args(argv)
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]
    asyncio.run(run(shapes, args.reps, [int(v) for v in filter(None, args.tq.split(","))]))


if __name__ == "__main__":
    main()
