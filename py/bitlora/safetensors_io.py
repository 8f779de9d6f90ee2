"""Minimal safetensors reading and writing for small host-side files (LoRA adapters,
training states): a u64 little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the data.

Writes F32 only (what our adapters and moments are); reads F32, F16 and BF16 and
returns f32 `array('f')`, checking the header with bitlora.formats' parser. For big
checkpoints use bitlora.formats itself, which streams.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import array
import json
import os
import struct
import sys

from .formats import FormatError
from .formats.safetensors import parse_header
from .formats.source import BytesSource


def _f32_bytes(data, n: int, name: str) -> bytes:
    if isinstance(data, (bytes, bytearray, memoryview)):
        raw = bytes(data)
    else:
        arr = data if isinstance(data, array.array) and data.typecode == "f" else array.array("f", data)
        if sys.byteorder == "big":
            arr = array.array("f", arr)
            arr.byteswap()
        raw = arr.tobytes()
    if len(raw) != 4 * n:
        raise ValueError(f"{name}: {len(raw)} bytes for {n} f32 values")
    return raw


def dumps(tensors: dict, metadata: dict | None = None) -> bytes:
    """safetensors bytes of {name: (shape, f32 values as array('f') / sequence / bytes)};
    names sorted, header padded with spaces to 8 bytes, as the reference writer does."""
    header, chunks, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name in sorted(tensors):
        shape, data = tensors[name]
        n = 1
        for d in shape:
            n *= int(d)
        raw = _f32_bytes(data, n, name)
        header[name] = {"dtype": "F32", "shape": [int(d) for d in shape], "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(chunks)


def loads(buf: bytes, name: str = "safetensors") -> tuple:
    """(tensors {name: (shape tuple, array('f'))}, metadata dict) from safetensors bytes.
    The header is checked by bitlora.formats' parser (the checkpoints' own); any
    malformed input raises ValueError (FormatError) naming the problem, nothing else."""
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
