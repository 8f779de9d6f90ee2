"""Wrapper for shaders/attention.wgsl: causal GQA attention over a KV cache, forward
(attention_backward is in ops/backward.py). Browser-safe: standard library + bitlora."""
from __future__ import annotations

import struct

from ._check import need


async def attention_forward(dev, q, k_cache, v_cache, out, lse, B: int, T: int, H: int, Hkv: int, D: int,
                            S: int, pos0: int = 0, scale: float | None = None) -> None:
    """q[N, H*D] (post-RoPE, N = B*T), k_cache, v_cache[B, S, Hkv*D] holding positions
    0..pos0+T-1 -> out[N, H*D], lse[N, H]. scale defaults to D**-0.5 (HF)."""
    N = B * T
    if D > 256 or H % Hkv or pos0 + T > S:
        raise ValueError(f"attention_forward: need D <= 256, H % Hkv == 0, pos0 + T <= S "
                         f"(D={D}, H={H}, Hkv={Hkv}, pos0={pos0}, T={T}, S={S})")
    for b, n, what in ((q, N * H * D, "q"), (k_cache, B * S * Hkv * D, "k_cache"),
                       (v_cache, B * S * Hkv * D, "v_cache"), (out, N * H * D, "out"), (lse, N * H, "lse")):
        need(b, n, what, "attention_forward")
    kern = await dev.kernel("attention.wgsl", "attention_forward")
    dev.dispatch(kern, [q, k_cache, v_cache, out, lse], groups=N * H,
                 params=struct.pack("<IIIIIIIf", B, T, H, Hkv, D, S, pos0, D ** -0.5 if scale is None else scale))


async def kv_store(dev, k, v, k_cache, v_cache, B: int, T: int, S: int, W: int, pos0: int = 0) -> None:
    """k, v[N, W] (N = B*T, W = Hkv*D) -> k_cache, v_cache[B, S, W] at positions pos0..pos0+T-1."""
    if pos0 + T > S:
        raise ValueError(f"kv_store: positions {pos0}..{pos0 + T - 1} do not fit a cache of S={S}")
    for b, n, what in ((k, B * T * W, "k"), (v, B * T * W, "v"), (k_cache, B * S * W, "k_cache"),
                       (v_cache, B * S * W, "v_cache")):
        need(b, n, what, "kv_store")
    kern = await dev.kernel("attention.wgsl", "kv_store")
    dev.dispatch(kern, [k, v, k_cache, v_cache], groups=-(-B * T * W // 256),
                 params=struct.pack("<IIIII", B, T, S, W, pos0))
