"""Drive bitlora inside Pyodide in headless Chromium (real WebGPU), from CPython.

Used by the tests (the same portable case runs natively and here) and by
`bitlora train --backend browser`. Starts the local server on a free loopback
port, launches Chromium through Playwright (`executable_path`: Playwright cannot
download its own browsers here), opens harness.html and waits for the worker's
Python to be ready. `run(code)` executes Python (top-level await allowed) in the
worker and returns the value of its last expression, which must be a str;
`request(msg)` sends a typed message to the worker's handlers (bitlora.webapp)
and returns the message that answers it; `on_message` sees the others the worker
posts (progress, steps) as they come.
Every wait has a timeout that fails loudly with the browser's recent console.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil

from .server import Server

# WebGPU on a machine without a GPU: SwiftShader's Vulkan; the rest keeps a
# sandboxed, offline Chromium from reaching out.
CHROMIUM_FLAGS = [
    "--enable-unsafe-webgpu", "--enable-unsafe-swiftshader", "--use-webgpu-adapter=swiftshader",
    "--enable-features=Vulkan", "--use-vulkan=swiftshader", "--no-sandbox",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-first-run", "--disable-quic",
]


class BrowserError(RuntimeError):
    """Python raised inside the browser, or the browser did not answer in time."""


def find_chromium() -> str:
    for cand in (os.environ.get("BITLORA_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                 shutil.which("chromium-browser"), shutil.which("google-chrome")):
        if cand and pathlib.Path(cand).exists():
            return cand
    raise BrowserError("no Chromium found: install it (Debian: apt-get install chromium) "
                       "or set BITLORA_CHROMIUM to its path")


@contextlib.contextmanager
def _driver_in_own_session():
    """Start Playwright's driver (node, and so the Chromium it launches) in a process
    session of its own. A terminal's Ctrl+C goes to its whole process group: the driver
    would die with us, and `bitlora train --backend browser` could no longer stop the run
    in the page and save its adapter. The driver still ends with us: it exits when its
    stdin, a pipe from this process, closes."""
    plain = asyncio.create_subprocess_exec

    async def apart(*args, **kwargs):
        if os.name == "posix":
            kwargs.setdefault("start_new_session", True)
        return await plain(*args, **kwargs)
    asyncio.create_subprocess_exec = apart
    try:
        yield
    finally:
        asyncio.create_subprocess_exec = plain


class BrowserSession:
    def __init__(self, boot_timeout_s: float = 180.0, gpu_flags: bool = True):
        self.boot_timeout_s = boot_timeout_s
        self.gpu_flags = gpu_flags
        self.console: list[str] = []
        self.on_console = None    # optional callback(line) for every console line
        self.on_message = None    # optional callback(msg) for every message the worker posts unasked
        self.server = self._pw = self.browser = self.page = None

    def start(self) -> "BrowserSession":
        from playwright.sync_api import sync_playwright

        self.server = Server(port=0).start()
        with _driver_in_own_session():
            self._pw = sync_playwright().start()
        flags = CHROMIUM_FLAGS if self.gpu_flags else [f for f in CHROMIUM_FLAGS if "webgpu" not in f]
        self.browser = self._pw.chromium.launch(executable_path=find_chromium(), args=flags, headless=True)
        self.page = self.new_page()
        self.page.expose_function("bitloraMessage", self._message)
        self.page.goto(self.server.url + "harness.html")
        self._await_js("window.bitlora.ready.then(() => 'ready')", self.boot_timeout_s, "Pyodide boot")
        return self

    def new_page(self):
        page = self.browser.new_page()
        page.on("console", lambda m: self._log(f"[{m.type}] {m.text}"))
        page.on("pageerror", lambda e: self._log(f"[pageerror] {e}"))
        return page

    def _message(self, msg: dict) -> None:
        if self.on_message is not None:
            self.on_message(msg)

    def _log(self, line: str) -> None:
        if self.on_console is not None:
            self.on_console(line)
        self.console.append(line)
        del self.console[:-200]

    def _await_js(self, expr: str, timeout_s: float, what: str):
        ms = int(timeout_s * 1000)
        script = (f"() => Promise.race([({expr}), new Promise((_, reject) => "
                  f"setTimeout(() => reject(new Error('{what}: no answer after {timeout_s:.0f} s')), {ms}))])")
        try:
            return self.page.evaluate(script)
        except Exception as e:  # noqa: BLE001 - playwright.Error and friends
            raise BrowserError(f"{what} failed: {e}\n--- browser console ---\n" + "\n".join(self.console[-40:])) from None

    def run(self, code: str, timeout_s: float = 600.0) -> str:
        """Run Python in the worker; return its last expression (a str)."""
        ms = int(timeout_s * 1000)
        res = self.page.evaluate("([code, ms]) => window.bitlora.run(code, ms)", [code, ms])
        if not res.get("ok"):
            raise BrowserError("Python in the browser failed:\n" + str(res.get("error"))
                               + "\n--- browser console ---\n" + "\n".join(self.console[-20:]))
        return res.get("value")

    def request(self, msg: dict, timeout_s: float = 600.0) -> dict:
        """Send `msg` ({"type": ..., ...}) to the worker's handlers; return their answer.
        Keys whose value is None are left out (handlers read them with msg.get): a JS
        null would reach Python as jsnull, not None."""
        ms = int(timeout_s * 1000)
        msg = {k: v for k, v in msg.items() if v is not None}
        res = self.page.evaluate("([msg, ms]) => window.bitlora.request(msg, ms)", [msg, ms])
        if res.get("type") == "error":
            raise BrowserError(f"{msg['type']} failed in the browser: {res.get('text')}"
                               + "\n--- browser console ---\n" + "\n".join(self.console[-20:]))
        return res

    def run_case(self, path: pathlib.Path, name: str, kwargs: dict | None = None, timeout_s: float = 600.0):
        """Run `async def <name>(dev, **kwargs)` from a portable module file in the worker."""
        path = pathlib.Path(path)
        mod = path.stem
        code = (
            "import importlib, json, pathlib, sys\n"
            "_dir = pathlib.Path('/home/pyodide/portable')\n"
            "_dir.mkdir(parents=True, exist_ok=True)\n"
            f"(_dir / {mod + '.py'!r}).write_text({path.read_text()!r})\n"
            "if str(_dir) not in sys.path: sys.path.insert(0, str(_dir))\n"
            "importlib.invalidate_caches()\n"
            f"_m = importlib.reload(importlib.import_module({mod!r}))\n"
            "from bitlora import gpu\n"
            "_dev = await gpu.get_device()\n"
            f"json.dumps(await _m.{name}(_dev, **json.loads({json.dumps(kwargs or {})!r})))\n"
        )
        return json.loads(self.run(code, timeout_s))

    def close(self) -> None:
        for closer in (lambda: self.browser and self.browser.close(), lambda: self._pw and self._pw.stop(),
                       lambda: self.server and self.server.close()):
            try:
                closer()
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc):
        self.close()
