"""The hello kernel's wrapper: y = a * x + y (shaders/hello.wgsl). No math here."""
from __future__ import annotations

import struct

from ..gpu import Buffer, Device


async def axpy(dev: Device, a: float, x: Buffer, y: Buffer, n: int) -> None:
    """Record y[n] += a * x[n]."""
    if x.size < 4 * n or y.size < 4 * n:
        raise ValueError(f"axpy: buffers hold {x.size // 4} and {y.size // 4} floats, need {n}")
    k = await dev.kernel("hello.wgsl", "axpy")
    dev.dispatch(k, [x, y], groups=-(-n // 256), params=struct.pack("<fI", a, n))
