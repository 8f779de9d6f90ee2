"""The local web server: the page, Pyodide, the vendored JS, the demo assets and
the project's wheel, all from this machine (the page works with the network cut).

Routes (GET/HEAD only):
  /                      static/index.html
  /<file>                static/<file>
  /pyodide/<file>        node_modules/pyodide/<file>, then build/pyodide-extra/<file>
                         (micropip and packaging wheels fetched at set-up)
  /vendor/uplot/<file>   node_modules/uplot/dist/<file>
  /demo/<path>           the built-in demo model and dataset (bitlora.demo)
  /wheels/<name>.whl     the bitlora wheel, built in memory at start-up
  /wheels/all.json       a piplite index of that wheel (the JupyterLite kernel installs it)
  /bitlora.json          {"wheel": url, "version": ...}
  /lite/<path>           the JupyterLite site `bitlora lite` built (build/lite; a folder
                         gives its index.html), under its own CSP (lite_csp)
  /pyodide/lite-lock.json  the JupyterLite kernel's Pyodide lock file (bitlora.app.lite.kernel_lock)

Only files inside those folders are served: paths are resolved (symlinks too) and
must stay inside their root. Binds to loopback unless told otherwise.
"""
from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import mimetypes
import pathlib
import posixpath
import re
import threading
import urllib.parse

from . import lite
from .wheel import build_wheel

ROOT = pathlib.Path(__file__).resolve().parent.parent
STATIC = ROOT / "static"
NODE = ROOT / "node_modules"
EXTRA = ROOT / "build" / "pyodide-extra"

MIME = {
    ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
    ".mjs": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
    ".json": "application/json", ".wasm": "application/wasm", ".zip": "application/zip",
    ".whl": "application/zip", ".svg": "image/svg+xml", ".png": "image/png",
    ".map": "application/json", ".gguf": "application/octet-stream",
    ".safetensors": "application/octet-stream", ".txt": "text/plain; charset=utf-8",
    ".ts": "text/plain; charset=utf-8", ".ico": "image/x-icon",
}

# The Hugging Face Hub's origins: the page may fetch models from there (downloads
# redirect from huggingface.co to its file hosts). Named one by one: no wildcards.
HUB_ORIGINS = ("https://huggingface.co", "https://cdn-lfs.huggingface.co", "https://cdn-lfs.hf.co",
               "https://cdn-lfs-us-1.hf.co", "https://cdn-lfs-eu-1.hf.co", "https://cas-bridge.xethub.hf.co")


def check_origin(origin: str) -> str:
    """An origin for connect-src: scheme://host[:port], nothing else (no path, no wildcard)."""
    u = urllib.parse.urlsplit(origin)
    if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") or u.query \
            or u.fragment or u.username or "*" in origin or not origin.isprintable() or " " in origin:
        raise ValueError(f"--allow-origin: expected an origin like https://example.org:8000, got {origin!r}")
    return f"{u.scheme}://{u.netloc}"


def connect_src(allow_origins=()) -> str:
    """What pages may fetch: this server, the Hub and the origins the user allowed."""
    return " ".join(["'self'", *HUB_ORIGINS, *(check_origin(o) for o in allow_origins)])


# Pyodide compiles WebAssembly ('wasm-unsafe-eval'); nothing else is evaluated.
# frame-ancestors: who may show the app in a frame; only itself unless the Server is
# told otherwise (show_app lets a notebook on this machine frame it). connect-src:
# the page fetches from itself, the Hub, and the origins the user allowed.
def csp(frame_ancestors: str = "'self'", allow_origins=()) -> str:
    if not frame_ancestors.strip() or any(c in frame_ancestors for c in ";,") \
            or not frame_ancestors.isprintable():
        raise ValueError(f"frame_ancestors: expected CSP sources separated by spaces, got {frame_ancestors!r}")
    return ("default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; "
            f"connect-src {connect_src(allow_origins)}; img-src 'self' data: blob:; style-src 'self'; "
            f"object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors {frame_ancestors}")


CSP = csp()


# JupyterLite's pages: its index.html files run small inline scripts (allowed by their
# hashes, computed from the built site), JupyterLab compiles its settings schemas
# ('unsafe-eval') and sets styles inline; its workers (the kernel's, the service worker
# that syncs the kernel's files) and fonts are its own. Cached per build of the site.
@functools.lru_cache(maxsize=4)
def lite_csp(site: pathlib.Path, built_ns: int = 0, allow_origins: tuple = ()) -> str:
    hashes = sorted({"'sha256-" + base64.b64encode(hashlib.sha256(m.group(1).encode()).digest()).decode() + "'"
                     for page in site.rglob("*.html")
                     for m in INLINE_SCRIPT.finditer(page.read_text(errors="replace"))})
    return (f"default-src 'self'; script-src 'self' 'unsafe-eval' 'wasm-unsafe-eval' {' '.join(hashes)}; "
            f"worker-src 'self'; connect-src {connect_src(allow_origins)}; img-src 'self' data: blob:; "
            "font-src 'self' data:; style-src 'self' 'unsafe-inline'; object-src 'none'; base-uri 'none'; "
            "form-action 'none'; frame-ancestors 'self'")


INLINE_SCRIPT = re.compile(r"<script(?![^>]*\b(?:src|type=\"application/json\"))[^>]*>(.*?)</script>", re.S)


class MissingAssets(RuntimeError):
    pass


def check_assets() -> None:
    missing = [p for p in (NODE / "pyodide" / "pyodide.mjs", EXTRA) if not p.exists()]
    if missing:
        raise MissingAssets("browser assets are missing (" + ", ".join(str(p.relative_to(ROOT)) for p in missing)
                            + "): run `make setup` in the repository first")


def _inside(root: pathlib.Path, rel: str) -> pathlib.Path | None:
    """root/rel if it is an existing file that really lies inside root, else None."""
    if not rel or "\0" in rel or "\\" in rel:
        return None
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    root = root.resolve()
    try:
        path = (root / rel).resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if not path.is_file() or not path.is_relative_to(root):
        return None
    return path


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "bitlora"
    wheel_name = ""
    wheel_bytes = b""
    wheel_index = b""
    lite_dir = lite.SITE
    lite_lock = b""
    allow_origins = ()
    quiet = False
    csp = CSP

    def log_message(self, fmt, *args):  # noqa: D401 - http.server API
        if not self.quiet:
            super().log_message(fmt, *args)

    def do_HEAD(self):  # noqa: N802
        self._serve(head=True)

    def do_GET(self):  # noqa: N802
        self._serve(head=False)

    def _routes(self, path: str):
        """(bytes or file path, content type) for a URL path, or None."""
        if path in ("", "/"):
            path = "/index.html"
        if path == "/bitlora.json":
            body = json.dumps({"wheel": f"/wheels/{self.wheel_name}", "version": self.wheel_name.split("-")[1]})
            return body.encode(), MIME[".json"]
        if path == f"/wheels/{self.wheel_name}":
            return self.wheel_bytes, MIME[".whl"]
        if path == "/wheels/all.json":
            return self.wheel_index, MIME[".json"]
        if path == "/pyodide/lite-lock.json":
            return self._kernel_lock(), MIME[".json"]
        if path.startswith("/lite/"):
            rel = path[len("/lite/"):]
            if rel == "" or rel.endswith("/"):
                rel += "index.html"
            found = _inside(self.lite_dir, rel)
            return (found, MIME.get(found.suffix, "application/octet-stream")) if found else None
        for prefix, roots in (("/pyodide/", (NODE / "pyodide", EXTRA)),
                              ("/vendor/uplot/", (NODE / "uplot" / "dist",)),
                              ("/demo/", (ROOT / "py" / "bitlora" / "demo",)),
                              ("/", (STATIC,))):
            if path.startswith(prefix):
                rel = path[len(prefix):]
                for root in roots:
                    found = _inside(root, rel)
                    if found is not None and found.suffix != ".py":
                        return found, MIME.get(found.suffix, "application/octet-stream")
                return None
        return None

    def _serve(self, head: bool):
        raw = urllib.parse.urlsplit(self.path).path
        path = urllib.parse.unquote(raw)
        if posixpath.normpath(path) != path.rstrip("/") and path != "/":
            return self._error(404)
        if (path == "/lite" or path.startswith("/lite/")) and not path.endswith("/"):
            rel = path[len("/lite/"):]                  # a folder of the site: on to its index.html
            if _inside(self.lite_dir, f"{rel}/index.html" if rel else "index.html"):
                query = urllib.parse.urlsplit(self.path).query
                return self._redirect(raw + "/" + (f"?{query}" if query else ""))
        try:
            found = self._routes(path)
        except lite.LiteError as e:
            return self._error(404, f"{e}\n".encode())
        if found is None:
            if (path == "/lite" or path.startswith("/lite/")) and not self.lite_dir.is_dir():
                return self._error(404, b"no JupyterLite site here: build it with `bitlora lite` "
                                        b"(or `make lite`)\n")
            return self._error(404)
        body, ctype = found
        if isinstance(body, pathlib.Path):
            body = body.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", self._lite_csp() if path.startswith("/lite/") else self.csp)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _kernel_lock(self) -> bytes:
        """Made on first use (the app itself needs none of the kernel's wheels)."""
        bound = type(self)
        if not bound.lite_lock:
            bound.lite_lock = json.dumps(lite.kernel_lock()).encode()
        return bound.lite_lock

    def _lite_csp(self) -> str:
        built = (self.lite_dir / "index.html").stat().st_mtime_ns
        return lite_csp(self.lite_dir, built, self.allow_origins)

    def _redirect(self, location: str):
        self.send_response(301)
        self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _error(self, code: int, body: bytes | None = None):
        body = body or (b"not found\n" if code == 404 else b"error\n")
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)


class Server:
    """`with Server(port=0) as s: s.url` — serves in a background thread.
    frame_ancestors: the CSP sources allowed to frame the app (default: only itself);
    allow_origins: origins the page may fetch datasets and models from, besides itself
    and the Hub."""

    def __init__(self, host: str = "127.0.0.1", port: int = 8765, quiet: bool = True,
                 frame_ancestors: str = "'self'", allow_origins=(), lite_dir: pathlib.Path = lite.SITE):
        policy = csp(frame_ancestors, allow_origins)
        check_assets()
        name, data = build_wheel()
        lite_dir = pathlib.Path(lite_dir).resolve()
        handler = type("BoundHandler", (Handler,), {
            "wheel_name": name, "wheel_bytes": data, "quiet": quiet, "csp": policy,
            "wheel_index": json.dumps(lite.piplite_index(name, data)).encode(),
            "lite_dir": lite_dir, "allow_origins": tuple(allow_origins)})
        self.lite_dir = lite_dir
        self.httpd = http.server.ThreadingHTTPServer((host, port), handler)
        self.httpd.daemon_threads = True
        self.host, self.port = self.httpd.server_address[:2]
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.url = f"http://{'[' + shown + ']' if ':' in shown else shown}:{self.port}/"
        self._thread = None

    def start(self) -> "Server":
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="bitlora-server", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()


mimetypes.add_type("application/wasm", ".wasm")
