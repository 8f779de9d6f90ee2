"""Wrappers for shaders/cross_entropy.wgsl: masked next-token cross-entropy, forward and
backward in one pass over logits[N, V] (overwritten by dlogits), and the loss sum.
They check sizes, fill the uniform and record a dispatch; the math is in the shader
header. Browser-safe: standard library + bitlora only.

Shapes: logits[N, V] f32 (in: logits, out: dlogits), targets[N] i32 (< 0 = masked,
already shifted to the next token), losses[N] f32, loss_sum[1] f32.
"""
from __future__ import annotations

import struct

from ..gpu import Buffer, BufferView, Device

SHADER = "cross_entropy.wgsl"


def _size(b) -> int:
    return b.size


def _need(b, nbytes: int, what: str) -> None:
    if _size(b) < nbytes:
        raise ValueError(f"cross_entropy: {what} holds {_size(b)} bytes, needs {nbytes}")


async def cross_entropy_forward_backward(dev: Device, logits: Buffer | BufferView, targets: Buffer | BufferView,
                                         losses: Buffer | BufferView, N: int, V: int, grad_scale: float) -> None:
    """Record losses[n] = lse - logits[n, t] (0 if masked) and, in place,
    logits[n, :] <- grad_scale * (softmax - onehot(t)) (0 for masked rows)."""
    _need(logits, 4 * N * V, "logits")
    _need(targets, 4 * N, "targets")
    _need(losses, 4 * N, "losses")
    k = await dev.kernel(SHADER, "cross_entropy_forward_backward")
    dev.dispatch(k, [logits, targets, losses], groups=N, params=struct.pack("<IIf", N, V, grad_scale))


async def cross_entropy_sum(dev: Device, losses: Buffer | BufferView, loss_sum: Buffer | BufferView, N: int) -> None:
    """Record loss_sum[0] += sum(losses[N]) (one workgroup)."""
    _need(losses, 4 * N, "losses")
    _need(loss_sum, 4, "loss_sum")
    k = await dev.kernel(SHADER, "cross_entropy_sum")
    dev.dispatch(k, [losses, loss_sum], groups=1, params=struct.pack("<I", N))
