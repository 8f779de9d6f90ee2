"""Minimal safetensors reading and writing for small host-side files (LoRA adapters,
training states): a u64 little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the data.

Writes F32 only (what our adapters and moments are); reads F32, F16 and BF16 and
returns f32 `array('f')`. For big checkpoints use bitlora.formats, which streams.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import array
import json
import os
import struct
import sys


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
    Any malformed input raises ValueError naming the problem (nothing else escapes)."""
    buf = memoryview(buf).cast("B")
    if len(buf) < 8:
        raise ValueError(f"{name}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", buf[:8])
    if 8 + n > len(buf):
        raise ValueError(f"{name}: header length {n} past the end of the file")
    try:
        header = json.loads(bytes(buf[8:8 + n]))
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{name}: bad safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{name}: safetensors header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict):
        raise ValueError(f"{name}: __metadata__ is not a JSON object")
    data, out = buf[8 + n:], {}
    for key, info in header.items():
        try:
            (a, b), dtype, shape = info["data_offsets"], info["dtype"], tuple(info["shape"])
        except (TypeError, KeyError, ValueError):
            raise ValueError(f"{name}: tensor {key}: malformed header entry") from None
        if not (type(a) is int and type(b) is int and 0 <= a <= b <= len(data)):
            raise ValueError(f"{name}: tensor {key}: data offsets {[a, b]} outside the {len(data)}-byte data")
        if not all(type(d) is int and d >= 0 for d in shape):
            raise ValueError(f"{name}: tensor {key}: bad shape {list(shape)}")
        size = {"F32": 4, "F16": 2, "BF16": 2}.get(dtype) if isinstance(dtype, str) else None
        if size is None:
            raise ValueError(f"{name}: tensor {key} has dtype {dtype}; expected F32, F16 or BF16")
        count = 1
        for d in shape:
            count *= d
        if b - a != size * count:
            raise ValueError(f"{name}: tensor {key} holds {b - a} bytes for shape {list(shape)} {dtype}")
        raw = bytes(data[a:b])
        if dtype == "F32":
            arr = array.array("f", raw)
            if sys.byteorder == "big":
                arr.byteswap()
        elif dtype == "F16":
            arr = array.array("f", struct.unpack(f"<{len(raw) // 2}e", raw))
        else:
            h = array.array("H", raw)
            if sys.byteorder == "big":
                h.byteswap()
            arr = array.array("f", array.array("I", (x << 16 for x in h)).tobytes())
        out[key] = (shape, arr)
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
