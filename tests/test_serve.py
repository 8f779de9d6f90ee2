"""`bitlora serve`: the page, Pyodide and the wheel from this machine, safely."""
import http.client
import pathlib
import re
import subprocess
import sys
import time
import urllib.request

import pytest

BIN = pathlib.Path(sys.executable).parent / "bitlora"


@pytest.fixture(scope="module")
def served():
    proc = subprocess.Popen([str(BIN), "serve", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:\d+/)", line)
        assert m, f"bitlora serve printed no URL: {line!r}"
        yield m.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def get(url):
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.status, r.headers, r.read()


def raw_status(base, path):
    """Status of a request whose path is sent byte for byte (no client normalisation)."""
    host, port = base[len("http://"):].rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", path)
    status = conn.getresponse().status
    conn.close()
    return status


def test_serves_page_pyodide_and_wheel_with_right_types(served):
    status, headers, body = get(served)
    assert status == 200 and b"bitlora" in body and headers["Content-Type"].startswith("text/html")
    assert "script-src 'self' 'wasm-unsafe-eval'" in headers["Content-Security-Policy"]
    _, headers, body = get(served + "pyodide/pyodide.asm.wasm")
    assert headers["Content-Type"] == "application/wasm" and body[:4] == b"\0asm"
    _, headers, _ = get(served + "pyodide/pyodide.mjs")
    assert headers["Content-Type"].startswith("text/javascript")
    _, _, meta = get(served + "bitlora.json")
    import json
    wheel = json.loads(meta)["wheel"]
    _, headers, body = get(served.rstrip("/") + wheel)
    import io
    import zipfile
    names = zipfile.ZipFile(io.BytesIO(body)).namelist()
    assert "bitlora/shaders/hello.wgsl" in names and "bitlora/gpu/browser.py" in names
    assert not any(n.startswith("bitlora/app/") for n in names)


@pytest.mark.parametrize("path", ["/../pyproject.toml", "/%2e%2e/pyproject.toml", "/pyodide/../../pyproject.toml",
                                  "/pyodide/%2e%2e/%2e%2e/app/cli.py", "//etc/passwd", "/etc/passwd",
                                  "/demo/__init__.py", "/static/../app/cli.py", "/nonexistent.js"])
def test_no_path_traversal(served, path):
    assert raw_status(served, path) == 404


def test_playwright_visit_sees_kernel_result(served, browser_session):
    page = browser_session.new_page()
    try:
        page.goto(served)
        # (the page's CSP forbids eval, so wait with a locator, not wait_for_function)
        page.locator("#kernel-result", has_text="y = [").wait_for(timeout=120_000)
        text = page.locator("#kernel-result").text_content()
        assert "y = [1, 3, 5, 7, 9, 11, 13, 15]" in text, text  # 2 * x + 1, x = 0..7
        assert "WebGPU works" in page.get_by_role("status").text_content()
        assert "GPU adapter" in page.locator("#gpu-info").text_content()
    finally:
        page.close()
