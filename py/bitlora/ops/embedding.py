"""Wrapper for shaders/embedding.wgsl: token embedding lookup from a table kept in
row chunks (see the shader header). Browser-safe: standard library + bitlora only."""
from __future__ import annotations

import struct

from ._check import need


async def embedding_forward(dev, ids, chunks, x, N: int, C: int) -> None:
    """ids[N] u32, chunks = [(v0, Vc, e[Vc, C] buffer), ...] covering the vocabulary
    -> x[N, C] (one dispatch per chunk). The table is f32, or bf16 where `chunks.dtype`
    says so (model.RowTable)."""
    need(ids, N, "ids", "embedding_forward")
    need(x, N * C, "x", "embedding_forward")
    bf16 = getattr(chunks, "dtype", "f32") == "bf16"
    k = await dev.kernel("embedding.wgsl", "embedding_forward", constants={"EMB_BF16": 1.0} if bf16 else None)
    for v0, vc, e in chunks:
        need(e, -(-vc * C // 2) if bf16 else vc * C, "e", "embedding_forward")
        dev.dispatch(k, [ids, e, x], groups=-(-N * C // 256), params=struct.pack("<IIII", N, C, v0, vc))
