"""Wrappers for shaders/lora.wgsl: the LoRA branch y += (alpha/R) B(A(dropout(x))) of
one adapted projection, forward and backward, with a counter-based dropout mask made
on the GPU. They check sizes, fill the uniform and record dispatches; the math is in
the shader header. Browser-safe: standard library + bitlora only.

Shapes: x[N, I] (the projection's input, before activation quantisation), a[R, I],
b[O, R], u[N, R] (saved by forward), y/dy[N, O], da[R, I], db[O, R], du[N, R],
dx[N, I]. Gradients of a, b and the dx contribution accumulate (+=).
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from ..gpu import Buffer, BufferView, Device

SHADER = "lora.wgsl"
WG = 256


@dataclass(frozen=True)
class LoraShape:
    """One adapted projection: N rows, I inputs, O outputs, rank R, scale = alpha / R,
    dropout probability p, and the dropout stream (seed per run/layer/module, step per
    micro-batch: forward and backward of one micro-batch must use the same pair)."""
    N: int
    I: int
    O: int
    R: int
    scale: float
    p: float = 0.0
    seed: int = 0
    step: int = 0

    def params(self) -> bytes:
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"lora dropout p={self.p} must be in [0, 1)")
        thr = min(int(self.p * 4294967296.0), 0xFFFFFFFF)
        keep_scale = 1.0 / (1.0 - self.p)
        return struct.pack("<IIIIfIfII", self.N, self.I, self.O, self.R, self.scale, thr, keep_scale,
                           self.seed & 0xFFFFFFFF, self.step & 0xFFFFFFFF)


def _need(b, n_floats: int, what: str) -> None:
    if b.size < 4 * n_floats:
        raise ValueError(f"lora: {what} holds {b.size // 4} floats, needs {n_floats}")


async def _run(dev: Device, entry: str, s: LoraShape, bufs: list, groups: int) -> None:
    k = await dev.kernel(SHADER, entry)
    dev.dispatch(k, bufs, groups=groups, params=s.params())


async def lora_forward(dev: Device, s: LoraShape, x, a, b, u, y) -> None:
    """Record u[N, R] = dropout(x) a^T, then y[N, O] += scale * u b^T."""
    _need(x, s.N * s.I, "x"); _need(a, s.R * s.I, "a"); _need(b, s.O * s.R, "b")
    _need(u, s.N * s.R, "u"); _need(y, s.N * s.O, "y")
    await _run(dev, "lora_down", s, [x, a, u], s.N * s.R)
    await _run(dev, "lora_up", s, [u, b, y], -(-s.N * s.O // WG))


async def lora_backward(dev: Device, s: LoraShape, dy, x, a, b, u, da, db, du, dx=None) -> None:
    """Record db += scale dy^T u; du = scale dy b; da += du^T dropout(x);
    and, unless dx is None, dx[N, I] += mask * keep_scale * (du a)."""
    _need(dy, s.N * s.O, "dy"); _need(x, s.N * s.I, "x"); _need(a, s.R * s.I, "a")
    _need(b, s.O * s.R, "b"); _need(u, s.N * s.R, "u"); _need(da, s.R * s.I, "da")
    _need(db, s.O * s.R, "db"); _need(du, s.N * s.R, "du")
    await _run(dev, "lora_grad_b", s, [dy, u, db], -(-s.R * s.O // WG))
    await _run(dev, "lora_grad_u", s, [dy, b, du], s.N * s.R)
    await _run(dev, "lora_grad_a", s, [du, x, da], -(-s.R * s.I // WG))
    if dx is not None:
        _need(dx, s.N * s.I, "dx")
        await _run(dev, "lora_grad_x", s, [du, a, dx], -(-s.N * s.I // WG))
