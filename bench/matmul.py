"""Time the ternary matmul kernels (forward and input gradient) at given shapes, with
forced split-K slice counts, against numpy for correctness. Native only (numpy).

    python -m bitlora.bench.matmul [--shapes 256x2560x2560,256x2560x6912,256x6912x2560]
        [--kernels fwd,fwd_i8,bwd] [--variants FILE.wgsl --fwd-variants E:ROWS:COLS:UNIT,...
        --bwd-variants E:ROWS:COLS:UNIT,...]
        [--peak GROUPS] [--reps 20]

A shape is NxIxO (rows x inputs x outputs). Kernels: fwd (bitlinear_forward, f32 sums
of the int8 activations), fwd_i8 (bitlinear_forward_i8: packed int8 activations and
dot4I8Packed, where the device has it), bwd (bitlinear_backward_input). Variants are
entry points of a WGSL file (the prelude appended) with bitlinear_forward_i8's bindings
(names ending in "i8" read packed activations) and tiles of ROWS x COLS, staging UNIT
words, or with bitlinear_backward_input's (tiles of ROWS x COLS input columns, UNIT
outputs per step: bench/bwd_variants.wgsl). Prints ms per call (min over repeated
batches of `reps` dispatches in one submit) and effective TMAC/s; --peak first times
in-register f32 fma and dot4I8Packed (the rates that "% of peak" refers to).
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.resources
import pathlib
import struct
import time

import numpy as np

from bitlora import gpu
from bitlora.ops import bitlinear, matvec, splitk


def pack(codes):
    O, W16 = codes.shape
    packed = np.zeros((O, W16 // 16), np.uint32)
    for k in range(16):
        packed |= codes[:, k::16].astype(np.uint32) << (2 * k)
    return packed


def pack_xq(xq):
    """xq[N, I] integers -> prelude.wgsl's xq8[N, 4*ceil(I/16)] u32 (byte j of word 4g+k:
    column 16g + 4j + k)."""
    N, I = xq.shape
    G = -(-I // 16)
    b = np.zeros((N, G * 16), np.int8)
    b[:, :I] = xq.astype(np.int8)
    return np.ascontiguousarray(b.reshape(N, G, 4, 4).transpose(0, 1, 3, 2)).view(np.uint32).reshape(N, 4 * G)


PEAK = """
@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(256)
fn peak_f32(@builtin(global_invocation_id) g: vec3<u32>) {
    var a = vec4<f32>(f32(g.x)); var b = a + 1.0; var c = a + 2.0; var d = a + 3.0;
    let m = vec4<f32>(0.999, 0.998, 0.997, 0.996);
    for (var i = 0u; i < 4096u; i++) { a = fma(a, m, m); b = fma(b, m, m); c = fma(c, m, m); d = fma(d, m, m); }
    out[g.x] = bitcast<u32>(a.x + b.y + c.z + d.w);
}
@compute @workgroup_size(256)
fn peak_i8(@builtin(global_invocation_id) g: vec3<u32>) {
    var a = vec4<i32>(i32(g.x)); var b = a + 1; var c = a + 2; var d = a + 3;
    var x = g.x * 0x01030507u;
    let y = vec4<u32>(0x5a5a5a5au, 0x3c3c3c3cu, 0x77777777u, 0x81818181u);
    for (var i = 0u; i < 4096u; i++) {
        x += 0x01010101u;   // varies per iteration: nothing can be hoisted out of the loop
        a += vec4<i32>(dot4I8Packed(x, y.x), dot4I8Packed(x, y.y), dot4I8Packed(x, y.z), dot4I8Packed(x, y.w));
        b += vec4<i32>(dot4I8Packed(y.x, x), dot4I8Packed(y.y, x), dot4I8Packed(y.z, x), dot4I8Packed(y.w, x));
        c += vec4<i32>(dot4I8Packed(x, y.x ^ 1u), dot4I8Packed(x, y.y ^ 1u), dot4I8Packed(x, y.z ^ 1u), dot4I8Packed(x, y.w ^ 1u));
        d += vec4<i32>(dot4I8Packed(x, y.x ^ 2u), dot4I8Packed(x, y.y ^ 2u), dot4I8Packed(x, y.z ^ 2u), dot4I8Packed(x, y.w ^ 2u));
    }
    out[g.x] = bitcast<u32>(a.x + b.y + c.z + d.w);
}
"""


async def peak(dev, groups: int):
    """In-register rates: f32 fma (MAC/s) and dot4I8Packed (4 MACs each), in TMAC/s."""
    out = dev.buffer(4 * 256 * groups, "peak")
    rates = {}
    for entry, macs in (("peak_f32", 16), ("peak_i8", 64)):
        k = await dev.compile(PEAK, entry, label=entry)
        best = 1e9
        for _ in range(3):
            await dev.read(out, 0, 4)
            t0 = time.perf_counter()
            for _ in range(5):
                dev.dispatch(k, [out], groups=groups)
            await dev.read(out, 0, 4)
            best = min(best, (time.perf_counter() - t0) / 5)
        rates[entry] = 256 * groups * 4096 * macs / best / 1e12
    print(f"peak: f32 fma {rates['peak_f32']:.1f} TMAC/s, dot4I8Packed {rates['peak_i8']:.1f} TMAC/s "
          f"(4 MACs each; {rates['peak_i8'] / rates['peak_f32']:.2f}x)", flush=True)
    return rates


async def main(args):
    dev = await gpu.get_device("native")
    print(dev.describe(), "int8_dot" if dev.int8_dot else "no dot4I8Packed")
    wanted = args.kernels.split(",")
    if "fwd_i8" in wanted and not dev.int8_dot:
        wanted.remove("fwd_i8")
    await dev.prepare(splitk.kernel_specs() + (bitlinear.int8_specs() if dev.int8_dot else []))
    rates = await peak(dev, args.peak) if args.peak else None
    variants = None
    if args.variants:
        prelude = importlib.resources.files("bitlora.shaders").joinpath("prelude.wgsl").read_text()
        variants = pathlib.Path(args.variants).read_text() + "\n" + prelude
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
        bx8 = dev.buffer(16 * N * words, "x8", data=pack_xq(xq))
        y, dx = dev.buffer(4 * N * O, "y"), dev.buffer(4 * N * I, "dx")
        want_y = (xq.astype(np.float64) @ t.T) * 0.5 / s[:, None]
        want_dx = dy.astype(np.float64) @ t * 0.5
        macs = N * I * O
        # (kind, label, kernel, tile rows, tile columns (outputs; input columns for bwd), split unit, packed xq)
        table = {"fwd": ("fwd", "bitlinear_forward", await dev.kernel("bitlinear.wgsl", "bitlinear_forward"), 64, 64, 4, False),
                 "bwd": ("bwd", "bitlinear_backward_input",
                         await dev.kernel("bitlinear.wgsl", "bitlinear_backward_input"), 64, 128, 16, False)}
        if dev.int8_dot:
            rows = bitlinear.i8_rows(N)   # 32-row tiles for a short prompt, as ops/bitlinear.py picks them
            table["fwd_i8"] = ("fwd", "bitlinear_forward_i8", await dev.kernel(
                "bitlinear_i8.wgsl", "bitlinear_forward_i8", bitlinear.i8_constants(rows)), rows, 64, bitlinear.I8_KC, True)
        kernels = [table[k] for k in wanted]
        for v in filter(None, args.fwd_variants.split(",")):
            entry, rows, cols, unit = v.split(":")
            kernels.append(("fwd", entry, await dev.compile(variants, entry, label=entry), int(rows), int(cols),
                            int(unit), entry.endswith("i8") or "_i8_" in entry))
        for v in filter(None, args.bwd_variants.split(",")):
            entry, rows, cols, unit = v.split(":")
            kernels.append(("bwd", entry, await dev.compile(variants, entry, label=entry), int(rows), int(cols),
                            int(unit), False))
        first = {}   # (kind, slices, per) -> the first kernel's output: a variant's bits against it
        for kind, entry, k, tile_r, tile_c, unit, packed in kernels:
            K = words if kind == "fwd" else O
            cols = O if kind == "fwd" else I
            tiles = -(-(cols if kind == "fwd" else words * 16) // tile_c) * -(-N // tile_r)
            for split in args.splits:
                slices, per = splitk.plan(tiles, K, unit, split, cols_per_k=16 if kind == "fwd" else 1)   # as the ops plan
                part = splitk.scratch(dev, slices * N * cols)
                params = struct.pack("<IIIfIII", N, I, O, 0.5, 0, per, int(slices > 1))
                if kind == "fwd":
                    binds, out = [bx8 if packed else bx, bs, bw, y, part], y
                    if entry == "bitlinear_forward_i8":   # one part: the others' sizes 0, spares bound
                        params += bytes(4 * (len(bitlinear.FORWARD_I8.fields) - 7))
                        binds += [matvec.spare(dev, 1), matvec.spare(dev, 2)]
                    groups = (-(-O // tile_c), -(-N // tile_r), slices)
                else:
                    binds, out = [bdy, bw, dx, part], dx
                    if entry == "bitlinear_backward_input" or entry.endswith("_v4"):   # dy again, read as vec4s
                        binds.append(bitlinear.dy_quads(dev, bdy, O))
                    groups = (-(-words // (tile_c // 16)), -(-N // tile_r), slices)

                async def record():
                    dev.dispatch(k, binds, groups=groups, params=params)
                    if slices > 1:
                        splitk.reduce(dev, part, bs if kind == "fwd" else None, out, N * cols, slices, cols, 0.5, False)

                await record()
                got = np.frombuffer(await dev.read(out), np.float32).reshape(N, cols)
                want = want_y if kind == "fwd" else want_dx
                err = np.abs(got - want).max() / np.abs(want).max()
                ref = first.setdefault((kind, slices, per), (entry, got))
                bits = "" if ref[0] == entry else \
                    f"  bits {'=' if np.array_equal(ref[1], got) else '!='} {ref[0]}'s"
                best = 1e9
                for _ in range(3):
                    await dev.read(out, 0, 4)
                    t0 = time.perf_counter()
                    for _ in range(args.reps):
                        await record()
                    await dev.read(out, 0, 4)
                    best = min(best, (time.perf_counter() - t0) / args.reps)
                rate = macs / best / 1e12
                pk = ""
                if rates:
                    ref = rates["peak_i8"] if packed else rates["peak_f32"]
                    pk = f"  {100 * rate / ref:5.1f}% of {'dot4I8Packed' if packed else 'f32 fma'} peak"
                print(f"{shape:>16} {kind} {entry:26} split {slices:2d}: {best * 1e3:8.3f} ms  "
                      f"{rate:7.3f} TMAC/s{pk}  err {err:.1e}{bits}", flush=True)
        for b in (bw, bx, bs, bdy, bx8, y, dx):
            dev.destroy(b)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="256x2560x2560,256x2560x6912,256x6912x2560,256x2560x640")
    ap.add_argument("--kernels", default="fwd,fwd_i8,bwd", help="of fwd, fwd_i8, bwd")
    ap.add_argument("--variants", default=None)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--fwd-variants", default="", help="ENTRY:ROWS:COLS:UNIT,... of forward kernels in --variants")
    ap.add_argument("--bwd-variants", default="", help="ENTRY:ROWS:COLS:UNIT,... of input-gradient kernels in --variants")
    ap.add_argument("--peak", type=int, default=0, metavar="GROUPS",
                    help="first time in-register f32 fma and dot4I8Packed over GROUPS workgroups (8192 on an H200)")
    ap.add_argument("--splits", type=lambda v: [None if x == "auto" else int(x) for x in v.split(",")],
                    default=[None, 1, 2, 4, 8])
    asyncio.run(main(ap.parse_args()))
