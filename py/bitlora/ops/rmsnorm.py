"""Wrapper for shaders/rmsnorm.wgsl (forward; rmsnorm_backward is in ops/backward.py).
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

import struct

from ._check import need


async def rmsnorm_forward(dev, x, w, y, rstd, N: int, C: int, eps: float) -> None:
    """x[N, C], w[C] -> y[N, C] = w * x * rstd, rstd[N] (saved for the backward)."""
    for b, n, what in ((x, N * C, "x"), (w, C, "w"), (y, N * C, "y"), (rstd, N, "rstd")):
        need(b, n, what, "rmsnorm_forward")
    k = await dev.kernel("rmsnorm.wgsl", "rmsnorm_forward")
    dev.dispatch(k, [x, w, y, rstd], groups=N, params=struct.pack("<IIf", N, C, eps))
