"""Wrappers for shaders/bitlinear.wgsl: per-token int8 activation quantisation and
the packed ternary matmul (bitlinear_backward_input is in ops/backward.py).
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

import struct

from . import splitk
from ._check import need

# Up to this many rows (decoding one token per sequence) the 8-row kernel wastes less
# than the 64 x 64 tiles; both give the same bits (integer sums are exact in f32).
ROWS_KERNEL_MAX_N = 8


async def actquant_forward(dev, x, xq, s, N: int, I: int) -> None:
    """x[N, I] -> xq[N, I] (integers -128..127 as f32), s[N] = 127 / max|x[n]|."""
    for b, n, what in ((x, N * I, "x"), (xq, N * I, "xq"), (s, N, "s")):
        need(b, n, what, "actquant_forward")
    k = await dev.kernel("bitlinear.wgsl", "actquant_forward")
    dev.dispatch(k, [x, xq, s], groups=N, params=struct.pack("<II", N, I))


async def bitlinear_forward(dev, xq, s, w_packed, scale: float, y, N: int, I: int, O: int,
                            accumulate: bool = False, split: int | None = None) -> None:
    """xq[N, I], s[N], w_packed[O, ceil(I/16)] u32 -> y[N, O] = xq t^T * scale / s (= or +=).
    `split` forces the number of reduction slices (default: ops.splitk.plan's)."""
    words = -(-I // 16)
    for b, n, what in ((xq, N * I, "xq"), (s, N, "s"), (w_packed, O * words, "w_packed"), (y, N * O, "y")):
        need(b, n, what, "bitlinear_forward")
    if N <= ROWS_KERNEL_MAX_N:
        k = await dev.kernel("bitlinear.wgsl", "bitlinear_forward_rows")
        dev.dispatch(k, [xq, s, w_packed, y], groups=(-(-O // 64), -(-N // 8), 1),
                     params=struct.pack("<IIIfIII", N, I, O, scale, int(accumulate), words, 0))
        return
    tiles = -(-O // 64) * -(-N // 64)
    slices, kw = splitk.plan(tiles, words, 4, split, cols_per_k=16)
    part = splitk.scratch(dev, slices * N * O if slices > 1 else 1)
    k = await dev.kernel("bitlinear.wgsl", "bitlinear_forward")
    dev.dispatch(k, [xq, s, w_packed, y, part], groups=(-(-O // 64), -(-N // 64), slices),
                 params=struct.pack("<IIIfIII", N, I, O, scale, int(accumulate), kw, int(slices > 1)))
    if slices > 1:
        await splitk.reduce(dev, part, s, y, N * O, slices, O, scale, accumulate)
