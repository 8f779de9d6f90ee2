"""Wrappers for shaders/rmsnorm.wgsl: RMSNorm forward and input gradient. They check
sizes, pack the uniform and record a dispatch; the math is in the shader header.
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from ._check import need
from ._uniform import Uniform

SHADER = "rmsnorm.wgsl"
FORWARD = Uniform("RmsParams", "n:u32 c:u32 eps:f32")
BACKWARD = Uniform("RmsBackwardParams", "n:u32 c:u32 accumulate:u32")


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None) -> list:
    return [(SHADER, "rmsnorm_forward")] + ([(SHADER, "rmsnorm_backward")] if training else [])


def rmsnorm_forward(dev, x, w, y, rstd, N: int, C: int, eps: float) -> None:
    """x[N, C], w[C] -> y[N, C] = w * x * rstd, rstd[N] (saved for the backward)."""
    for b, n, what in ((x, N * C, "x"), (w, C, "w"), (y, N * C, "y"), (rstd, N, "rstd")):
        need(b, n, what, "rmsnorm_forward")
    dev.dispatch(dev.prepared(SHADER, "rmsnorm_forward"), [x, w, y, rstd], groups=N,
                 params=FORWARD.pack(N, C, eps))


def rmsnorm_backward(dev, dy, x, w, rstd, dx, N: int, C: int, accumulate: bool = False) -> None:
    """dy[N, C], x[N, C] (the norm's input), w[C], rstd[N] -> dx[N, C] (= or +=)."""
    for b, n, what in ((dy, N * C, "dy"), (x, N * C, "x"), (w, C, "w"), (rstd, N, "rstd"), (dx, N * C, "dx")):
        need(b, n, what, "rmsnorm_backward")
    dev.dispatch(dev.prepared(SHADER, "rmsnorm_backward"), [dy, x, w, rstd, dx], groups=N,
                 params=BACKWARD.pack(N, C, int(accumulate)))
