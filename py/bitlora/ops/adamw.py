"""Wrappers for shaders/adamw.wgsl: torch.optim.AdamW over the flat parameter arena.
They check sizes, pack the hyperparameter uniform and record a dispatch; the math is in
the WGSL file. Per-step values (lr, step) travel in the uniform and the state buffer,
so the two pipelines are compiled once.

Shapes: p[n], g[n], m[n], v[n] f32 with n a multiple of 4; state: 16 words
(see shaders/grad_norm.wgsl).
"""
from __future__ import annotations

import math
import struct

from ..gpu import Buffer, Device
from .grad_norm import STATE_BYTES

SHADER = "adamw.wgsl"


def hyper(n: int, lr: float, betas: tuple[float, float], eps: float, weight_decay: float, plain: bool) -> bytes:
    """The Hyper uniform. 1 - lr*wd, 1 - b and ln b are formed here in double precision."""
    b1, b2 = betas
    ln = lambda b: math.log(b) if b > 0 else -100.0  # noqa: E731 - exp(-100 t) is 0 in f32
    return struct.pack("<8f2I", lr, 1.0 - lr * weight_decay, 1.0 - b1, b2, 1.0 - b2, eps, ln(b1), ln(b2),
                       n // 4, int(plain))


async def adamw_begin(dev: Device, state: Buffer, lr: float, betas: tuple[float, float], plain: bool) -> None:
    """Record the scalar part of a step: t += 1 unless skipped, step_size, bc2_sqrt.
    `plain` (the separate-ops path) first sets gmul = 1 and clears the skip flag."""
    if state.size < STATE_BYTES:
        raise ValueError(f"adamw_begin: state holds {state.size} bytes, needs {STATE_BYTES}")
    k = await dev.kernel(SHADER, "adamw_begin")
    dev.dispatch(k, [state.view(0, STATE_BYTES)], groups=1, params=hyper(0, lr, betas, 0.0, 0.0, plain))


async def adamw(dev: Device, p: Buffer, g: Buffer, m: Buffer, v: Buffer, state: Buffer, n: int, lr: float,
                betas: tuple[float, float], eps: float, weight_decay: float) -> None:
    """Record the AdamW update of p[n], m[n], v[n] from g[n] * state.gmul; zero g[n]."""
    if n % 4:
        raise ValueError(f"adamw: n = {n} is not a multiple of 4")
    for buf, what in ((p, "p"), (g, "g"), (m, "m"), (v, "v")):
        if buf.size < 4 * n:
            raise ValueError(f"adamw: {what} holds {buf.size // 4} floats, needs {n}")
    k = await dev.kernel(SHADER, "adamw")
    views = [b.view(0, 4 * n) for b in (p, g, m, v)]
    dev.dispatch(k, views + [state.view(0, STATE_BYTES)], groups=-(-n // 1024),
                 params=hyper(n, lr, betas, eps, weight_decay, False))
