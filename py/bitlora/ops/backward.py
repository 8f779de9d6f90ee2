"""Wrappers for shaders/backward.wgsl: input-gradient passes of the frozen network
(rmsnorm, BitLinear with the straight-through estimator, dense linear for lm_head,
relu^2 gating, RoPE, causal GQA attention). They check sizes, fill the uniform and
record dispatches; the math is in the shader header. Browser-safe: standard library
+ bitlora only.

Shape legend: N = B*T rows, C width, I/O a projection's in/out, F FFN width,
H/Hkv heads, D head dim. `accumulate=True` adds into dx instead of overwriting it.
"""
from __future__ import annotations

import struct

from ..gpu import Device
from . import splitk

SHADER = "backward.wgsl"
WG = 256


def _need(b, n: int, what: str, op: str) -> None:
    if b.size < 4 * n:
        raise ValueError(f"{op}: {what} holds {b.size // 4} words, needs {n}")


async def rmsnorm_backward(dev: Device, dy, x, w, rstd, dx, N: int, C: int, accumulate: bool = False) -> None:
    """dy[N, C], x[N, C] (the norm's input), w[C], rstd[N] -> dx[N, C] (= or +=)."""
    for b, n, what in ((dy, N * C, "dy"), (x, N * C, "x"), (w, C, "w"), (rstd, N, "rstd"), (dx, N * C, "dx")):
        _need(b, n, what, "rmsnorm_backward")
    k = await dev.kernel(SHADER, "rmsnorm_backward")
    dev.dispatch(k, [dy, x, w, rstd, dx], groups=N, params=struct.pack("<III", N, C, int(accumulate)))


async def bitlinear_backward_input(dev: Device, dy, w_packed, scale: float, dx, N: int, I: int, O: int,
                                   accumulate: bool = False, split: int | None = None) -> None:
    """dy[N, O], w_packed[O, ceil(I/16)] u32 (ternary, times scale) -> dx[N, I] = dy Wq (= or +=)."""
    words = -(-I // 16)
    for b, n, what in ((dy, N * O, "dy"), (w_packed, O * words, "w_packed"), (dx, N * I, "dx")):
        _need(b, n, what, "bitlinear_backward_input")
    slices, ko = splitk.plan(-(-words // 8) * -(-N // 64), O, 16, split)
    part = splitk.scratch(dev, slices * N * I if slices > 1 else 1)
    k = await dev.kernel(SHADER, "bitlinear_backward_input")
    dev.dispatch(k, [dy, w_packed, dx, part], groups=(-(-words // 8), -(-N // 64), slices),
                 params=struct.pack("<IIIfIII", N, I, O, scale, int(accumulate), ko, int(slices > 1)))
    if slices > 1:
        await splitk.reduce(dev, part, None, dx, N * I, slices, I, scale, accumulate)


async def linear_backward_input(dev: Device, dy, w, dx, N: int, I: int, O: int, scale: float = 1.0,
                                accumulate: bool = False, ld_dy: int | None = None, w_dtype: str = "f32",
                                split: int | None = None) -> None:
    """dy[N, ld_dy] (first O columns used), dense w[O, I] (f32 or "bf16": u32 pairs, low
    half first; e.g. lm_head = embedding[V, C] or a vocabulary chunk of it) ->
    dx[N, I] = scale * dy w (= or +=)."""
    ld = O if ld_dy is None else ld_dy
    if w_dtype not in ("f32", "bf16"):
        raise ValueError(f"linear_backward_input: w_dtype {w_dtype!r} is not f32 or bf16")
    w_words = O * I if w_dtype == "f32" else -(-O * I // 2)
    for b, n, what in ((dy, (N - 1) * ld + O, "dy"), (w, w_words, "w"), (dx, N * I, "dx")):
        _need(b, n, what, "linear_backward_input")
    k = await dev.kernel(SHADER, "linear_backward_input", constants={"LN_BF16": 1.0} if w_dtype == "bf16" else None)
    slices, ko = splitk.plan(-(-I // 64) * -(-N // 64), O, 16, split)
    part = splitk.scratch(dev, slices * N * I if slices > 1 else 1)
    dev.dispatch(k, [dy, w, dx, part], groups=(-(-I // 64), -(-N // 64), slices),
                 params=struct.pack("<IIIfIIII", N, I, O, scale, int(accumulate), ld, ko, int(slices > 1)))
    if slices > 1:
        await splitk.reduce(dev, part, None, dx, N * I, slices, I, scale, accumulate)


async def relu2_gating_backward(dev: Device, dh, g, u, dg, du, count: int) -> None:
    """h = relu(g)^2 * u over count = N*F elements: dh, g, u -> dg, du (overwrite)."""
    for b, what in ((dh, "dh"), (g, "g"), (u, "u"), (dg, "dg"), (du, "du")):
        _need(b, count, what, "relu2_gating_backward")
    k = await dev.kernel(SHADER, "relu2_gating_backward")
    dev.dispatch(k, [dh, g, u, dg, du], groups=-(-count // WG), params=struct.pack("<I", count))


async def rope_backward(dev: Device, g, cos, sin, N: int, T: int, H: int, D: int) -> None:
    """In place: g[N, H*D] holds dy (post-RoPE gradient) and becomes dx; cos, sin[T, D/2]."""
    if D % 2:
        raise ValueError(f"rope_backward: head dim D={D} must be even")
    _need(g, N * H * D, "g", "rope_backward")
    _need(cos, T * D // 2, "cos", "rope_backward")
    _need(sin, T * D // 2, "sin", "rope_backward")
    k = await dev.kernel(SHADER, "rope_backward")
    dev.dispatch(k, [g, cos, sin], groups=-(-N * H * D // 2 // WG), params=struct.pack("<IIII", N, T, H, D))


async def attention_backward(dev: Device, dout, q, k, v, dq, dk, dv, stats, B: int, T: int, H: int, Hkv: int,
                             D: int, scale: float | None = None) -> None:
    """Causal GQA attention backward over all positions. dout, q[N, H*D]; k, v[N, Hkv*D]
    (q, k post-RoPE) -> dq[N, H*D], dk, dv[N, Hkv*D] (overwrite); stats[N, H, 2] scratch.
    scale defaults to D**-0.5 (HF)."""
    N = B * T
    if D > 256 or H % Hkv:
        raise ValueError(f"attention_backward: need D <= 256 and H % Hkv == 0 (D={D}, H={H}, Hkv={Hkv})")
    for b, n, what in ((dout, N * H * D, "dout"), (q, N * H * D, "q"), (k, N * Hkv * D, "k"),
                       (v, N * Hkv * D, "v"), (dq, N * H * D, "dq"), (dk, N * Hkv * D, "dk"),
                       (dv, N * Hkv * D, "dv"), (stats, N * H * 2, "stats")):
        _need(b, n, what, "attention_backward")
    params = struct.pack("<IIIIIf", B, T, H, Hkv, D, D ** -0.5 if scale is None else scale)
    kq = await dev.kernel(SHADER, "attention_backward_dq")
    blocks = B * -(-T // 8)   # 8-row blocks, never straddling sequences
    dev.dispatch(kq, [dout, q, k, v, dq, stats], groups=blocks * H, params=params)
    kkv = await dev.kernel(SHADER, "attention_backward_dkv")
    dev.dispatch(kkv, [dout, q, k, v, stats, dk, dv], groups=blocks * Hkv, params=params)
