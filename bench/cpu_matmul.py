"""Time CPU variants of the ternary matmuls (bitlinear.wgsl *_cpu, or entry points of an
extra WGSL file compiled with bitlinear.wgsl and the prelude) at the demo's shapes,
natively (lavapipe) or in Chromium's worker (SwiftShader), side by side in one run.
Standard library + bitlora only: the case runs inside Pyodide too.

    python -m bench.cpu_matmul [--backend browser] [--extra FILE.wgsl]
        [--variants ENTRY:KIND:ROWS:COLS[:WG[:STEP[:CODES]]],...] [--shapes 512x128x384,...]

KIND says how ENTRY is bound: mmf / mmb bitlinear_matmul_cpu's bindings as the forward
(the weights transposed) / the input gradient (mmf4 / mmb4: a bound again at binding 5, and
CPU_QUADS for bitlinear_matmul_cpu); fwd bitlinear_forward_cpu's, fwdt the same
with the weights transposed (wt[I, ceil(O/16)]), bwd BitlinearBackwardParams with dy,
w_packed, dx. ROWS x COLS is the tile of an invocation, WG and STEP the override
constants CPU_WG, CPU_STEP and CPU_CODES (0 / 1; left out: the shader's). Prints ms per call (best of batches of `reps`
dispatches in one submit), GMAC/s, and each result's largest difference from the first
variant's.
"""
from __future__ import annotations

import argparse
import array
import asyncio
import pathlib
import random
import struct
import time

FWD = "n:u32 i:u32 o:u32 scale:f32 accumulate:u32 kw:u32 split:u32"


def _pack(*vals) -> bytes:
    return b"".join(struct.pack("<f" if isinstance(v, float) else "<I", v) for v in vals)


async def case_cpu_matmul(dev, source: str, variants: list, shapes: list, reps: int = 4, batches: int = 5) -> list:
    """[[shape, entry, ms per call, GMAC/s, max |difference| from the first variant]]."""
    rnd = random.Random(0)
    out = []
    kernels = {}
    for v in variants:
        key = _key(v)
        if key not in kernels:
            consts = {"CPU_WG": key[1]} if key[1] else {}
            consts.update({"CPU_STEP": key[2]} if key[2] else {})
            consts.update({"CPU_CODES": key[3] - 1} if key[3] else {})
            consts.update({"CPU_QUADS": 1} if key[4] and v[0] == "bitlinear_matmul_cpu" else {})
            kernels[key] = await dev.compile(source, v[0], consts, v[0])
    for N, I, O in shapes:
        words = -(-I // 16)
        w = array.array("I", (rnd.getrandbits(32) for _ in range(O * words)))
        for j in range(len(w)):   # code 3 is no weight: make it 1 (zero)
            x = w[j]
            w[j] = x & ~(((x >> 1) & x & 0x55555555) << 1)
        xq = array.array("f", (rnd.randrange(-128, 128) for _ in range(N * I)))
        s = array.array("f", (rnd.uniform(1, 100) for _ in range(N)))
        dy = array.array("f", (rnd.gauss(0, 1) for _ in range(N * O)))
        bufs = {"w": dev.buffer(4 * len(w), "w", w), "xq": dev.buffer(4 * N * I, "xq", xq),
                "s": dev.buffer(4 * N, "s", s), "dy": dev.buffer(4 * N * O, "dy", dy)}
        Wt = -(-O // 16)   # wT[I, ceil(O/16)]: the transposed packing (padding outputs are zero weights)
        wt = array.array("I", bytes(4 * I * Wt))
        for o in range(Wt * 16):
            for i in range(I):
                code = (w[o * words + i // 16] >> (2 * (i % 16))) & 3 if o < O else 1
                wt[i * Wt + o // 16] |= code << (2 * (o % 16))
        bufs["wt"] = dev.buffer(4 * len(wt), "wt", wt)
        first, runs = {}, []
        for v in variants:
            entry, what, rows, cols = v[0], v[1], int(v[2]), int(v[3])
            wg = _key(v)[1] or 8
            k = kernels[_key(v)]
            if what in ("mmf", "mmf4"):     # bitlinear_matmul_cpu as the forward (4: a again at binding 5)
                y = dev.buffer(4 * N * O, "y")
                binds, cols_total = [bufs["xq"], bufs["s"], bufs["wt"], y] + [bufs["xq"]] * (what == "mmf4"), O
                params = _pack(N, I, O, 0.5, 0, 1)
            elif what in ("mmb", "mmb4"):   # ... as the input gradient
                y = dev.buffer(4 * N * I, "dx")
                binds, cols_total = [bufs["dy"], bufs["dy"], bufs["w"], y] + [bufs["dy"]] * (what == "mmb4"), I
                params = _pack(N, O, I, 0.5, 0, 0)
            elif what in ("fwd", "fwdt"):
                y = dev.buffer(4 * N * O, "y")
                binds, cols_total = [bufs["xq"], bufs["s"], bufs["w" if what == "fwd" else "wt"], y], O
                params = _pack(N, I, O, 0.5, 0, words, 0)
            else:
                y = dev.buffer(4 * N * I, "dx")
                binds, cols_total = [bufs["dy"], bufs["w"], y], I
                params = _pack(N, I, O, 0.5, 0, O, 0)
            groups = -(-(-(-N // rows) * -(-cols_total // cols)) // wg)
            dev.dispatch(k, binds, groups, params)
            dev.submit()
            res = array.array("f", await dev.read(y))
            ref = first.setdefault("fwd" if what in ("fwd", "fwdt", "mmf", "mmf4") else "bwd", res)
            label = f"{entry} {what}" + "".join(f" {n}={x}" for n, x in zip(("CPU_WG", "CPU_STEP"), _key(v)[1:3]) if x) + \
                (f" CPU_CODES={_key(v)[3] - 1}" if _key(v)[3] else "")
            runs.append([label, k, binds, groups, params, float("inf"), max(abs(a - b) for a, b in zip(res, ref)), y])
        for _ in range(batches):   # rounds over the variants: a busy machine's slow spells hit all of them
            for run in runs:
                t = time.perf_counter()
                for _ in range(reps):
                    dev.dispatch(*run[1:5])
                dev.submit()
                await dev.sync()
                run[5] = min(run[5], (time.perf_counter() - t) / reps)
        for entry, _, _, _, _, best, diff, y in runs:
            out.append([f"{N}x{I}x{O}", entry, round(best * 1e3, 3), round(N * I * O / best / 1e9, 2), diff])
            dev.destroy(y)
        dev.destroy(*bufs.values())
    return out


def _key(v) -> tuple:
    """(entry, CPU_WG or 0, CPU_STEP or 0, CPU_CODES + 1 or 0, a bound again (CPU_QUADS for
    bitlinear_matmul_cpu)) of a variant [ENTRY, KIND, ROWS, COLS, WG?, STEP?, CODES?]."""
    return (v[0], v[4] if len(v) > 4 else 0, v[5] if len(v) > 5 else 0, v[6] + 1 if len(v) > 6 else 0,
            v[1] in ("mmf4", "mmb4"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("native", "browser"), default="native")
    ap.add_argument("--extra", default=None, help="a WGSL file of variants, compiled with bitlinear.wgsl")
    ap.add_argument("--variants", default="bitlinear_forward_cpu:fwd:4:32,bitlinear_matmul_cpu:mmf:8:32:8:1,"
                    "bitlinear_matmul_cpu:mmf:8:32:8:4,bitlinear_matmul_cpu:mmb:8:32:8:1,bitlinear_matmul_cpu:mmb:8:32:8:4")
    ap.add_argument("--shapes", default="512x128x384,512x384x128")
    ap.add_argument("--reps", type=int, default=4)
    args = ap.parse_args(argv)
    from bitlora.gpu.device import read_shader
    source = read_shader("bitlinear.wgsl") + ("\n" + pathlib.Path(args.extra).read_text() if args.extra else "")
    variants = [v.split(":") for v in args.variants.split(",")]
    variants = [v[:2] + [int(x) for x in v[2:]] for v in variants]
    shapes = [[int(x) for x in s.split("x")] for s in args.shapes.split(",")]
    kw = {"source": source, "variants": variants, "shapes": shapes, "reps": args.reps}
    if args.backend == "browser":
        from bitlora.app.browser import BrowserSession
        with BrowserSession() as session:
            rows = session.run_case(pathlib.Path(__file__), "case_cpu_matmul", kw, timeout_s=1800)
    else:
        from bitlora import gpu
        rows = asyncio.run(_native(kw))
    for shape, entry, ms, gmac, diff in rows:
        print(f"{shape:>14} {entry:>52} {ms:9.3f} ms {gmac:6.2f} GMAC/s  diff {diff:.3g}")


async def _native(kw):
    from bitlora import gpu
    dev = await gpu.get_device("native")
    return await case_cpu_matmul(dev, **kw)


if __name__ == "__main__":
    main()
