"""Wrappers for shaders/adamw.wgsl: torch.optim.AdamW over the flat parameter arena.
They check sizes, pack the hyperparameter uniform and record a dispatch; the math is in
the WGSL file. Per-step values (lr, step) travel in the uniform and the state buffer,
so the two pipelines are compiled once.

Shapes: p[n], g[n], m[n], v[n] f32 with n a multiple of 4; state: 16 words
(shaders/prelude.wgsl).
"""
from __future__ import annotations

import math

from ._check import need
from ._uniform import Uniform
from .grad_norm import STATE_BYTES

SHADER = "adamw.wgsl"
PARAMS = Uniform("AdamWParams", "lr:f32 decay:f32 omb1:f32 b2:f32 omb2:f32 eps:f32 ln_b1:f32 ln_b2:f32 "
                                "n4:u32 plain:u32")


PER_THREAD = 1  # vec4s per invocation of `adamw` (the PER override); see docs/PERFORMANCE.md


def kernel_specs(per_thread: int = PER_THREAD, zero_grads: bool = True) -> list:
    return [(SHADER, "adamw_begin"), (SHADER, "adamw", _constants(per_thread, zero_grads))]


def _constants(per_thread: int, zero_grads: bool) -> dict:
    return {"PER": per_thread} if zero_grads else {"PER": per_thread, "ZERO_G": False}


def hyper(n: int, lr: float, betas: tuple[float, float], eps: float, weight_decay: float, plain: bool) -> bytes:
    """The AdamWParams uniform. 1 - lr*wd, 1 - b and ln b are formed here in double precision."""
    b1, b2 = betas
    ln = lambda b: math.log(b) if b > 0 else -100.0  # noqa: E731 - exp(-100 t) is 0 in f32
    return PARAMS.pack(lr, 1.0 - lr * weight_decay, 1.0 - b1, b2, 1.0 - b2, eps, ln(b1), ln(b2), n // 4, int(plain))


def adamw_begin(dev, state, lr: float, betas: tuple[float, float], plain: bool) -> None:
    """Record the scalar part of a step: t += 1 unless skipped, step_size, bc2_sqrt.
    `plain` (the separate-ops path) first sets gmul = 1 and clears the skip flag."""
    need(state, STATE_BYTES // 4, "state", "adamw_begin")
    dev.dispatch(dev.prepared(SHADER, "adamw_begin"), [state.view(0, STATE_BYTES)], groups=1,
                 params=hyper(0, lr, betas, 0.0, 0.0, plain))


def adamw(dev, p, g, m, v, state, n: int, lr: float, betas: tuple[float, float], eps: float,
          weight_decay: float, per_thread: int = PER_THREAD, zero_grads: bool = True) -> None:
    """Record the AdamW update of p[n], m[n], v[n] from g[n] * state.gmul; zero g[n]
    unless zero_grads is False. Each invocation updates `per_thread` vec4s."""
    if n % 4:
        raise ValueError(f"adamw: n = {n} is not a multiple of 4")
    for buf, what in ((p, "p"), (g, "g"), (m, "m"), (v, "v")):
        need(buf, n, what, "adamw")
    views = [b.view(0, 4 * n) for b in (p, g, m, v)]
    kernel = dev.prepared(SHADER, "adamw", _constants(per_thread, zero_grads))
    dev.dispatch(kernel, views + [state.view(0, STATE_BYTES)], groups=-(-n // (1024 * per_thread)),
                 params=hyper(n, lr, betas, eps, weight_decay, False))
