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


# -- f16 -> f32 without a loop per value ---------------------------------------------
# For a normal f16 (sign s, exponent e in 1..30, mantissa m = hi bits 1-0 : lo byte)
# the f32 is s | (e + 112) << 23 | m << 13; byte by byte (little-endian): byte 0 is 0,
# byte 1 is (lo & 7) << 5, byte 2 is lo >> 3 plus bits of hi ((hi & 3) << 5 and e's
# lowest bit << 7: the two never overlap, so one big-int add joins them), byte 3 is
# s << 7 | (e + 112) >> 1. Each is a bytes.translate through a 256-entry table. The
# same tables give +-0 right (e = 0, m = 0); subnormals (e = 0, m != 0), Inf and NaN
# (e = 31) are found with two more tables and widened one by one.
def _tab(f) -> bytes:
    return bytes(f(b) & 0xFF for b in range(256))


_B1 = _tab(lambda lo: (lo & 7) << 5)
_B2_LO = _tab(lambda lo: lo >> 3)
_B2_HI = _tab(lambda hi: ((hi & 3) << 5) | (((hi >> 2) & 1) << 7))
_B3 = _tab(lambda hi: (hi & 0x80) | ((((hi >> 2) & 31) + 112) >> 1 if (hi >> 2) & 31 else 0))
# 2: exponent 31 or a subnormal by its high bits; 1: exponent 0 (special if lo != 0)
_ODD_HI = _tab(lambda hi: 2 if (hi >> 2) & 31 == 31 or ((hi >> 2) & 31 == 0 and hi & 3) else int((hi >> 2) & 31 == 0))
_NONZERO = _tab(lambda b: int(b != 0))
_SPECIAL = _tab(lambda b: int(b >= 2))


def f16_to_f32(raw) -> bytearray:
    """Little-endian f16 values -> little-endian f32, exactly (what struct's "e" gives)."""
    import re
    import struct
    raw = bytes(raw)
    n = len(raw) // 2
    lo, hi = raw[0::2], raw[1::2]
    out = bytearray(4 * n)
    out[1::4] = lo.translate(_B1)
    out[2::4] = (int.from_bytes(lo.translate(_B2_LO), "little")
                 + int.from_bytes(hi.translate(_B2_HI), "little")).to_bytes(n, "little")
    out[3::4] = hi.translate(_B3)
    odd = (int.from_bytes(hi.translate(_ODD_HI), "little")
           + int.from_bytes(lo.translate(_NONZERO), "little")).to_bytes(n, "little").translate(_SPECIAL)
    for m in re.finditer(rb"[^\x00]", odd):
        i = m.start()
        out[4 * i:4 * i + 4] = struct.pack("<f", struct.unpack("<e", raw[2 * i:2 * i + 2])[0])
    return out
