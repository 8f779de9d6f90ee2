"""Wrapper for shaders/ffn.wgsl: relu^2 gating (relu2_gating_backward is in
ops/backward.py). Browser-safe: standard library + bitlora only."""
from __future__ import annotations

import struct

from ._check import need


async def relu2_gating_forward(dev, g, u, h, count: int) -> None:
    """h = relu(g)^2 * u over count = N*F elements."""
    for b, what in ((g, "g"), (u, "u"), (h, "h")):
        need(b, count, what, "relu2_gating_forward")
    k = await dev.kernel("ffn.wgsl", "relu2_gating_forward")
    dev.dispatch(k, [g, u, h], groups=-(-count // 256), params=struct.pack("<I", count))
