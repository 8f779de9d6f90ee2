"""Model and dataset URLs against a local server that misbehaves on purpose: a
connection that drops half-way is resumed with a Range request (or, where the server
ignores Range, the download restarts) and the log says so; a server that sends fewer
bytes than its Content-Length, an HTML page or an HTTP error gets a clear FormatError."""
import functools
import http.server
import json
import logging
import threading
import time

import pytest

from bitlora.formats import FormatError, open_checkpoint
from bitlora.formats.source import UrlSource
from bitlora.train import _url_records

from fixtures.make_tiny import make_gguf, make_hf

RECORDS = [{"instruction": f"Add {a} and {b}.", "input": "", "output": f"{a + b}"} for a, b in [(1, 2), (3, 4)]]
PAGE = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Please sign in.</body></html>"


class Misbehaving(http.server.SimpleHTTPRequestHandler):
    """GET /MODE/FILE. Modes: ok (Range served), drop (Range served; the first request
    for more than a KiB breaks off half-way), norange-drop (Range ignored; the first
    download breaks off half-way), lie (Content-Length 1000 bytes too long, always),
    html (a sign-in page as text/html), sniff (that page as application/octet-stream),
    missing (404 with an HTML body). Every answer allows any origin (CORS), so that
    the page, served from another port, may fetch from it too."""

    def log_message(self, *args):
        pass

    def end_headers(self):
        self.send_header("Access-Control-Allow-Origin", "*")
        super().end_headers()

    def do_OPTIONS(self):  # noqa: N802 - a CORS preflight (a Range header may need one)
        self.send_response(204)
        self.send_header("Access-Control-Allow-Headers", "Range")
        self.send_header("Access-Control-Allow-Methods", "GET")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        mode, _, name = self.path.lstrip("/").partition("/")
        data = (self.server.root / name).read_bytes()
        if mode in ("html", "sniff", "missing"):
            self.send_response(404 if mode == "missing" else 200)
            self.send_header("Content-Type", "text/html" if mode != "sniff" else "application/octet-stream")
            self.send_header("Content-Length", str(len(PAGE)))
            self.end_headers()
            self.wfile.write(PAGE)
            return
        rng = self.headers.get("Range")
        start, end = 0, len(data)
        if rng and mode in ("ok", "drop"):
            a, b = rng.split("=")[1].split("-")
            start, end = int(a), (int(b) + 1 if b else len(data))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:end]
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body) + (1000 if mode == "lie" else 0)))
        self.end_headers()
        key = (mode, name)
        probe = mode == "norange-drop" and rng == "bytes=0-0"      # UrlSource's first question
        if mode in ("drop", "norange-drop") and len(body) > 1024 and key not in self.server.dropped and not probe:
            self.server.dropped.add(key)
            self.wfile.write(body[:len(body) // 2])
            self.wfile.flush()
            time.sleep(0.5)                   # a stall: a browser hands what came to the page first
            self.close_connection = True
            self.connection.shutdown(2)       # the connection breaks off
            return
        self.wfile.write(body)
        self.close_connection = True


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("downloads")
    make_gguf(make_hf(root / "hf", "online_f32", seed=3), root / "model.gguf")
    (root / "data.json").write_text(json.dumps(RECORDS))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Misbehaving, directory=str(root)))
    srv.root, srv.dropped = root, set()
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv, f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def same_tensors(url, local):
    ck, ref = open_checkpoint(url), open_checkpoint(local)
    for name in ref.tensor_names():
        assert ck.load(name) == ref.load(name), name
    return ck


@pytest.mark.parametrize("mode,says", [("drop", "resuming there with a Range request"),
                                       ("norange-drop", "downloading again from the start")])
def test_dropped_model_download_is_resumed_and_reported(server, mode, says, caplog):
    srv, base = server
    with caplog.at_level(logging.WARNING, logger="bitlora.download"):
        same_tensors(f"{base}/{mode}/model.gguf", srv.root / "model.gguf")
    print("\n" + "\n".join(r.getMessage() for r in caplog.records))
    assert (mode, "model.gguf") in srv.dropped                      # it did break off
    assert any(says in r.getMessage() for r in caplog.records)


def test_dropped_dataset_download_is_resumed(server, caplog):
    srv, base = server
    srv.root.joinpath("big.json").write_text(json.dumps(RECORDS * 40))   # over a KiB: it breaks off
    with caplog.at_level(logging.WARNING, logger="bitlora.download"):
        assert _url_records(f"{base}/norange-drop/big.json") == RECORDS * 40
    assert any("dropped at byte" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("mode,file,says", [
    ("lie", "model.gguf", "the connection dropped 4 times"),
    ("lie", "data.json", "fewer bytes than its Content-Length"),
    ("html", "model.gguf", "the server sent an HTML page titled 'Sign in' (Content-Type text/html)"),
    ("sniff", "model.gguf", "the server sent an HTML page titled 'Sign in'"),
    ("html", "data.json", "HTML page"),
    ("sniff", "data.json", "HTML page"),
    ("missing", "model.gguf", "HTTP 404"),
])
def test_bad_answers_get_a_clear_error(server, mode, file, says):
    _, base = server
    url = f"{base}/{mode}/{file}"
    with pytest.raises(FormatError) as err:
        if file.endswith(".json"):
            _url_records(url)
        else:
            open_checkpoint(url)
    print(f"\n{mode}/{file}: {err.value}")
    assert says in str(err.value) and url in str(err.value)


def test_url_source_counts_resumes(server):
    srv, base = server
    src = UrlSource(f"{base}/drop/data.json")      # under a KiB: never breaks off
    assert src.read(0, src.size) == (srv.root / "data.json").read_bytes() and src.resumed == 0


# -- the same server, through the page in headless Chromium ------------------------------
# The page fetches with the browser's fetch (bitlora.webfetch): from the page's own server
# on another port, allowed with allow_origins as `bitlora serve --allow-origin` would.

CACHED_SHA256 = """
import hashlib, js
from bitlora.webapp import MODEL_CACHE, blob_bytes
hit = await (await js.caches.open(MODEL_CACHE)).match(URL)
hashlib.sha256(blob_bytes(await hit.blob())).hexdigest() if hit else ""
"""


@pytest.fixture(scope="module")
def page_server(server):
    from bitlora.app.server import Server
    srv, base = server
    (srv.root / "page.gguf").write_bytes((srv.root / "model.gguf").read_bytes())
    srv.root.joinpath("page.json").write_text(json.dumps(RECORDS * 40))
    with Server(port=0, allow_origins=[base]) as app:
        yield app


@pytest.fixture
def page(browser_session, page_server):
    page = browser_session.browser.new_page()
    page.goto(page_server.url + "?test-hooks")
    page.locator("#kernel-result", has_text="y = [").wait_for(timeout=120_000)
    yield page
    page.close()


def page_log(page):
    return page.locator("#log").text_content()


def load_model_url(page, url, expect):
    page.get_by_label("Model URL").fill(url)
    page.get_by_label("Model URL").press("Enter")
    status = page.get_by_role("status").filter(has_text=expect)
    status.wait_for(timeout=120_000)
    return status.text_content()


def load_data_url(page, url, expect):
    page.get_by_label("Dataset URL").fill(url)
    page.get_by_label("Dataset URL").press("Enter")
    status = page.get_by_role("status").filter(has_text=expect)
    status.wait_for(timeout=60_000)
    return status.text_content()


@pytest.mark.browser
def test_page_resumes_dropped_downloads_and_says_so(server, page):
    """A model URL that breaks off half-way resumes with a Range request (or restarts
    where the server ignores Range): the log says so, the model loads and the bytes
    kept in the browser's cache equal the file's; a dataset URL likewise. Pieces of 4 KiB
    instead of 16 MiB: the chunks are folded into the Blob (and detached) many times."""
    import hashlib
    srv, base = server
    res = page.evaluate("(code) => bitloraTest.run(code, 60000)", "from bitlora import webfetch\nwebfetch.PIECE = 4096")
    assert res["ok"], res
    want = hashlib.sha256((srv.root / "page.gguf").read_bytes()).hexdigest()
    for mode, says in [("drop", "resuming there with a Range request (retry 1 of 3)"),
                       ("norange-drop", "downloading again from the start")]:
        url = f"{base}/{mode}/page.gguf"
        load_model_url(page, url, "Model loaded: page.gguf")
        assert (mode, "page.gguf") in srv.dropped                      # it did break off
        log = page_log(page)
        assert f"{url}: the connection dropped at byte" in log and says in log, log[-2000:]
        res = page.evaluate("(code) => bitloraTest.run(code, 60000)", CACHED_SHA256.replace("URL", repr(url)))
        assert res["ok"] and res["value"] == want, res
    url = f"{base}/norange-drop/page.json"
    load_data_url(page, url, f"Dataset loaded: {len(RECORDS) * 40} usable")
    assert ("norange-drop", "page.json") in srv.dropped
    assert f"{url}: the connection dropped at byte" in page_log(page)
    print("\n" + "\n".join(line for line in page_log(page).splitlines() if "dropped" in line or "again" in line))


@pytest.mark.browser
def test_page_says_what_is_wrong_with_bad_answers(server, page):
    """A server that sends fewer bytes than its Content-Length, an HTML page (by its
    Content-Type or by its first bytes) and an HTTP error: the status names the URL
    and the cause, nothing is cached, and the page goes on to load the next URL."""
    _, base = server
    cases = [("lie", "page.gguf", "the connection dropped 4 times"),
             ("lie", "data.json", "fewer bytes than its Content-Length"),
             ("html", "page.gguf", "the server sent an HTML page titled 'Sign in' (Content-Type text/html)"),
             ("sniff", "page.gguf", "the server sent an HTML page titled 'Sign in'"),
             ("html", "data.json", "HTML page"),
             ("sniff", "data.json", "HTML page"),
             ("missing", "page.gguf", "HTTP 404"),
             ("missing", "data.json", "HTTP 404")]
    for mode, file, says in cases:
        url = f"{base}/{mode}/{file}"
        load = load_data_url if file.endswith(".json") else load_model_url
        text = load(page, url, url + ":")
        print(f"\n{mode}/{file}: {text}")
        assert says in text and page.get_by_role("status").get_attribute("class") == "error", text
        if not file.endswith(".json"):
            res = page.evaluate("(code) => bitloraTest.run(code, 60000)", CACHED_SHA256.replace("URL", repr(url)))
            assert res["ok"] and res["value"] == "", res               # nothing half-downloaded kept
    load_data_url(page, f"{base}/ok/data.json", f"Dataset loaded: {len(RECORDS)} usable")
    load_model_url(page, f"{base}/ok/page.gguf", "Model loaded: page.gguf")
