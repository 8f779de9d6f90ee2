"""Wrappers for shaders/rope.wgsl: rotary position embedding in place, forward and
backward, and the host-side cos/sin tables computed the way HF does (f32 inv_freq,
f32 angles). Browser-safe: standard library + bitlora only."""
from __future__ import annotations

import array
import math
import struct

from ._check import need, quads
from ._uniform import Uniform
from .attention import zero_pos

SHADER = "rope.wgsl"
FORWARD = Uniform("RopeParams", "n:u32 t:u32 h:u32 d:u32 pos0:u32")
BACKWARD = Uniform("RopeBackwardParams", "n:u32 t:u32 h:u32 d:u32")
KV = Uniform("RopeKvParams", "b:u32 t:u32 h:u32 hkv:u32 d:u32 s:u32 pos0:u32 slices:u32 "
                             "scale_q:f32 scale_k:f32 scale_v:f32")


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """The GPU kernels (on a CPU the fallback where D % 8 != 0: not with such `shapes`),
    the CPU variants (*_cpu) unless kind is "gpu"."""
    entries = ["rope_forward"] + (["rope_backward"] if training else [])
    gpu = [] if quads(shapes, "D", by=8) else [(SHADER, e) for e in entries]
    return gpu + [(SHADER, "rope_kv_store")] + ([(SHADER, e + "_cpu") for e in entries] if kind != "gpu" else [])


def _entry(dev, name: str, N: int, H: int, D: int) -> tuple:
    """(kernel, workgroups): the CPU variant (4 pairs per invocation) on a CPU device
    where D % 8 == 0, else the GPU kernel (one pair per invocation)."""
    if dev.kind == "cpu" and D % 8 == 0:
        return dev.prepared(SHADER, name + "_cpu"), -(-N * H * D // 8 // 256)
    return dev.prepared(SHADER, name), -(-N * H * D // 2 // 256)


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


def rope_forward(dev, x, cos, sin, N: int, T: int, H: int, D: int, pos0: int = 0) -> None:
    """In place on x[N, H*D]; row n is at position pos0 + n % T; cos, sin[P, D/2], P > pos0 + T - 1."""
    if D % 2:
        raise ValueError(f"rope_forward: head dim D={D} must be even")
    need(x, N * H * D, "x", "rope_forward")
    need(cos, (pos0 + T) * D // 2, "cos", "rope_forward")
    need(sin, (pos0 + T) * D // 2, "sin", "rope_forward")
    kernel, groups = _entry(dev, "rope_forward", N, H, D)
    dev.dispatch(kernel, [x, cos, sin], groups=groups, params=FORWARD.pack(N, T, H, D, pos0))


def rope_backward(dev, g, cos, sin, N: int, T: int, H: int, D: int) -> None:
    """In place: g[N, H*D] holds dy (post-RoPE gradient) and becomes dx; cos, sin[T, D/2]."""
    if D % 2:
        raise ValueError(f"rope_backward: head dim D={D} must be even")
    need(g, N * H * D, "g", "rope_backward")
    need(cos, T * D // 2, "cos", "rope_backward")
    need(sin, T * D // 2, "sin", "rope_backward")
    kernel, groups = _entry(dev, "rope_backward", N, H, D)
    dev.dispatch(kernel, [g, cos, sin], groups=groups, params=BACKWARD.pack(N, T, H, D))


def rope_kv_store(dev, q, k, v, k_cache, v_cache, cos, sin, B: int, T: int, H: int, Hkv: int, D: int, S: int,
                  pos0: int = 0, kv_pos=None, sums=None) -> None:
    """A forward over a KV cache: RoPE on q[N, H*D] in place, and k, v[N, Hkv*D] into
    k_cache, v_cache[B, S, Hkv*D] at positions pos0.. (k rotated on the way): rope_forward
    on q and k, then ops.attention.kv_store, in one dispatch (k itself is left as it was).
    kv_pos: a GPU buffer whose u32 [0] is added to pos0 as the kernel runs (as in
    attention_forward); the caller keeps the positions inside S and the tables.
    sums: the split sums (splitk.SplitSums) of the int8 forward of q, k, v, reduced here
    (the same bits as their reduce before): q is written, k and v are not. Sums of other
    outputs are flushed first."""
    N, W = B * T, Hkv * D
    if D % 2:
        raise ValueError(f"rope_kv_store: head dim D={D} must be even")
    if pos0 + T > S:
        raise ValueError(f"rope_kv_store: positions {pos0}..{pos0 + T - 1} do not fit a cache of S={S}")
    for b, n, what in ((q, N * H * D, "q"), (k, N * W, "k"), (v, N * W, "v"), (k_cache, B * S * W, "k_cache"),
                       (v_cache, B * S * W, "v_cache"), (cos, (pos0 + T) * D // 2, "cos"),
                       (sin, (pos0 + T) * D // 2, "sin")):
        need(b, n, what, "rope_kv_store")
    if kv_pos is not None:
        need(kv_pos, 1, "kv_pos", "rope_kv_store")
    slices, scales, src = 0, (0.0, 0.0, 0.0), (k, v)
    if sums is not None:
        if [(O, y) for O, _, y in sums.outs] == [(H * D, q), (W, k), (W, v)] and not sums.accumulate:
            slices, scales, src = sums.slices, tuple(sc for _, sc, _ in sums.outs), (sums.part, sums.s)
        else:
            sums.flush(dev)
    dev.dispatch(dev.prepared(SHADER, "rope_kv_store"), [q, *src, k_cache, v_cache, cos, sin,
                                                         kv_pos if kv_pos is not None else zero_pos(dev)],
                 groups=-(-N * (H + Hkv) * D // 2 // 256), params=KV.pack(B, T, H, Hkv, D, S, pos0, slices, *scales))
