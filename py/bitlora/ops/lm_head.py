"""Wrapper for shaders/lm_head.wgsl: the dense output head over a weight kept in row
chunks (linear_backward_input is in ops/backward.py). Browser-safe: stdlib + bitlora."""
from __future__ import annotations

import struct

from ._check import need

ROWS_KERNEL_MAX_N = 8  # up to this many rows (decoding) the 8-row kernel wastes less than 64 x 64 tiles


async def linear_forward(dev, x, chunks, y, N: int, I: int, O: int, x_row0: int = 0, x_step: int = 1) -> None:
    """x[.., I] (rows x_row0 + n*x_step, n < N), chunks = [(v0, Oc, w[Oc, I] buffer), ...]
    covering O rows -> y[N, O] = x W^T. W is f32, or bf16 where `chunks.dtype` says so
    (model.RowTable)."""
    need(x, (x_row0 + (N - 1) * x_step + 1) * I, "x", "linear_forward")
    need(y, N * O, "y", "linear_forward")
    rows = N <= ROWS_KERNEL_MAX_N
    bf16 = getattr(chunks, "dtype", "f32") == "bf16"
    k = await dev.kernel("lm_head.wgsl", "linear_forward_rows" if rows else "linear_forward",
                         constants={"LN_BF16": 1.0} if bf16 else None)
    for v0, oc, w in chunks:
        need(w, -(-oc * I // 2) if bf16 else oc * I, "w", "linear_forward")
        dev.dispatch(k, [x, w, y], groups=(-(-oc // 64), -(-N // (8 if rows else 64)), 1),
                     params=struct.pack("<IIIIIII", N, I, oc, O, v0, x_row0, x_step))
