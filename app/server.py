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
  /bitlora.json          {"wheel": url, "version": ...}

Only files inside those folders are served: paths are resolved (symlinks too) and
must stay inside their root. Binds to loopback unless told otherwise.
"""
from __future__ import annotations

import http.server
import json
import mimetypes
import pathlib
import posixpath
import threading
import urllib.parse

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


# Pyodide compiles WebAssembly ('wasm-unsafe-eval'); nothing else is evaluated.
# frame-ancestors: who may show the app in a frame; only itself unless the Server is
# told otherwise (show_app lets a notebook on this machine frame it). connect-src:
# the page fetches from itself, the Hub, and the origins the user allowed.
def csp(frame_ancestors: str = "'self'", allow_origins=()) -> str:
    if not frame_ancestors.strip() or any(c in frame_ancestors for c in ";,") \
            or not frame_ancestors.isprintable():
        raise ValueError(f"frame_ancestors: expected CSP sources separated by spaces, got {frame_ancestors!r}")
    connect = " ".join(["'self'", *HUB_ORIGINS, *(check_origin(o) for o in allow_origins)])
    return ("default-src 'self'; script-src 'self' 'wasm-unsafe-eval'; worker-src 'self'; "
            f"connect-src {connect}; img-src 'self' data: blob:; style-src 'self'; object-src 'none'; "
            f"base-uri 'none'; form-action 'none'; frame-ancestors {frame_ancestors}")


CSP = csp()


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
        found = self._routes(path)
        if found is None:
            return self._error(404)
        body, ctype = found
        if isinstance(body, pathlib.Path):
            body = body.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Security-Policy", self.csp)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, code: int):
        body = b"not found\n" if code == 404 else b"error\n"
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
                 frame_ancestors: str = "'self'", allow_origins=()):
        policy = csp(frame_ancestors, allow_origins)
        check_assets()
        name, data = build_wheel()
        handler = type("BoundHandler", (Handler,), {"wheel_name": name, "wheel_bytes": data, "quiet": quiet,
                                                    "csp": policy})
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
