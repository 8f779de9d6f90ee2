"""Wrappers for shaders/relu2.wgsl: BitNet's MLP gating h = act(g) * u and its
backward, act relu^2 (hidden_act "relu2") or SiLU ("silu"). `gating_forward` /
`gating_backward` pick the entry by hidden_act. Browser-safe: standard library +
bitlora only."""
from __future__ import annotations

from ._check import need, quads
from ._uniform import Uniform

SHADER = "relu2.wgsl"
PARAMS = Uniform("Relu2Params", "count:u32")
ACTS = ("relu2", "silu")   # hidden_act -> entry points <act>_gating_forward / _backward


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """Both activations' entries (with `shapes`, its activation's): the GPU kernels (on a
    CPU the fallback where count % 4 != 0: not with `shapes` whose F is a multiple of 4),
    the CPU variants (*_cpu) unless kind is "gpu"."""
    acts = [shapes["act"]] if shapes is not None else ACTS
    entries = [f"{a}_gating_forward" for a in acts] + ([f"{a}_gating_backward" for a in acts] if training else [])
    gpu = [] if quads(shapes, "F") else [(SHADER, e) for e in entries]
    return gpu + ([(SHADER, e + "_cpu") for e in entries] if kind != "gpu" else [])


def _entry(dev, name: str, count: int) -> tuple:
    """(kernel, workgroups): the CPU variant (four elements per invocation) on a CPU
    device where count % 4 == 0, else the GPU kernel."""
    if dev.kind == "cpu" and count % 4 == 0:
        return dev.prepared(SHADER, name + "_cpu"), -(-count // 1024)
    return dev.prepared(SHADER, name), -(-count // 256)


def gating_forward(dev, act: str, g, u, h, count: int) -> None:
    """h = act(g) * u over count = N*F elements; act "relu2" or "silu"."""
    if act not in ACTS:
        raise ValueError(f"gating_forward: activation {act!r} is not one of {ACTS}")
    for b, what in ((g, "g"), (u, "u"), (h, "h")):
        need(b, count, what, "gating_forward")
    kernel, groups = _entry(dev, f"{act}_gating_forward", count)
    dev.dispatch(kernel, [g, u, h], groups=groups, params=PARAMS.pack(count))


def gating_backward(dev, act: str, dh, g, u, dg, du, count: int) -> None:
    """h = act(g) * u over count = N*F elements: dh, g, u -> dg, du (overwrite)."""
    if act not in ACTS:
        raise ValueError(f"gating_backward: activation {act!r} is not one of {ACTS}")
    for b, what in ((dh, "dh"), (g, "g"), (u, "u"), (dg, "dg"), (du, "du")):
        need(b, count, what, "gating_backward")
    kernel, groups = _entry(dev, f"{act}_gating_backward", count)
    dev.dispatch(kernel, [dh, g, u, dg, du], groups=groups, params=PARAMS.pack(count))


def relu2_gating_forward(dev, g, u, h, count: int) -> None:
    """h = relu(g)^2 * u over count = N*F elements."""
    gating_forward(dev, "relu2", g, u, h, count)


def relu2_gating_backward(dev, dh, g, u, dg, du, count: int) -> None:
    """h = relu(g)^2 * u: dh, g, u -> dg, du (overwrite)."""
    gating_backward(dev, "relu2", dh, g, u, dg, du, count)
