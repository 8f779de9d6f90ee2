"""Wrapper for shaders/rope.wgsl (forward; rope_backward is in ops/backward.py), and
the host-side cos/sin tables computed the way HF does (f32 inv_freq, f32 angles).
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

import array
import math
import struct

from ._check import need


def _f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def rope_tables(P: int, D: int, theta: float) -> tuple[array.array, array.array]:
    """cos[P, D/2], sin[P, D/2] of pos * inv_freq[j], inv_freq[j] = 1 / theta^(2j/D),
    rounded to f32 at each step as HF's BitNetRotaryEmbedding (float32) does."""
    half = D // 2
    inv = [_f32(1.0 / _f32(_f32(theta) ** _f32(2 * j / D))) for j in range(half)]
    cos, sin = array.array("f"), array.array("f")
    for pos in range(P):
        for j in range(half):
            a = _f32(pos * inv[j])
            cos.append(math.cos(a))
            sin.append(math.sin(a))
    return cos, sin


async def rope_forward(dev, x, cos, sin, N: int, T: int, H: int, D: int, pos0: int = 0) -> None:
    """In place on x[N, H*D]; row n is at position pos0 + n % T; cos, sin[P, D/2], P > pos0 + T - 1."""
    if D % 2:
        raise ValueError(f"rope_forward: head dim D={D} must be even")
    need(x, N * H * D, "x", "rope_forward")
    need(cos, (pos0 + T) * D // 2, "cos", "rope_forward")
    need(sin, (pos0 + T) * D // 2, "sin", "rope_forward")
    k = await dev.kernel("rope.wgsl", "rope_forward")
    dev.dispatch(k, [x, cos, sin], groups=-(-N * H * D // 2 // 256), params=struct.pack("<IIIII", N, T, H, D, pos0))
