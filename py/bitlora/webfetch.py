"""Downloads in the page's worker (Pyodide): the browser's `fetch`, made as careful as
the native downloader (formats.source.fetch) and light on memory.

`download(url)` returns a JS Blob of the file. A connection that drops mid-way is
resumed from where it stopped with a Range request, or, where the server answers
that with the whole file (no Range support), restarted from the start; each is posted
to the page as a log line (and shown in the progress text). After `RETRIES` drops, an
HTTP error or an HTML page (a sign-in or error page) it raises with the native
downloader's words: a body shorter than its Content-Length reads as a drop, so a
server that lies about its length ends in the same "incomplete" error.

Memory: the body arrives in small chunks (JS Uint8Arrays); at most `PIECE` bytes of
them are held before they are folded into the Blob, which Chromium keeps in its blob
store, outside the worker's heaps. Neither the worker's JS heap nor Python's holds
the file whole (the model loader then reads the Blob slice by slice, and
`cached_download` swaps it for the copy in Cache Storage, which lives on disk).
"""
from __future__ import annotations

from .formats import FormatError
from .formats.source import RETRIES, check_page, drop_note, incomplete_error, restart_note

PIECE = 16 << 20      # bytes of chunks gathered before they join the Blob
FETCH_HELP = ("the page may fetch only from its own server, the Hugging Face Hub and the origins "
              "`bitlora serve --allow-origin` names, and another server must allow it (CORS)")


def _last_line(e) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else type(e).__name__


class FetchFailed(OSError):
    """No answer at all: the page's policy, CORS or the network."""


async def fetch(url: str, headers: dict | None = None):
    """js.fetch(url) -> an ok Response; FetchFailed (an OSError) that says why in the
    page's words (a browser says only "Failed to fetch" for a blocked origin, CORS or
    the network), or an OSError naming the HTTP status."""
    import js
    from pyodide.ffi import to_js
    init = to_js({"headers": headers}, dict_converter=js.Object.fromEntries) if headers else None
    try:
        resp = await (js.fetch(url, init) if init is not None else js.fetch(url))
    except Exception as e:  # noqa: BLE001 - a JS TypeError: CSP, CORS or the network
        raise FetchFailed(f"{url}: could not fetch ({_last_line(e)}): {FETCH_HELP}") from None
    if not resp.ok:
        raise OSError(f"{url}: HTTP {resp.status} {resp.statusText}".rstrip())
    return resp


def _note(text: str) -> None:
    from .webapp import post
    post({"type": "log", "level": "warning", "text": text})


class _Dropped(Exception):
    """The connection broke off (a network error mid-body, or a body shorter than its
    Content-Length); the argument says how."""


async def download(url: str, progress=None, label: str = "", retries: int = RETRIES):
    """The JS Blob of `url`'s bytes; progress(done, total, text) as they arrive."""
    import js
    from pyodide.ffi import to_js
    got = {"blob": js.Blob.new(js.Array.new()), "pending": [], "held": 0, "pos": 0, "expect": None}   # so far
    for attempt in range(retries + 1):
        try:
            await _receive(url, got, progress, label, resume=attempt > 0)
        except _Dropped as e:
            if attempt == retries:
                raise incomplete_error(url, retries, got["pos"], got["expect"], str(e)) from None
            text = drop_note(url, got["pos"], got["expect"], str(e), attempt + 1, retries)
            _note(text)
            if progress is not None:
                progress(got["pos"], max(got["expect"] or 0, got["pos"]), f"{label}: {text}")
            continue
        return js.Blob.new(to_js([got["blob"], *got["pending"]]))
    raise AssertionError("unreachable")


async def _receive(url: str, got: dict, progress, label: str, resume: bool) -> None:
    """One request: from got["pos"] on (a Range request) when there is something to
    resume, appending to `got`; raises _Dropped if the body breaks off."""
    import js
    from pyodide.ffi import to_js
    pos = got["pos"]
    try:
        resp = await fetch(url, {"Range": f"bytes={pos}-"} if pos else None)
    except FetchFailed as e:
        if not resume:                     # never reached: the page's policy, CORS, offline
            raise
        raise _Dropped(f"no answer to the resume: {_last_line(e)}") from None
    if pos and resp.status != 206:         # the server ignores Range: from the start
        got.update(blob=js.Blob.new(js.Array.new()), pending=[], held=0, pos=0)
        pos = 0
        _note(restart_note(url))
    ctype = str(resp.headers.get("Content-Type") or "")
    length = str(resp.headers.get("Content-Length") or "")
    encoded = bool(resp.headers.get("Content-Encoding"))     # then the length counts compressed bytes
    expect = got["expect"] = pos + int(length) if length.isdigit() and not encoded else None
    reader = resp.body.getReader()
    first = pos == 0
    while True:
        try:
            part = await reader.read()
        except Exception as e:  # noqa: BLE001 - a JS TypeError: the network broke off
            raise _Dropped(_last_line(e)) from None
        if part.done:
            break
        chunk = part.value
        if first:
            try:
                check_page(url, ctype, chunk.subarray(0, 1024).to_bytes())
            except FormatError:
                await reader.cancel()
                raise
            first = False
        pending = got["pending"]
        pending.append(chunk)
        got["held"] += chunk.length
        got["pos"] = pos = pos + chunk.length
        if got["held"] >= PIECE:
            got.update(blob=js.Blob.new(to_js([got["blob"], *got["pending"]])), pending=[], held=0)
            for c in pending:            # copied into the Blob: detach them, their memory goes now
                if hasattr(c.buffer, "transfer"):
                    c.buffer.transfer(0)
        if progress is not None:
            progress(pos, max(expect or 0, pos), label)
    if expect is not None and pos < expect:
        raise _Dropped("the body ended early")
