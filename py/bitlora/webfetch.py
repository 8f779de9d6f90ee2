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
        raise FetchFailed(f"{url}: could not fetch ({_last_line(e)}): {await why_unfetchable(url)}") from None
    if not resp.ok:
        raise OSError(f"{url}: HTTP {resp.status} {resp.statusText}".rstrip())
    return resp


def _origin(url: str) -> str:
    import urllib.parse
    u = urllib.parse.urlsplit(url)
    return f"{u.scheme}://{u.netloc}"


async def connect_sources() -> list | None:
    """The origins the page's Content-Security-Policy lets it fetch from ('self' as this
    server's origin), read from a response of this server; None where that cannot be
    told (no policy, or sources other than plain origins)."""
    import js
    from pyodide.ffi import to_js
    here = str(js.self.location.href)
    try:
        resp = await js.fetch(here, to_js({"method": "HEAD"}, dict_converter=js.Object.fromEntries))
    except Exception:  # noqa: BLE001 - this server is gone too: nothing to tell
        return None
    policy = {d.split()[0]: d.split()[1:] for d in str(resp.headers.get("Content-Security-Policy") or "").split(";")
              if d.split()}
    sources = policy.get("connect-src", policy.get("default-src"))
    if sources is None or any(("*" in x or "//" not in x) and x != "'self'" for x in sources):
        return None
    return [_origin(here) if x == "'self'" else x.rstrip("/") for x in sources]


async def why_unfetchable(url: str) -> str:
    """Why js.fetch(url) failed: a browser says only "Failed to fetch" for the page's
    Content-Security-Policy, a server without CORS headers and no server at all. The
    policy (this server's header) tells the first; a no-cors request, which CORS does
    not stop but the others do, tells the other two apart."""
    import js
    from pyodide.ffi import to_js
    origin = _origin(url)
    allowed = await connect_sources()
    if allowed is not None and origin not in allowed:
        here = _origin(str(js.self.location.href))
        others = [o for o in allowed if o != here and not o.endswith(("//huggingface.co", ".huggingface.co", ".hf.co"))]
        return (f"this page's Content-Security-Policy blocks {origin}: it may fetch only from its own server, "
                f"the Hugging Face Hub" + "".join(f", {o}" for o in others) + ". Serve it with "
                f"`bitlora serve --allow-origin {origin}` to allow that origin")
    try:
        await js.fetch(url, to_js({"mode": "no-cors"}, dict_converter=js.Object.fromEntries))
    except Exception:  # noqa: BLE001 - not reachable at all
        return (f"no answer from {origin}: the server is down or the address is wrong (a network error), "
                f"or it redirected to an origin this page may not fetch from")
    return (f"{origin} answered but does not let other sites' pages read it: its responses need the CORS "
            f"header Access-Control-Allow-Origin")


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
