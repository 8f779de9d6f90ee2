"""safetensors, read and written: the one header parser (checkpoints read their
tensors on demand through it) and whole-file `loads` / `dumps` for the small files
bitlora writes itself (LoRA adapters, training states).

Layout: u64 little-endian header length N, N bytes of JSON
`{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`,
then the data; offsets are relative to byte 8 + N. Every count, size and offset is
checked against the file size before anything is allocated.

    entries, meta = parse_header(source)         # {name: STensor}, checkpoints stream from these
    tensors, meta = loads(data)                  # {name: (shape, array('f'))}: F32, F16, BF16
    data = dumps({name: (shape, values)}, meta)  # F32 only (adapters and moments are)
    write_atomic(path, data)

Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import array
import json
import os
import struct
import sys
from dataclasses import dataclass

from .errors import FormatError
from .source import BytesSource, Source

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
    """({name: STensor}, the header's "__metadata__" as found, None if absent)."""
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


# -- whole files: adapters and training states ------------------------------------

def _f32_view(data, n: int, name: str):
    """The little-endian bytes of n f32 values as a buffer to copy from (no copy made
    where data already is bytes or a little-endian array('f'))."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = memoryview(data).cast("B")
    else:
        arr = data if isinstance(data, array.array) and data.typecode == "f" else array.array("f", data)
        if sys.byteorder == "big":
            arr = array.array("f", arr)
            arr.byteswap()
        raw = memoryview(arr).cast("B")
    if len(raw) != 4 * n:
        raise ValueError(f"{name}: {len(raw)} bytes for {n} f32 values")
    return raw


def dumps(tensors: dict, metadata: dict | None = None) -> bytearray:
    """safetensors bytes of {name: (shape, f32 values as array('f') / sequence / bytes)};
    names sorted, header padded with spaces to 8 bytes (the layout other writers produce too).
    Each tensor is copied once, into the one buffer returned: a checkpoint's moments and
    parameters are most of the page's Python memory when it is written."""
    header, views, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        shape, data = tensors[name]
        n = 1
        for d in shape:
            n *= int(d)
        raw = _f32_view(data, n, name)
        header[name] = {"dtype": "F32", "shape": [int(d) for d in shape], "data_offsets": [off, off + len(raw)]}
        views.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    out = bytearray(8 + len(h) + off)
    struct.pack_into("<Q", out, 0, len(h))
    at = 8 + len(h)
    out[8:at] = h
    for raw in views:
        out[at:at + len(raw)] = raw
        at += len(raw)
    return out


def loads(buf: bytes, name: str = "safetensors") -> tuple:
    """(tensors {name: (shape tuple, array('f'))}, metadata dict) from safetensors bytes.
    The header is checked by parse_header; any malformed input raises ValueError
    (FormatError) naming the problem, nothing else."""
    src = BytesSource(buf, name)
    entries, meta = parse_header(src)
    meta = meta or {}
    if not isinstance(meta, dict):
        raise FormatError(f"{name}: __metadata__ is not a JSON object")
    out = {}
    for key, t in entries.items():
        if t.dtype not in ("F32", "F16", "BF16"):
            raise FormatError(f"{name}: tensor {key} has dtype {t.dtype}; expected F32, F16 or BF16")
        raw = src.read_exact(t.offset, t.nbytes, f"tensor {key}")
        if t.dtype == "F32":
            arr = array.array("f", raw)
            if sys.byteorder == "big":
                arr.byteswap()
        elif t.dtype == "F16":
            arr = array.array("f", struct.unpack(f"<{len(raw) // 2}e", raw))
        else:
            h = array.array("H", raw)
            if sys.byteorder == "big":
                h.byteswap()
            arr = array.array("f", array.array("I", (x << 16 for x in h)).tobytes())
        out[key] = (tuple(int(d) for d in t.shape), arr)
    return out, meta


def write_atomic(path, data: bytes) -> None:
    """Write a file so that a reader sees the old content or the new, never a mix:
    a temporary file in the same folder, flushed to disk, then os.replace."""
    path = os.fspath(path)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        try:
            os.fsync(f.fileno())
        except OSError:      # some in-browser file systems have no fsync
            pass
    os.replace(tmp, path)
