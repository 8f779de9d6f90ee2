"""Wrapper for shaders/sample.wgsl: the next token chosen on the GPU (greedy, or
temperature + top-p with a seed), written where the next step's embedding reads it.
Checks sizes, packs the uniform and records the dispatch; the math is in the shader
header. Browser-safe: standard library + bitlora only.

    dev.write(state, sampler_state(seed, temperature, top_p))   # once per generation
    sample_token(dev, logits, state, tok, out, V)               # once per token
"""
from __future__ import annotations

import struct

from ._check import need
from ._uniform import Uniform

SHADER = "sample.wgsl"
PARAMS = Uniform("SampleParams", "v:u32")
STATE = struct.Struct("<IIff")   # state[4]: n (tokens chosen so far), seed, temperature, top_p


CPU_CONSTANTS = {"SP_WG": 16}   # CPU adapters: a workgroup of 16 (a loop there), not 256


def _constants(dev) -> dict | None:
    return CPU_CONSTANTS if dev.kind == "cpu" else None


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    return [(SHADER, "sample_token", c) for c in {"gpu": [None], "cpu": [CPU_CONSTANTS]}.get(kind, [None, CPU_CONSTANTS])]


def sampler_state(seed: int = 0, temperature: float = 0.0, top_p: float = 1.0, n: int = 0) -> bytes:
    """The 16 bytes of a sampler state buffer: greedy when temperature <= 0."""
    if not 0.0 < top_p <= 1.0 and temperature > 0:
        raise ValueError(f"top_p={top_p} must be in (0, 1]")
    return STATE.pack(n, seed & 0xFFFFFFFF, float(temperature), float(top_p))


def sample_token(dev, logits, state, tok, out, V: int) -> None:
    """logits[V] -> the chosen id in tok[0] and out[state.n]; state.n += 1."""
    for b, n, what in ((logits, V, "logits"), (state, 4, "state"), (tok, 1, "tok"), (out, 1, "out")):
        need(b, n, what, "sample_token")
    dev.dispatch(dev.prepared(SHADER, "sample_token", _constants(dev)), [logits, state, tok, out], groups=1,
                 params=PARAMS.pack(V))
