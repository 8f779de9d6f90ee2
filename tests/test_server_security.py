"""`bitlora serve` hardening: loopback by default, no path traversal (plain, encoded,
absolute, backslashes, NUL, symlinks out of the tree), only the app's folders
served, GET/HEAD only, right MIME types, a strict CSP; and the page's own scripts
contain no eval and no HTML sinks, so data can only ever be shown as text.

The server runs in-process (app.server.Server on port 0); the symlink cases swap the
static root for a temporary folder. tests/test_serve.py covers the CLI process.
"""
from __future__ import annotations

import http.client
import inspect
import pathlib
import re
import socket

import pytest

server = pytest.importorskip("app.server")
ROOT = server.ROOT


@pytest.fixture(scope="module")
def base():
    try:
        s = server.Server(port=0).start()
    except server.MissingAssets as e:
        pytest.skip(str(e))
    try:
        yield s
    finally:
        s.close()


def request(s, path: str, method: str = "GET", body: bytes | None = None):
    """(status, headers, body) of a request whose target is sent byte for byte."""
    conn = http.client.HTTPConnection(s.host, s.port, timeout=10)
    conn.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
    if body is not None:
        conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    r = conn.getresponse()
    out = r.status, r.headers, r.read()
    conn.close()
    return out


def raw_request(s, line: bytes) -> bytes:
    """The raw response to a raw request line (for bytes http.client refuses to send)."""
    with socket.create_connection((s.host, s.port), timeout=10) as c:
        c.sendall(line + b"\r\nHost: x\r\nConnection: close\r\n\r\n")
        chunks = []
        while chunk := c.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# -- binding ---------------------------------------------------------------------------------

def test_binds_loopback_unless_told():
    from app.cli import build_parser
    assert build_parser().parse_args(["serve"]).host == "127.0.0.1"
    assert inspect.signature(server.Server).parameters["host"].default == "127.0.0.1"


def test_running_server_listens_on_loopback_only(base):
    assert base.host == "127.0.0.1"
    assert base.httpd.socket.getsockname()[0] == "127.0.0.1"


# -- traversal and what is served ------------------------------------------------------------

SECRET_FILES = ["/pyproject.toml", "/.git/config", "/.git/HEAD", "/py/bitlora/__init__.py", "/app/server.py",
                "/tests/conftest.py", "/demo/__init__.py", "/node_modules/pyodide/package.json",
                "/static/index.html", "/build/pyodide-extra", "/.venv/pyvenv.cfg"]

TRAVERSALS = [
    "/../pyproject.toml", "/%2e%2e/pyproject.toml", "/%2E%2E/pyproject.toml", "/.%2e/pyproject.toml",
    "/%2e%2e%2fpyproject.toml", "/..%2fpyproject.toml", "/..%2Fpyproject.toml", "/%252e%252e/pyproject.toml",
    "/pyodide/../../pyproject.toml", "/pyodide/%2e%2e/%2e%2e/pyproject.toml", "/pyodide/..%2f..%2fpyproject.toml",
    "/demo/../../../pyproject.toml", "/demo/%2e%2e/__init__.py", "/vendor/uplot/../../../pyproject.toml",
    "/vendor/uplot/%2e%2e%2f%2e%2e%2f%2e%2e%2fpyproject.toml", "/wheels/../pyproject.toml",
    "/..\\pyproject.toml", "/%5c..%5cpyproject.toml", "/..%5cpyproject.toml", "/./index.html/../../pyproject.toml",
    "/index.html/..", "/index.html/", "/%2fetc%2fpasswd", "//etc/passwd", "/etc/passwd", "///etc/passwd",
    "/pyodide//etc/passwd", "/pyodide/%2fetc%2fpasswd", "/demo//etc/passwd", "/%c0%ae%c0%ae/pyproject.toml",
    "/..;/pyproject.toml", "/app.js%00.html", "/%00", "/index.html%00", "http://evil/../pyproject.toml",
    "/?../../pyproject.toml#x", "/..", "/.", "/static/../app/cli.py",
]


@pytest.mark.parametrize("path", SECRET_FILES + TRAVERSALS)
def test_nothing_outside_the_app_folders(base, path):
    status, _, body = request(base, path)
    if status == 200:                      # only the page itself may answer (e.g. "/?../..")
        assert body == (server.STATIC / "index.html").read_bytes(), path
    else:
        assert status == 404, (path, status)
    assert b"[project]" not in body and b"root:" not in body and b"[core]" not in body


def test_absolute_paths_of_this_machine(base):
    """The repository's own absolute path, plain and encoded, under every route."""
    target = str(ROOT / "pyproject.toml")
    for prefix in ("", "/", "/pyodide/", "/demo/", "/vendor/uplot/"):
        for t in (target, target.replace("/", "%2f")):
            status, _, body = request(base, prefix + t if prefix else "/" + t)
            assert status == 404 and b"[project]" not in body, (prefix, t)


def test_nul_and_backslash_bytes_on_the_wire(base):
    for line in (b"GET /index.html\x00 HTTP/1.1", b"GET /..\\pyproject.toml HTTP/1.1",
                 b"GET /pyodide/..\\..\\pyproject.toml HTTP/1.1", b"GET ../pyproject.toml HTTP/1.1",
                 b"GET pyproject.toml HTTP/1.1"):
        resp = raw_request(base, line)
        assert resp.startswith(b"HTTP/1.0 404") and b"[project]" not in resp, (line, resp[:80])


def test_python_sources_are_never_served(base):
    assert request(base, "/demo/__init__.py")[0] == 404
    assert request(base, "/demo/alpaca_demo.json")[0] == 200


@pytest.fixture
def swapped_static(tmp_path, monkeypatch):
    """A static root holding symlinks that point out of it (file and folder)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET")
    root = tmp_path / "static"
    root.mkdir()
    (root / "index.html").write_text("<!doctype html><title>t</title>")
    (root / "ok.txt").write_text("fine")
    (root / "link.txt").symlink_to(outside / "secret.txt")
    (root / "dir").symlink_to(outside, target_is_directory=True)
    (root / "repo").symlink_to(ROOT, target_is_directory=True)
    (root / "inner.txt").symlink_to(root / "ok.txt")      # a link that stays inside is fine
    monkeypatch.setattr(server, "STATIC", root)
    return root


def test_symlinks_out_of_the_tree_are_refused(base, swapped_static):
    assert request(base, "/ok.txt")[:1] == (200,)
    assert request(base, "/inner.txt")[2] == b"fine"
    for path in ("/link.txt", "/dir/secret.txt", "/repo/pyproject.toml", "/repo/.git/config",
                 "/dir%2fsecret.txt", "/repo/static/index.html"):
        status, _, body = request(base, path)
        assert status == 404 and b"SECRET" not in body and b"[project]" not in body, path


# -- methods ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"])
def test_only_get_and_head(base, method):
    status, _, body = request(base, "/index.html", method, body=b"x=1")
    assert status in (405, 501), (method, status)
    assert body != (server.STATIC / "index.html").read_bytes() and b"<script" not in body


def test_head_sends_headers_without_body(base):
    status, headers, body = request(base, "/app.js", "HEAD")
    assert status == 200 and body == b""
    assert int(headers["Content-Length"]) == (server.STATIC / "app.js").stat().st_size
    assert request(base, "/../pyproject.toml", "HEAD")[0] == 404


# -- types and headers -----------------------------------------------------------------------

MIME_CASES = [("/", "text/html"), ("/index.html", "text/html"), ("/app.js", "text/javascript"),
              ("/worker.js", "text/javascript"), ("/style.css", "text/css"), ("/bitlora.json", "application/json"),
              ("/pyodide/pyodide.mjs", "text/javascript"), ("/pyodide/pyodide.asm.wasm", "application/wasm"),
              ("/pyodide/pyodide-lock.json", "application/json"), ("/demo/alpaca_demo.json", "application/json")]


@pytest.mark.parametrize("path,mime", MIME_CASES)
def test_mime_types_and_security_headers(base, path, mime):
    status, headers, _ = request(base, path)
    assert status == 200, path
    assert headers["Content-Type"].split(";")[0] == mime
    assert headers["X-Content-Type-Options"] == "nosniff"
    csp = headers["Content-Security-Policy"]
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp, csp
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";") if d.strip())
    assert directives["script-src"].split() == ["'self'", "'wasm-unsafe-eval'"]
    assert directives["object-src"] == "'none'" and directives["default-src"] == "'self'"
    assert "*" not in csp


def test_wheel_is_a_zip(base):
    import json
    meta = json.loads(request(base, "/bitlora.json")[2])
    status, headers, body = request(base, meta["wheel"])
    assert status == 200 and headers["Content-Type"] == "application/zip" and body[:2] == b"PK"


# -- the page's sources ----------------------------------------------------------------------

PAGE_FILES = sorted(p for p in server.STATIC.iterdir() if p.suffix in (".js", ".mjs", ".html"))
SINKS = [r"\beval\s*\(", r"\bnew\s+Function\b", r"(?<![.\w])Function\s*\(", r"\.innerHTML\b", r"\.outerHTML\b",
         r"insertAdjacentHTML", r"document\.write", r"\bsetTimeout\s*\(\s*['\"`]", r"\bsetInterval\s*\(\s*['\"`]",
         r"createContextualFragment", r"\bsrcdoc\b", r"javascript:"]


@pytest.mark.parametrize("path", PAGE_FILES, ids=lambda p: p.name)
def test_page_has_no_eval_and_no_html_sinks(path):
    """Data (dataset records, model metadata, errors) reaches the DOM only through
    textContent / createElement; nothing is parsed as HTML or evaluated."""
    text = path.read_text(encoding="utf-8")
    for sink in SINKS:
        assert not re.search(sink, text), f"{path.name}: {sink}"
    if path.suffix == ".html":
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", text, re.I), f"{path.name}: inline script"
        assert not re.search(r"\son[a-z]+\s*=", text, re.I), f"{path.name}: inline event handler"
        assert "style=" not in text, f"{path.name}: inline style (CSP style-src 'self')"


def test_server_module_docstring_matches_routes():
    """The routes the docstring lists are the ones the handler knows (no hidden extras)."""
    src = pathlib.Path(server.__file__).read_text()
    for route in ("/pyodide/", "/vendor/uplot/", "/demo/", "/wheels/", "/bitlora.json", "/lite/",
                  "/wheels/all.json", "/pyodide/lite-lock.json"):
        assert route in server.__doc__ and route in src


def test_connect_src_admits_self_the_hub_and_allowed_origins_only():
    policy = server.csp(allow_origins=["http://127.0.0.1:9000", "https://data.example.org/"])
    connect = dict(d.strip().split(" ", 1) for d in policy.split(";") if d.strip())["connect-src"].split()
    assert connect == ["'self'", *server.HUB_ORIGINS, "http://127.0.0.1:9000", "https://data.example.org"]
    for bad in ("*", "https://*.example.org", "example.org", "https://a.org/path", "https://a.org; script-src *",
                "ftp://a.org"):
        with pytest.raises(ValueError):
            server.csp(allow_origins=[bad])
