"""Byte sources: synchronous random access `read(offset, n) -> bytes` plus `size`.

Loaders never read a whole checkpoint at once; they read headers with bounded
reads and each tensor on demand. Sources:

- `FileSource(path)`: a local file (natively).
- `BytesSource(data, name)`: bytes already in memory (tests, small files).
- `UrlSource(url)`: HTTP(S) with Range requests (natively, urllib).
- `BlobSource(blob, name)`: a JS File/Blob inside Pyodide, read synchronously
  with `FileReaderSync` (only available in a Web Worker).

`as_source(x)` turns a path, bytes, URL or Blob into a Source. A short read
raises `FormatError` naming the file ("truncated").
"""
from __future__ import annotations

import os
import sys

from .errors import FormatError


class Source:
    name: str = "<source>"
    size: int = 0

    def read(self, offset: int, n: int) -> bytes:
        raise NotImplementedError

    def read_exact(self, offset: int, n: int, what: str = "data") -> bytes:
        if offset < 0 or n < 0 or offset + n > self.size:
            raise FormatError(f"{self.name}: {what} at bytes {offset}..{offset + n} lies past the "
                              f"end of the file ({self.size} bytes): truncated or corrupt")
        data = self.read(offset, n) if n else b""
        if len(data) != n:
            raise FormatError(f"{self.name}: {what}: short read ({len(data)} of {n} bytes): truncated")
        return data

    def close(self):
        pass


class BytesSource(Source):
    def __init__(self, data, name: str = "<bytes>"):
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.size = len(self.data)
        self.name = name

    def read(self, offset, n):
        return bytes(self.data[offset:offset + n])


class FileSource(Source):
    def __init__(self, path):
        self.name = os.fspath(path)
        try:
            self.f = open(self.name, "rb")
        except OSError as e:
            raise FormatError(f"{self.name}: cannot open: {e.strerror}") from e
        self.size = os.fstat(self.f.fileno()).st_size

    def read(self, offset, n):
        if hasattr(os, "pread"):
            parts, done = [], 0
            while done < n:                       # pread may return less than asked
                b = os.pread(self.f.fileno(), min(n - done, 1 << 30), offset + done)
                if not b:
                    break
                parts.append(b)
                done += len(b)
            return parts[0] if len(parts) == 1 else b"".join(parts)
        self.f.seek(offset)
        return self.f.read(n)

    def close(self):
        self.f.close()


class UrlSource(Source):
    """HTTP(S), natively (urllib). Reads use Range requests; a server that ignores
    Range gets the file downloaded once into a temporary file instead. (In the
    browser, fetch the file in JS and pass the Blob.)"""

    def __init__(self, url: str):
        import urllib.request
        self.name = url
        self._urlopen = urllib.request.urlopen
        self._Request = urllib.request.Request
        self._file = None
        req = self._Request(url, headers={"Range": "bytes=0-0"})
        try:
            with self._urlopen(req) as r:
                cr = r.headers.get("Content-Range")
                if r.status == 206 and cr and "/" in cr and cr.rsplit("/", 1)[1].isdigit():
                    self.size = int(cr.rsplit("/", 1)[1])
                    return
                import shutil
                import tempfile
                self._file = tempfile.TemporaryFile()
                shutil.copyfileobj(r, self._file, 1 << 20)
                self.size = self._file.tell()
        except OSError as e:
            raise FormatError(f"{url}: cannot open: {e}") from e

    def read(self, offset, n):
        if n == 0:
            return b""
        if self._file is not None:
            self._file.seek(offset)
            return self._file.read(n)
        req = self._Request(self.name, headers={"Range": f"bytes={offset}-{offset + n - 1}"})
        with self._urlopen(req) as r:
            return r.read(n)

    def close(self):
        if self._file is not None:
            self._file.close()


class BlobSource(Source):
    """A JS File/Blob read synchronously (Pyodide in a Web Worker only)."""

    def __init__(self, blob, name: str | None = None):
        import js                                  # noqa: only exists under Pyodide
        self.blob = blob
        self.size = int(blob.size)
        self.name = name or str(getattr(blob, "name", "") or "<blob>")
        self._reader = js.FileReaderSync.new()

    def read(self, offset, n):
        buf = self._reader.readAsArrayBuffer(self.blob.slice(offset, offset + n))
        return buf.to_bytes()


def is_blob(x) -> bool:
    if "pyodide" not in sys.modules:
        return False
    from pyodide.ffi import JsProxy
    return isinstance(x, JsProxy) and hasattr(x, "slice") and hasattr(x, "size")


def as_source(x, name: str | None = None) -> Source:
    if isinstance(x, Source):
        return x
    if isinstance(x, (bytes, bytearray, memoryview)):
        return BytesSource(x, name or "<bytes>")
    if isinstance(x, str) and x.startswith(("http://", "https://")):
        return UrlSource(x)
    if isinstance(x, (str, os.PathLike)):
        return FileSource(x)
    if is_blob(x):
        return BlobSource(x, name)
    raise TypeError(f"cannot read a checkpoint from {type(x).__name__}")


def source_name(src) -> str:
    """A short name for where a checkpoint came from: a path or URL as given, else "bitnet"."""
    if isinstance(src, str):
        return src.rstrip("/")
    if hasattr(src, "__fspath__"):
        return str(src.__fspath__()).rstrip("/")
    return "bitnet"
