"""Wrappers for shaders/rmsnorm.wgsl: RMSNorm forward and input gradient, and the
forward fused with BitLinear's activation quantiser (every norm of a layer feeds a
BitLinear). They check sizes, pack the uniform and record a dispatch; the math is in
the shader header. Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from . import bitlinear
from ._check import need, quads
from ._uniform import Uniform

SHADER = "rmsnorm.wgsl"
FORWARD = Uniform("RmsParams", "n:u32 c:u32 eps:f32")
QUANT = Uniform("RmsQuantParams", "n:u32 c:u32 eps:f32 packed:u32")
BACKWARD = Uniform("RmsBackwardParams", "n:u32 c:u32 accumulate:u32 slices:u32 scale:f32 added:u32")
RR = 16  # rows per workgroup of the CPU variants (rmsnorm.wgsl RR)
HELD_MAX_C = 4 * 9 * 256  # the widest row rmsnorm_quant_held keeps in registers (rmsnorm.wgsl RQ_HELD)


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """The GPU kernels (on a CPU they are the fallback where C % 4 != 0: not with `shapes`
    whose C and F are multiples of 4), the CPU variants (*_rows) unless kind is "gpu"."""
    entries = ["rmsnorm_forward"] + (["rmsnorm_backward"] if training else [])
    fused = [] if kind == "cpu" else ["rmsnorm_quant_forward", "rmsnorm_quant_held"] + (
        ["rmsnorm_backward_sum"] if training else [])
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


def _sums_into(sums, y, N: int, C: int) -> bool:
    """Whether `sums` (a splitk.SplitSums) are one split product's N x C outputs bound for
    y (written or added), undivided: what rmsnorm_backward_sum reduces."""
    if len(sums.outs) != 1:
        return False
    (O, _, target), = sums.outs
    return target is y and O == C and sums.N == N and sums.s is None


def rmsnorm_backward(dev, dy, x, w, rstd, dx, N: int, C: int, accumulate: bool = False, sums=None) -> None:
    """dy[N, C], x[N, C] (the norm's input), w[C], rstd[N] -> dx[N, C] (= or +=).
    sums: the undispatched reduce (a splitk.SplitSums) of the split input gradient that
    writes (or adds into) dy; on a GPU one dispatch reduces it as it reads
    (rmsnorm_backward_sum: the same bits, dy written as the reduce would), elsewhere it is
    flushed first."""
    for b, n, what in ((dy, N * C, "dy"), (x, N * C, "x"), (w, C, "w"), (rstd, N, "rstd"), (dx, N * C, "dx")):
        need(b, n, what, "rmsnorm_backward")
    rows = _rows(dev, C)
    if sums is not None:
        if dev.kind == "gpu" and _sums_into(sums, dy, N, C):
            (_, scale, _), = sums.outs
            dev.dispatch(dev.prepared(SHADER, "rmsnorm_backward_sum"), [dy, x, w, rstd, dx, sums.part], groups=N,
                         params=BACKWARD.pack(N, C, int(accumulate), sums.slices, scale, int(sums.accumulate)))
            return
        sums.flush(dev)
    dev.dispatch(dev.prepared(SHADER, "rmsnorm_backward_rows" if rows else "rmsnorm_backward"),
                 [dy, x, w, rstd, dx], groups=-(-N // (4 * RR)) if rows else N,
                 params=BACKWARD.pack(N, C, int(accumulate), 0, 0.0, 0))


def rmsnorm_quant_forward(dev, x, w, y, rstd, xq, s, N: int, C: int, eps: float) -> None:
    """rmsnorm_forward(x, w -> y, rstd), then bitlinear.actquant_forward(y -> xq, s): one
    dispatch on a GPU (xq packed where bitlinear.packed_xq says; then, for rows up to
    HELD_MAX_C, the kernel that keeps its row in registers) and on a CPU (dev.kind) where
    C % 4 == 0 (rmsnorm_quant_forward_rows), else the two ops' kernels. The same bits as
    the two ops."""
    if dev.kind == "cpu" and not _rows(dev, C):
        rmsnorm_forward(dev, x, w, y, rstd, N, C, eps)
        bitlinear.actquant_forward(dev, y, xq, s, N, C)
        return
    packed = bitlinear.packed_xq(dev, N)
    for b, n, what in ((x, N * C, "x"), (w, C, "w"), (y, N * C, "y"), (rstd, N, "rstd"),
                       (xq, N * bitlinear.xq_floats(C, packed), "xq"), (s, N, "s")):
        need(b, n, what, "rmsnorm_quant_forward")
    rows = _rows(dev, C)
    entry = "rmsnorm_quant_forward_rows" if rows else (
        "rmsnorm_quant_held" if packed and C <= HELD_MAX_C else "rmsnorm_quant_forward")
    dev.dispatch(dev.prepared(SHADER, entry), [x, w, y, rstd, xq, s], groups=-(-N // (4 * RR)) if rows else N,
                 params=QUANT.pack(N, C, eps, int(packed)))
