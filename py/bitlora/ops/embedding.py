"""Wrapper for shaders/embedding.wgsl: token embedding lookup over a table kept in row
chunks (f32 or bf16). Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from ._check import need
from ._uniform import Uniform

SHADER = "embedding.wgsl"
PARAMS = Uniform("EmbeddingParams", "n:u32 c:u32 v0:u32 vc:u32")


def _constants(table_dtype: str) -> dict | None:
    return {"EMB_BF16": 1.0} if table_dtype == "bf16" else None


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    return [(SHADER, "embedding_forward", _constants(table_dtype))]


def embedding_forward(dev, ids, chunks, x, N: int, C: int) -> None:
    """ids[N] u32, chunks = [(v0, Vc, e[Vc, C] buffer), ...] covering the vocabulary
    -> x[N, C] (one dispatch per chunk). The table is f32, or bf16 where `chunks.dtype`
    says so (model.RowTable)."""
    need(ids, N, "ids", "embedding_forward")
    need(x, N * C, "x", "embedding_forward")
    dtype = getattr(chunks, "dtype", "f32")
    k = dev.prepared(SHADER, "embedding_forward", _constants(dtype))
    for v0, vc, e in chunks:
        need(e, -(-vc * C // 2) if dtype == "bf16" else vc * C, "e", "embedding_forward")
        dev.dispatch(k, [ids, e, x], groups=-(-N * C // 256), params=PARAMS.pack(N, C, v0, vc))
