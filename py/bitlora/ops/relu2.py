"""Wrappers for shaders/relu2.wgsl: BitNet's MLP gating h = relu(g)^2 * u and its
backward. Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from ._check import need
from ._uniform import Uniform

SHADER = "relu2.wgsl"
PARAMS = Uniform("Relu2Params", "count:u32")


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None) -> list:
    return [(SHADER, "relu2_gating_forward")] + ([(SHADER, "relu2_gating_backward")] if training else [])


def relu2_gating_forward(dev, g, u, h, count: int) -> None:
    """h = relu(g)^2 * u over count = N*F elements."""
    for b, what in ((g, "g"), (u, "u"), (h, "h")):
        need(b, count, what, "relu2_gating_forward")
    dev.dispatch(dev.prepared(SHADER, "relu2_gating_forward"), [g, u, h], groups=-(-count // 256),
                 params=PARAMS.pack(count))


def relu2_gating_backward(dev, dh, g, u, dg, du, count: int) -> None:
    """h = relu(g)^2 * u over count = N*F elements: dh, g, u -> dg, du (overwrite)."""
    for b, what in ((dh, "dh"), (g, "g"), (u, "u"), (dg, "dg"), (du, "du")):
        need(b, count, what, "relu2_gating_backward")
    dev.dispatch(dev.prepared(SHADER, "relu2_gating_backward"), [dh, g, u, dg, du], groups=-(-count // 256),
                 params=PARAMS.pack(count))
