"""Ternary weights in pure Python: pack/unpack our 2-bit layout, decode/encode the
GGUF block formats (TQ1_0, TQ2_0, I2_S), and ternarise float weights (absmean).

No numpy (this runs in Pyodide) and no per-weight Python loops: every pass is a
C-level bytes operation. The tricks:
- `bytes[k::stride]` gathers one byte (or one bit-field) of every block or word;
- `bytes.translate(table)` maps every byte through a 256-entry table (extract a
  2-bit field, decode a base-3 digit, compare with a threshold byte);
- several byte strings whose bytes never carry are combined with one big-int add
  (`int.from_bytes`), e.g. four shifted 2-bit codes make one packed byte;
- `bytearray[w::W] = stream` scatters a stream back into block order.

Intermediate form: `codes`, one byte per weight, row-major, code = t + 1 in {0,1,2}.
Our packed layout (see tensors.py): 16 codes per little-endian u32, weight i of a
row at bits 2*(i%16) of word i//16, rows padded to a multiple of 16 with code 1;
byte-wise that is 4 consecutive weights per byte, lowest bits first.
"""
from __future__ import annotations

import math
import struct
import sys
from array import array

from .errors import FormatError
from .tensors import WEIGHTS_PER_WORD, words_per_row

assert sys.byteorder == "little"


def _table(f) -> bytes:
    return bytes(f(b) & 0xFF for b in range(256))


def _add(parts, n: int) -> bytes:
    """Bytewise sum of equal-length byte strings whose byte sums stay < 256."""
    total = 0
    for p in parts:
        total += int.from_bytes(p, "little")
    return total.to_bytes(n, "little")


_SHL = [_table(lambda b, k=k: (b & 3) << (2 * k)) for k in range(4)]   # code -> field k
_EXT = [_table(lambda b, k=k: (b >> (2 * k)) & 3) for k in range(4)]   # field k -> code
_HAS3 = _table(lambda b: int(any((b >> (2 * k)) & 3 == 3 for k in range(4))))


def f32(x: float) -> float:
    """Round a Python float to float32 (as torch would store it)."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check_codes_packed(packed: bytes) -> bool:
    """True if no 2-bit field of `packed` holds the invalid code 3."""
    return not packed.translate(_HAS3).strip(b"\0")


# -- our 2-bit layout -----------------------------------------------------------

def pack_codes(codes: bytes, rows: int, cols: int) -> bytes:
    """codes[rows*cols] (one byte per weight, 0..2) -> w_packed[rows, ceil(cols/16)] u32 bytes."""
    pc = words_per_row(cols) * WEIGHTS_PER_WORD
    if pc != cols:
        pad = b"\x01" * (pc - cols)
        codes = b"".join([codes[r * cols:(r + 1) * cols] + pad for r in range(rows)])
    n = rows * pc
    return _add([codes[k::4].translate(_SHL[k]) for k in range(4)], n // 4)


def unpack_codes(packed: bytes, rows: int, cols: int) -> bytes:
    """Inverse of pack_codes: w_packed bytes -> codes[rows*cols]."""
    pc = words_per_row(cols) * WEIGHTS_PER_WORD
    out = bytearray(rows * pc)
    for k in range(4):
        out[k::4] = packed.translate(_EXT[k])
    if pc != cols:
        return b"".join([bytes(out[r * pc:r * pc + cols]) for r in range(rows)])
    return bytes(out)


def codes_to_values(codes: bytes) -> list[int]:
    """Test helper: codes -> list of t in {-1, 0, 1}."""
    return [c - 1 for c in codes]


# -- HF packed uint8 [O/4, I] ---------------------------------------------------

def codes_from_hf_packed(packed: bytes, rows: int, cols: int) -> bytes:
    """HF BitNet layout: code at bits 2i of packed row p is output row i*(O/4)+p.

    Plane i of the packed bytes is therefore rows i*O/4 .. (i+1)*O/4 in order."""
    assert len(packed) * 4 == rows * cols
    return b"".join([packed.translate(_EXT[i]) for i in range(4)])


_EXT_SHL = [[_table(lambda b, i=i, k=k: ((b >> (2 * i)) & 3) << (2 * k)) for k in range(4)] for i in range(4)]


def packed_from_hf_packed(packed: bytes, rows: int, cols: int) -> bytes:
    """HF packed uint8 [O/4, I] straight to our layout (one pass per plane, no codes)."""
    if cols % WEIGHTS_PER_WORD:
        return pack_codes(codes_from_hf_packed(packed, rows, cols), rows, cols)
    m = rows // 4 * cols // 4                    # our bytes per plane
    return b"".join([_add([packed[k::4].translate(_EXT_SHL[i][k]) for k in range(4)], m)
                     for i in range(4)])


def hf_packed_from_codes(codes: bytes, rows: int, cols: int) -> bytes:
    q = rows // 4 * cols
    return _add([codes[i * q:(i + 1) * q].translate(_SHL[i]) for i in range(4)], q)


# -- GGUF block formats ----------------------------------------------------------

class BlockFormat:
    """A block of W weights in BS bytes; `spec` lists (weight, byte, decode, encode)
    tables; `final` maps the summed encode contributions of a byte to the stored byte."""

    def __init__(self, name, W, BS, spec, final=None):
        self.name, self.W, self.BS, self.spec, self.final = name, W, BS, spec, final
        self.by_byte = {}
        for w, off, dec, enc in spec:
            self.by_byte.setdefault(off, []).append((w, enc))
        by_w = {w: (off, dec) for w, off, dec, _ in spec}
        # our packed byte g of a block = weights 4g..4g+3, each from its own byte and field
        self.groups = [[(by_w[4 * g + t][0], bytes((d & 3) << (2 * t) for d in by_w[4 * g + t][1]))
                        for t in range(4)] for g in range(W // 4)]

    def decode(self, data: bytes, n: int) -> bytes:
        """Blocks -> codes[n] (scales ignored here)."""
        nb = n // self.W
        out = bytearray(n)
        for w, off, dec, _ in self.spec:
            out[w::self.W] = data[off:nb * self.BS:self.BS].translate(dec)
        return bytes(out)

    def decode_packed(self, data: bytes, n: int) -> bytes:
        """Blocks -> our packed bytes for n weights in flat order (rows must be a
        multiple of 16 long so rows need no padding)."""
        nb, G = n // self.W, self.W // 4
        out = bytearray(n // 4)
        for g, parts in enumerate(self.groups):
            out[g::G] = _add([data[off:nb * self.BS:self.BS].translate(tab) for off, tab in parts], nb)
        return bytes(out)

    def encode(self, codes: bytes, n: int) -> bytearray:
        """codes[n] -> blocks (scale bytes left zero)."""
        nb = n // self.W
        out = bytearray(nb * self.BS)
        for off, lst in self.by_byte.items():
            v = _add([codes[w::self.W].translate(enc) for w, enc in lst], nb)
            out[off::self.BS] = v.translate(self.final) if self.final else v
        return out


def _tq2_spec():
    spec = []
    for k in range(64):
        h, m = divmod(k, 32)
        for l in range(4):
            spec.append((128 * h + 32 * l + m, k, _EXT[l], _SHL[l]))
    return spec


def _trit_dec(n):
    return _table(lambda b: (((b * 3 ** n) & 0xFF) * 3) >> 8)


def _trit_enc(n):
    return _table(lambda b: (b if b < 3 else 0) * 3 ** (4 - n))


def _tq1_spec():
    spec = []
    for m in range(32):
        for n in range(5):
            spec.append((n * 32 + m, m, _trit_dec(n), _trit_enc(n)))
    for m in range(16):
        for n in range(5):
            spec.append((160 + n * 16 + m, 32 + m, _trit_dec(n), _trit_enc(n)))
    for j in range(4):
        for n in range(4):
            spec.append((240 + n * 4 + j, 48 + j, _trit_dec(n), _trit_enc(n)))
    return spec


def _i2s_spec():
    spec = []
    for j in range(32):
        for p in range(4):
            sh = 6 - 2 * p
            spec.append((32 * p + j, j, _table(lambda b, sh=sh: (b >> sh) & 3),
                         _table(lambda b, sh=sh: (b & 3) << sh)))
    return spec


TQ2_0 = BlockFormat("TQ2_0", 256, 66, _tq2_spec())
TQ1_0 = BlockFormat("TQ1_0", 256, 54, _tq1_spec(),
                    final=_table(lambda v: (v * 256 + 242) // 243 if v < 243 else 0))
I2_S = BlockFormat("I2_S", 128, 32, _i2s_spec())


def tq_scale(data: bytes, fmt: BlockFormat, n: int):
    """Per-block f16 scales of a TQ tensor -> (scale, zero_blocks).

    Our layout has one scale per tensor; blocks may only differ by being all-zero
    (d = 0). Returns None if two blocks have different nonzero scales."""
    nb = n // fmt.W
    d = bytearray(2 * nb)
    d[0::2] = data[fmt.BS - 2::fmt.BS]
    d[1::2] = data[fmt.BS - 1::fmt.BS]
    mv = memoryview(d).cast("H")
    vals = set(mv) - {0, 0x8000}
    if len(vals) > 1:
        return None
    zero = []
    if len(vals) < len(set(mv)) or not vals:
        zero = [i for i, v in enumerate(mv) if v & 0x7FFF == 0]
    scale = struct.unpack("<e", vals.pop().to_bytes(2, "little"))[0] if vals else 0.0
    return scale, zero


def zero_blocks(codes: bytes, W: int, blocks) -> bytes:
    if not blocks:
        return codes
    out = bytearray(codes)
    for b in blocks:
        out[b * W:(b + 1) * W] = b"\x01" * W
    return bytes(out)


# -- float weights -> ternary ----------------------------------------------------

ITEM = {"f32": 4, "f16": 2, "bf16": 2}
_CLR7 = _table(lambda b: b & 0x7F)
_SGN = _table(lambda b: b >> 7)
_COMBINE = _table(lambda v: (v // 3 if v // 3 != 1 else v % 3) if v < 9 else 0)
_FINAL = _table(lambda v: 1 if v < 2 else (2 if v % 2 == 0 else 0))   # state*2 + sign -> code
_FIN2 = bytes([1, 1, 2, 2, 0, 0, 1, 2, 1, 0] + [1] * 246)
_INF = {"f32": 0x7F800000, "f16": 0x7C00, "bf16": 0x7F80}


def _value(u: int, dtype: str) -> float:
    if dtype == "f32":
        return struct.unpack("<f", u.to_bytes(4, "little"))[0]
    if dtype == "f16":
        return struct.unpack("<e", u.to_bytes(2, "little"))[0]
    return struct.unpack("<f", (u << 16).to_bytes(4, "little"))[0]


def _cmp_table(t: int) -> bytes:
    return _table(lambda b: 0 if b < t else (1 if b == t else 2))


def codes_from_threshold(data: bytes, dtype: str, n: int, thr: int) -> bytes:
    """codes[n]: +-1 (by sign) where the magnitude bit pattern >= thr, else 0.

    Non-negative floats order like their bit patterns, so this is a lexicographic
    byte comparison, done plane by plane with translate + big-int combine."""
    k = ITEM[dtype]
    tb = thr.to_bytes(k, "little")
    top = data[k - 1::k]
    if k == 2:      # one combine: top byte decides (0 below, 2/4 above +/-) or defers (6/8 equal +/-)
        ta = _table(lambda b: (lambda mag, neg: 0 if mag < tb[1] else (4 if neg else 2) if mag > tb[1]
                               else (8 if neg else 6))(b & 0x7F, b >> 7))
        ge = _table(lambda b: int(b >= tb[0]))
        x = int.from_bytes(top.translate(ta), "little") | int.from_bytes(data[0::2].translate(ge), "little")
        return x.to_bytes(n, "little").translate(_FIN2)
    sign = top.translate(_SGN)
    state = top.translate(_CLR7).translate(_cmp_table(tb[k - 1]))
    for j in range(k - 2, -1, -1):
        if b"\x01" not in state:
            break
        x = int.from_bytes(state, "little") * 3 + int.from_bytes(data[j::k].translate(_cmp_table(tb[j])), "little")
        state = x.to_bytes(n, "little").translate(_COMBINE)
    x = int.from_bytes(state, "little") * 2 + int.from_bytes(sign, "little")
    return x.to_bytes(n, "little").translate(_FINAL)


def _magnitudes(data: bytes, dtype: str) -> bytearray:
    k = ITEM[dtype]
    out = bytearray(data)
    out[k - 1::k] = data[k - 1::k].translate(_CLR7)
    return out


def mean_abs(data: bytes, dtype: str, n: int) -> float:
    """mean(|W|) with a float64 accumulator (error far below one float32 ulp)."""
    if dtype == "bf16":                     # bf16 -> f32 bytes: [0, 0, lo, hi & 0x7f]
        buf = bytearray(2 * len(data))
        buf[2::4] = data[0::2]
        buf[3::4] = data[1::2].translate(_CLR7)
        a = array("f")
        a.frombytes(buf)
        return sum(a) / n
    mags = _magnitudes(data, dtype)
    if dtype == "f32":
        a = array("f")
        a.frombytes(mags)
        return sum(a) / n
    total, step = 0.0, 1 << 20              # f16: struct 'e', in chunks to bound memory
    for i in range(0, n, step):
        m = min(step, n - i)
        total += sum(struct.unpack_from(f"<{m}e", mags, 2 * i))
    return total / n


def absmean_scale(data: bytes, dtype: str, n: int) -> float:
    """HF weight_quant's s = 1 / mean(|W|).clamp(min=1e-5), in float32."""
    mean = f32(mean_abs(data, dtype, n))
    return f32(1.0 / max(mean, f32(1e-5)))


def _threshold(s: float, dtype: str) -> int:
    """Smallest magnitude pattern u with |round(fl32(val(u) * s))| >= 1, i.e. fl32(val*s) > 0.5."""
    lo, hi = 0, _INF[dtype]                 # pred(hi) is true (inf * s = inf)

    def pred(u):
        p = _value(u, dtype) * s             # exact in double, then round to f32
        try:
            return f32(p) > 0.5
        except OverflowError:
            return True
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def ternarize_absmean(data: bytes, dtype: str, n: int):
    """Float weights -> (codes[n], scale) exactly as HF's WeightQuant does in float32:
    s = 1/mean|W| (clamped), t = clamp(round(W*s), -1, 1), dequantised t/s = t*scale."""
    s = absmean_scale(data, dtype, n)
    if not 0.0 < s < float("inf"):          # mean |W| is Inf or NaN: no scale exists
        raise FormatError("float weights hold Inf or NaN: cannot ternarise them")
    codes = codes_from_threshold(data, dtype, n, _threshold(s, dtype))
    return codes, f32(1.0 / s)


def exact_ternary(data: bytes, dtype: str, n: int):
    """If every |W| is 0 or one value a (a converter's ternarised weights), return
    (codes[n], a); else None."""
    mags = _magnitudes(data, dtype)
    vals = set(memoryview(mags).cast("I" if dtype == "f32" else "H")) - {0}
    if len(vals) > 1:
        return None
    if not vals:
        return b"\x01" * n, 0.0
    a = vals.pop()
    if a >= _INF[dtype]:                     # Inf / NaN: not a usable scale
        return None
    return codes_from_threshold(data, dtype, n, a), _value(a, dtype)
