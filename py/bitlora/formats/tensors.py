"""The host-side tensor layout every loader yields, and the GPU receives unchanged.

Two kinds of tensor, both plain bytes (no numpy, so this works inside Pyodide):

- `TernaryTensor`: a BitLinear weight W[O, I] with values t in {-1, 0, +1} and one
  per-tensor `scale`, so the dequantised weight is t * scale (scale = mean|W| for
  the absmean rule; HF's `weight_scale` for autobitlinear, its reciprocal for
  bitlinear). Packed 2 bits per weight, 16 weights per little-endian u32 word:
  `w_packed[O, ceil(I/16)] u32`, weight (o, i) is code `(word >> 2*(i%16)) & 3`
  of word `o*ceil(I/16) + i//16`, and t = code - 1. Padding codes are 1 (t = 0).
- `FloatTensor`: any other tensor (embeddings, norms, an untied lm_head), kept in
  its file dtype ("f32", "f16" or "bf16", little-endian, row-major) until the
  model decides what the GPU holds.

Names follow Hugging Face's BitNet (`model.layers.0.self_attn.q_proj.weight`,
`model.embed_tokens.weight`, `model.norm.weight`, `lm_head.weight`), whatever the
file format called them.
"""
from __future__ import annotations

from dataclasses import dataclass

WEIGHTS_PER_WORD = 16


def words_per_row(cols: int) -> int:
    return -(-cols // WEIGHTS_PER_WORD)


@dataclass
class TernaryTensor:
    shape: tuple[int, int]   # (O, I)
    packed: bytes            # O * words_per_row(I) * 4 bytes
    scale: float             # dequantised weight = t * scale

    def __post_init__(self):
        o, i = self.shape
        if len(self.packed) != o * words_per_row(i) * 4:
            raise ValueError(f"ternary tensor {self.shape}: {len(self.packed)} packed bytes, "
                             f"expected {o * words_per_row(i) * 4}")


@dataclass
class FloatTensor:
    shape: tuple[int, ...]
    dtype: str               # "f32" | "f16" | "bf16"
    data: bytes              # raw little-endian values, row-major (or, for a big tensor, a
                             # checkpoint.TensorBytes that reads a slice when sliced)

    ITEMSIZE = {"f32": 4, "f16": 2, "bf16": 2}

    def __post_init__(self):
        n = 1
        for d in self.shape:
            n *= d
        if self.dtype not in self.ITEMSIZE:
            raise ValueError(f"unknown float dtype {self.dtype!r}")
        if len(self.data) != n * self.ITEMSIZE[self.dtype]:
            raise ValueError(f"float tensor {self.shape} {self.dtype}: {len(self.data)} bytes, "
                             f"expected {n * self.ITEMSIZE[self.dtype]}")

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n
