"""Byte sources: synchronous random access `read(offset, n) -> bytes` plus `size`.

Loaders never read a whole checkpoint at once; they read headers with bounded
reads and each tensor on demand. Sources:

- `FileSource(path)`: a local file (natively).
- `BytesSource(data, name)`: bytes already in memory (tests, small files).
- `UrlSource(url)`: HTTP(S) with Range requests (natively, urllib); `fetch` is
  its downloader: a connection that drops mid-way is resumed with a Range request
  (restarted where the server ignores Range) and logged; a body shorter than its
  Content-Length after the retries, an HTTP error or an HTML page raise FormatError.
  (The page's downloader, bitlora.webfetch, says the same things in the same words.)
- `BlobSource(blob, name)`: a JS File/Blob inside Pyodide, read synchronously
  with `FileReaderSync` (only available in a Web Worker).

`as_source(x)` turns a path, bytes, URL or Blob into a Source. A short read
raises `FormatError` naming the file ("truncated").
"""
from __future__ import annotations

import io
import logging
import os
import re
import sys

from .errors import FormatError

RETRIES = 3       # a dropped download is resumed (or restarted) this many times
TIMEOUT = 60      # seconds without data before a connection counts as dropped
log = logging.getLogger("bitlora.download")   # resumed / restarted downloads are logged here


def _dropped(e) -> bool:
    """Whether `e` is a connection that broke (worth resuming), not an answer."""
    import http.client
    import urllib.error
    drops = (http.client.HTTPException, ConnectionError, TimeoutError)
    if isinstance(e, urllib.error.HTTPError):
        return False
    if isinstance(e, urllib.error.URLError):
        return isinstance(e.reason, drops)
    return isinstance(e, drops)


def check_page(url: str, ctype: str, head: bytes) -> None:
    """FormatError for an HTML page where a file was expected (a login, an error or a
    landing page): by its Content-Type or its first bytes."""
    if "html" in ctype.lower() or head.lstrip()[:15].lower().startswith((b"<!doctype html", b"<html")):
        m = re.search(rb"<title[^>]*>(.*?)</title>", head, re.I | re.S)
        title = f" titled {m.group(1).decode('utf-8', 'replace').strip()[:80]!r}" if m else ""
        raise FormatError(f"{url}: the server sent an HTML page{title} (Content-Type {ctype or 'none'}), "
                          "not the file: check the URL (a login, error or download page?)")


# What a download says (natively, and in the page: webfetch.py).
def drop_note(url: str, pos: int, expect, why: str, retry: int, retries: int) -> str:
    return (f"{url}: the connection dropped at byte {pos} of {expect if expect is not None else '?'} ({why}); "
            f"resuming there with a Range request (retry {retry} of {retries})")


def restart_note(url: str) -> str:
    return f"{url}: the server cannot resume (it ignores Range): downloading again from the start"


def incomplete_error(url: str, retries: int, pos: int, expect, why: str) -> FormatError:
    return FormatError(f"{url}: the connection dropped {retries + 1} times, the last at byte {pos} of "
                       f"{expect if expect is not None else '?'} ({why}); the download is incomplete (a "
                       "server that sends fewer bytes than its Content-Length announces looks the same)")


def fetch(url: str, out, start: int = 0, end: int | None = None, retries: int = RETRIES) -> dict:
    """Write bytes start..end-1 of `url` (end None: to the end of the file) to the binary
    file `out`. Returns {"bytes", "size" (of the whole file, if the server says),
    "resumed", "restarted"}. A dropped connection is resumed from where it stopped with a
    Range request, or, for a whole download from a server that ignores Range, restarted
    from the start (`out` truncated); each is logged. After `retries` drops, or on an
    HTTP error or an HTML page, FormatError."""
    import http.client
    import urllib.error
    import urllib.request
    pos, size, info = start, None, {"resumed": 0, "restarted": 0}
    expect = None
    for attempt in range(retries + 1):
        ranged = pos > 0 or end is not None
        headers = {"Range": f"bytes={pos}-{'' if end is None else end - 1}"} if ranged else {}
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=TIMEOUT) as r:
                if ranged and r.status != 206:
                    if start or end is not None:
                        raise FormatError(f"{url}: the server ignored a Range request (HTTP {r.status})")
                    out.seek(0)
                    out.truncate()
                    pos, info["restarted"] = 0, info["restarted"] + 1
                    log.warning(restart_note(url))
                length = r.headers.get("Content-Length", "")
                expect = pos + int(length) if length.isdigit() else None
                cr = r.headers.get("Content-Range", "")
                size = int(cr.rsplit("/", 1)[1]) if r.status == 206 and cr.rsplit("/", 1)[-1].isdigit() else expect
                while True:
                    chunk = r.read(1 << 20)
                    if not chunk:
                        break
                    if pos == start:
                        check_page(url, r.headers.get("Content-Type", ""), chunk[:1024])
                    out.write(chunk)
                    pos += len(chunk)
                if expect is not None and pos < expect:
                    raise http.client.IncompleteRead(b"", expect - pos)
            info.update(bytes=pos - start, size=size)
            return info
        except urllib.error.HTTPError as e:
            raise FormatError(f"{url}: HTTP {e.code} {e.reason}") from None
        except Exception as e:  # noqa: BLE001 - sorted by _dropped
            if not _dropped(e):
                if isinstance(e, OSError):
                    raise FormatError(f"{url}: cannot download: {e}") from None
                raise
            if attempt == retries:
                raise incomplete_error(url, retries, pos, expect, type(e).__name__) from None
            info["resumed"] += 1
            log.warning(drop_note(url, pos, expect, type(e).__name__, attempt + 1, retries))
    raise AssertionError("unreachable")


def url_bytes(url: str, retries: int = RETRIES) -> bytes:
    """The whole of `url`, natively, with fetch's resuming and checks."""
    buf = io.BytesIO()
    fetch(url, buf, retries=retries)
    return buf.getvalue()


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
    Range gets the file downloaded once into a temporary file instead. Both go through
    `fetch`: dropped connections are resumed, HTML pages refused. (In the browser,
    fetch the file in JS and pass the Blob.)"""

    def __init__(self, url: str):
        import tempfile
        import urllib.error
        import urllib.request
        self.name = url
        self._file = None
        self.resumed = 0          # dropped connections resumed so far (tests read it)
        req = urllib.request.Request(url, headers={"Range": "bytes=0-0"})
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                cr = r.headers.get("Content-Range")
                if r.status == 206 and cr and "/" in cr and cr.rsplit("/", 1)[1].isdigit():
                    check_page(url, r.headers.get("Content-Type", ""), b"")
                    self.size = int(cr.rsplit("/", 1)[1])
                    return
        except urllib.error.HTTPError as e:
            raise FormatError(f"{url}: HTTP {e.code} {e.reason}") from None
        except OSError as e:
            if not _dropped(e):
                raise FormatError(f"{url}: cannot open: {e}") from e
        self._file = tempfile.TemporaryFile()    # no Range support (or the probe dropped): download it
        info = fetch(url, self._file)
        self.resumed += info["resumed"] + info["restarted"]
        self.size = self._file.tell()

    def read(self, offset, n):
        if n == 0:
            return b""
        if self._file is not None:
            self._file.seek(offset)
            return self._file.read(n)
        buf = io.BytesIO()
        self.resumed += fetch(self.name, buf, offset, offset + n)["resumed"]
        return buf.getvalue()

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
        data = buf.to_bytes()
        if hasattr(buf, "transfer"):    # detach it: its memory goes now, not at a later collection
            buf.transfer(0)
        return data


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
