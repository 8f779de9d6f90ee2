"""Wrappers for shaders/rmsnorm.wgsl: RMSNorm forward and input gradient, and the
forward fused with BitLinear's activation quantiser (every norm of a layer feeds a
BitLinear). They check sizes, pack the uniform and record a dispatch; the math is in
the shader header. Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from . import bitlinear
from .matvec import GATES, spare
from .relu2 import gating_forward
from ._check import need, quads
from ._uniform import Uniform

SHADER = "rmsnorm.wgsl"
FORWARD = Uniform("RmsParams", "n:u32 c:u32 eps:f32")
QUANT = Uniform("RmsQuantParams", "n:u32 c:u32 eps:f32 packed:u32 pre:u32 slices:u32 stride:u32 off_u:u32 "
                                  "scale0:f32 scale1:f32 act:u32")
BACKWARD = Uniform("RmsBackwardParams", "n:u32 c:u32 accumulate:u32")
RR = 16  # rows per workgroup of the CPU variants (rmsnorm.wgsl RR)


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """The GPU kernels (on a CPU they are the fallback where C % 4 != 0: not with `shapes`
    whose C and F are multiples of 4), the CPU variants (*_rows) unless kind is "gpu"."""
    entries = ["rmsnorm_forward"] + (["rmsnorm_backward"] if training else [])
    fused = [] if kind == "cpu" else ["rmsnorm_quant_forward"]
    gpu = [] if quads(shapes, "C", "F") else entries
    rows = entries + ["rmsnorm_quant_forward"] if kind != "gpu" else []
    return [(SHADER, e) for e in gpu + fused + [e + "_rows" for e in rows]]


def _rows(dev, C: int) -> bool:
    """The CPU variant (one row per invocation, vec4 loads) applies."""
    return dev.kind == "cpu" and C % 4 == 0


def rmsnorm_forward(dev, x, w, y, rstd, N: int, C: int, eps: float) -> None:
    """x[N, C], w[C] -> y[N, C] = w * x * rstd, rstd[N] (saved for the backward)."""
    for b, n, what in ((x, N * C, "x"), (w, C, "w"), (y, N * C, "y"), (rstd, N, "rstd")):
        need(b, n, what, "rmsnorm_forward")
    rows = _rows(dev, C)
    dev.dispatch(dev.prepared(SHADER, "rmsnorm_forward_rows" if rows else "rmsnorm_forward"), [x, w, y, rstd],
                 groups=-(-N // (4 * RR)) if rows else N, params=FORWARD.pack(N, C, eps))


def rmsnorm_backward(dev, dy, x, w, rstd, dx, N: int, C: int, accumulate: bool = False) -> None:
    """dy[N, C], x[N, C] (the norm's input), w[C], rstd[N] -> dx[N, C] (= or +=)."""
    for b, n, what in ((dy, N * C, "dy"), (x, N * C, "x"), (w, C, "w"), (rstd, N, "rstd"), (dx, N * C, "dx")):
        need(b, n, what, "rmsnorm_backward")
    rows = _rows(dev, C)
    dev.dispatch(dev.prepared(SHADER, "rmsnorm_backward_rows" if rows else "rmsnorm_backward"),
                 [dy, x, w, rstd, dx], groups=-(-N // (4 * RR)) if rows else N,
                 params=BACKWARD.pack(N, C, int(accumulate)))


def rmsnorm_quant_forward(dev, x, w, y, rstd, xq, s, N: int, C: int, eps: float, *, sums=None,
                          gate=None) -> None:
    """rmsnorm_forward(x, w -> y, rstd), then bitlinear.actquant_forward(y -> xq, s): one
    dispatch on a GPU (xq packed where bitlinear.packed_xq says) and on a CPU (dev.kind)
    where C % 4 == 0 (rmsnorm_quant_forward_rows), else the two ops' kernels. The same
    bits as the two ops.
    What produces x can come into the same GPU dispatch (the shader's pre), with the
    same bits as its own kernel before this one:
      sums: a splitk.SplitSums (bitlinear_forward_parts with defer) whose reduce adds
        into x (one projection, accumulated: the residual) ...
      gate = (act, g, u): x = act(g) * u written first (relu2.gating_forward); with sums
        too, g and u are the sums' two projections, reduced here and not written (only
        for a caller that reads nothing but x of them).
    Other sums are flushed (their own reduce) first; s must not be sums.s (it is read here)."""
    if gate is not None and gate[0] not in GATES:
        raise ValueError(f"rmsnorm_quant_forward: activation {gate[0]!r} is not one of {tuple(GATES)}")
    if sums is not None and sums.s is s:
        raise ValueError("rmsnorm_quant_forward: s is the split sums' scales (read here): give another buffer")
    pre, a, b, slices, stride, off_u, sc0, sc1 = 0, spare(dev, 0), spare(dev, 1), 0, 0, 0, 0.0, 0.0
    live = [] if sums is None else [o for o in sums.outs if o[0]]
    if dev.kind == "cpu" or (sums is not None and not _fusable(live, sums, x, C, gate)):
        if sums is not None:
            sums.flush(dev)
            sums = None
        if dev.kind == "cpu" and gate is not None:
            gating_forward(dev, gate[0], gate[1], gate[2], x, N * C)
            gate = None
    if sums is not None:
        pre, a, b, slices, sc0 = (2 if gate else 1), sums.part, sums.s, sums.slices, live[0][1]
        stride, off_u, sc1 = (2 * C, C, live[1][1]) if gate else (C, 0, 0.0)
    elif gate is not None:
        pre, a, b = 3, gate[1], gate[2]
        need(a, N * C, "g", "rmsnorm_quant_forward")
        need(b, N * C, "u", "rmsnorm_quant_forward")
    act = 0 if gate is None else GATES[gate[0]]
    if dev.kind == "cpu" and not _rows(dev, C):
        rmsnorm_forward(dev, x, w, y, rstd, N, C, eps)
        bitlinear.actquant_forward(dev, y, xq, s, N, C)
        return
    packed = bitlinear.packed_xq(dev, N)
    for buf, n, what in ((x, N * C, "x"), (w, C, "w"), (y, N * C, "y"), (rstd, N, "rstd"),
                         (xq, N * bitlinear.xq_floats(C, packed), "xq"), (s, N, "s")):
        need(buf, n, what, "rmsnorm_quant_forward")
    rows = _rows(dev, C)
    bufs = [x, w, y, rstd, xq, s] + ([] if rows else [a, b])
    dev.dispatch(dev.prepared(SHADER, "rmsnorm_quant_forward_rows" if rows else "rmsnorm_quant_forward"),
                 bufs, groups=-(-N // (4 * RR)) if rows else N,
                 params=QUANT.pack(N, C, eps, int(packed), pre, slices, stride, off_u, sc0, sc1, act))


def _fusable(live, sums, x, C: int, gate) -> bool:
    """Whether rmsnorm_quant_forward's pre can take these split sums: the residual (one
    projection of width C added into x) or, with gate, the gate and up projections
    (two of width C, written, not added)."""
    if gate is None:
        return len(sums.outs) == 1 and sums.accumulate and live[0][0] == C and live[0][2] is x
    return (len(live) == 2 and not sums.accumulate and [o[0] for o in live] == [C, C]
            and live[0][2] is gate[1] and live[1][2] is gate[2])
