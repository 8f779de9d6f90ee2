"""safetensors reader: bounded header parse, then tensors read on demand.

Layout: u64 little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}`,
then the data; offsets are relative to byte 8 + N. Every count, size and offset is
checked against the file size before anything is allocated.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass

from . import FormatError
from .source import Source

ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_DTYPES = {"F32": "f32", "F16": "f16", "BF16": "bf16"}
MAX_HEADER = 100 << 20


@dataclass
class STensor:
    source: Source
    dtype: str          # safetensors dtype name ("BF16", "U8", ...)
    shape: tuple
    offset: int         # absolute byte offset in the file
    nbytes: int


def parse_safetensors(src: Source) -> dict[str, STensor]:
    return parse_header(src)[0]


def parse_header(src: Source) -> tuple[dict[str, STensor], object]:
    """({name: STensor}, the header's "__metadata__" as found, None if absent). The one
    safetensors header parser: checkpoints use it, and so does bitlora.safetensors_io."""
    fn = src.name
    if src.size < 8:
        raise FormatError(f"{fn}: not a safetensors file: {src.size} bytes, shorter than the 8-byte header length")
    (hlen,) = struct.unpack("<Q", src.read_exact(0, 8, "header length"))
    if hlen > src.size - 8 or hlen > MAX_HEADER:
        raise FormatError(f"{fn}: header length {hlen} is larger than the file ({src.size} bytes) "
                          f"or the {MAX_HEADER}-byte limit: truncated or not a safetensors file")
    raw = src.read_exact(8, hlen, "JSON header")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:   # RecursionError: absurd nesting
        raise FormatError(f"{fn}: header is not valid JSON ({e}): bad magic / not a safetensors file") from e
    if not isinstance(header, dict):
        raise FormatError(f"{fn}: header is not a JSON object")
    base, data_size = 8 + hlen, src.size - 8 - hlen
    out, meta = {}, None
    for name, info in header.items():
        if name == "__metadata__":
            meta = info
            continue
        try:
            dtype, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        except (TypeError, KeyError, ValueError) as ex:
            raise FormatError(f"{fn}: tensor {name!r}: malformed header entry ({ex})") from ex
        if not isinstance(dtype, str) or dtype not in ITEMSIZE:
            raise FormatError(f"{fn}: tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and 0 <= d < 1 << 40 for d in shape):
            raise FormatError(f"{fn}: tensor {name!r}: bad shape {shape!r}")
        n = 1
        for d in shape:
            n *= d
        if not (isinstance(b, int) and isinstance(e, int) and 0 <= b <= e <= data_size):
            raise FormatError(f"{fn}: tensor {name!r}: data offsets [{b}, {e}] outside the "
                              f"{data_size}-byte data section: truncated or corrupt")
        if e - b != n * ITEMSIZE[dtype]:
            raise FormatError(f"{fn}: tensor {name!r}: {e - b} bytes for shape {shape} {dtype} "
                              f"(expected {n * ITEMSIZE[dtype]})")
        out[name] = STensor(src, dtype, tuple(shape), base + b, e - b)
    return out, meta


def scalar_value(data: bytes, dtype: str) -> float:
    """First element of a float tensor as a Python float."""
    fmt = {"F32": "<f", "F16": "<e", "F64": "<d"}.get(dtype)
    if fmt:
        return struct.unpack_from(fmt, data)[0]
    if dtype == "BF16":
        return struct.unpack("<f", b"\0\0" + data[:2])[0]
    raise FormatError(f"scale dtype {dtype} is not a float type")
