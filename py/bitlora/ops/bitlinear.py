"""Wrappers for shaders/bitlinear.wgsl: per-token int8 activation quantisation, the
packed ternary matmul, and its input gradient (straight-through estimator). They check
sizes, pack the uniform and record dispatches; the math is in the shader header.
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from . import splitk
from ._check import need
from ._uniform import Uniform

SHADER = "bitlinear.wgsl"
ACTQUANT = Uniform("ActQuantParams", "n:u32 i:u32")
FORWARD = Uniform("BitlinearParams", "n:u32 i:u32 o:u32 scale:f32 accumulate:u32 kw:u32 split:u32")
BACKWARD = Uniform("BitlinearBackwardParams", "n:u32 i:u32 o:u32 scale:f32 accumulate:u32 ko:u32 split:u32")

# Up to this many rows (decoding one token per sequence) the 8-row kernel wastes less
# than the 64 x 64 tiles; both give the same bits (integer sums are exact in f32).
ROWS_KERNEL_MAX_N = 8


def kernel_specs(table_dtype: str = "f32", training: bool = False) -> list:
    fwd = [(SHADER, e) for e in ("actquant_forward", "bitlinear_forward", "bitlinear_forward_rows")]
    return fwd + ([(SHADER, "bitlinear_backward_input")] if training else []) + splitk.kernel_specs()


def actquant_forward(dev, x, xq, s, N: int, I: int) -> None:
    """x[N, I] -> xq[N, I] (integers -128..127 as f32), s[N] = 127 / max|x[n]|."""
    for b, n, what in ((x, N * I, "x"), (xq, N * I, "xq"), (s, N, "s")):
        need(b, n, what, "actquant_forward")
    dev.dispatch(dev.prepared(SHADER, "actquant_forward"), [x, xq, s], groups=N, params=ACTQUANT.pack(N, I))


def bitlinear_forward(dev, xq, s, w_packed, scale: float, y, N: int, I: int, O: int,
                      accumulate: bool = False, split: int | None = None) -> None:
    """xq[N, I], s[N], w_packed[O, ceil(I/16)] u32 -> y[N, O] = xq t^T * scale / s (= or +=).
    `split` forces the number of reduction slices (default: ops.splitk.plan's)."""
    words = -(-I // 16)
    for b, n, what in ((xq, N * I, "xq"), (s, N, "s"), (w_packed, O * words, "w_packed"), (y, N * O, "y")):
        need(b, n, what, "bitlinear_forward")
    if N <= ROWS_KERNEL_MAX_N:
        dev.dispatch(dev.prepared(SHADER, "bitlinear_forward_rows"), [xq, s, w_packed, y],
                     groups=(-(-O // 64), -(-N // 8), 1),
                     params=FORWARD.pack(N, I, O, scale, int(accumulate), words, 0))
        return
    tiles = -(-O // 64) * -(-N // 64)
    slices, kw = splitk.plan(tiles, words, 4, split, cols_per_k=16)
    part = splitk.scratch(dev, slices * N * O if slices > 1 else 1)
    dev.dispatch(dev.prepared(SHADER, "bitlinear_forward"), [xq, s, w_packed, y, part],
                 groups=(-(-O // 64), -(-N // 64), slices),
                 params=FORWARD.pack(N, I, O, scale, int(accumulate), kw, int(slices > 1)))
    if slices > 1:
        splitk.reduce(dev, part, s, y, N * O, slices, O, scale, accumulate)


def bitlinear_backward_input(dev, dy, w_packed, scale: float, dx, N: int, I: int, O: int,
                             accumulate: bool = False, split: int | None = None) -> None:
    """dy[N, O], w_packed[O, ceil(I/16)] u32 (ternary, times scale) -> dx[N, I] = dy Wq (= or +=)."""
    words = -(-I // 16)
    for b, n, what in ((dy, N * O, "dy"), (w_packed, O * words, "w_packed"), (dx, N * I, "dx")):
        need(b, n, what, "bitlinear_backward_input")
    slices, ko = splitk.plan(-(-words // 8) * -(-N // 64), O, 16, split)
    part = splitk.scratch(dev, slices * N * I if slices > 1 else 1)
    dev.dispatch(dev.prepared(SHADER, "bitlinear_backward_input"), [dy, w_packed, dx, part],
                 groups=(-(-words // 8), -(-N // 64), slices),
                 params=BACKWARD.pack(N, I, O, scale, int(accumulate), ko, int(slices > 1)))
    if slices > 1:
        splitk.reduce(dev, part, None, dx, N * I, slices, I, scale, accumulate)
