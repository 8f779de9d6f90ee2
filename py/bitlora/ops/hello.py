"""The hello kernel's wrapper: y = a * x + y (shaders/hello.wgsl). No math here."""
from __future__ import annotations

from ._check import need
from ._uniform import Uniform

SHADER = "hello.wgsl"
PARAMS = Uniform("AxpyParams", "a:f32 n:u32")


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None) -> list:
    return [(SHADER, "axpy")]


def axpy(dev, a: float, x, y, n: int) -> None:
    """Record y[n] += a * x[n]."""
    need(x, n, "x", "axpy")
    need(y, n, "y", "axpy")
    dev.dispatch(dev.prepared(SHADER, "axpy"), [x, y], groups=-(-n // 256), params=PARAMS.pack(a, n))
