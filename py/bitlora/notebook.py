"""bitlora in notebooks: the entry points `import bitlora` exports, a live training
display, and the web app in an output cell.

    model = bitlora.load_model("demo")          # Pyodide: await bitlora.load_model("demo")
    trainer = bitlora.Trainer(model, "demo", {"max_steps": 20, "lr": 2e-3})
    bitlora.train_with_display(trainer)         # Pyodide: await ...
    bitlora.show_app()                          # native kernels only

The model comes from model.py (`bitlora.load_model` is model.load_model,
`bitlora.aload_model` is Model.load, "demo" the built-in demo model) and the trainer
from train.py (its Trainer, with URL data and generate, is bitlora.Trainer). What this
module adds, and nothing more:
- The display: the trainer's `on_step` updates one IPython display in place (a
  progress bar, the latest numbers and an inline SVG loss plot, drawn here from the
  metrics with no plotting library). Without IPython (a script, the bare Pyodide
  worker) it prints a plain line every few steps.

Standard library + bitlora only (IPython when present): this module runs in Pyodide.
Natively, `show_app` starts the server in bitlora.app (native only, imported lazily).
"""
from __future__ import annotations

import html
import math
import sys
import time

from . import gpu
from .config import TrainConfig  # noqa: F401 - re-exported by bitlora
from .data import format_prompt  # noqa: F401 - for prompts in notebooks
from .train import Trainer  # noqa: F401 - bitlora.Trainer is bitlora.train.Trainer


# -- the live display ---------------------------------------------------------------

def _ipython_shell():
    """The IPython shell when it can show rich output (a kernel), else None."""
    mod = sys.modules.get("IPython")
    if mod is None:
        try:
            import IPython as mod
        except ImportError:
            return None
    try:
        shell = mod.get_ipython()
    except Exception:  # noqa: BLE001 - a half-installed IPython is no display
        return None
    if shell is None or type(shell).__name__ == "TerminalInteractiveShell":
        return None
    return shell


def _fmt_time(s) -> str:
    if s is None or not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _num(x, spec: str = ".4g") -> str:
    try:
        return format(float(x), spec)
    except (TypeError, ValueError):
        return "?"


def text_line(row: dict | None, total: int, elapsed_s: float, width: int = 20) -> str:
    """One plain-text progress line: `step 12/20 [############........] loss 3.21 ...`."""
    step = row["step"] if row else 0
    filled = int(width * step / total) if total else 0
    bar = "#" * filled + "." * (width - filled)
    if row is None:
        return f"step 0/{total} [{bar}] starting (the first step compiles the kernels)"
    return (f"step {step}/{total} [{bar}] loss {_num(row.get('loss'))} grad_norm {_num(row.get('grad_norm'), '.3g')} "
            f"lr {_num(row.get('lr'), '.2e')} {_num(row.get('tokens_per_s'), '.0f')} tok/s "
            f"elapsed {_fmt_time(elapsed_s)} eta {_fmt_time(row.get('eta_s'))}")


def loss_svg(metrics: list, total: int | None = None, width: int = 420, height: int = 150) -> str:
    """An inline SVG plot of loss against step (raw line, plus an EMA when there are
    enough points). Pure string building; every text is escaped."""
    pts = [(int(r["step"]), float(r["loss"])) for r in metrics
           if isinstance(r.get("loss"), (int, float)) and math.isfinite(r["loss"])]
    left, right, top, bottom = 48, 10, 10, 24
    w, h = width - left - right, height - top - bottom
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="training loss by step" '
             f'style="font:11px sans-serif;background:#fff">',
             f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#ccc"/>']
    if pts:
        x_hi = max(total or 0, pts[-1][0], 2)
        y_lo, y_hi = min(p[1] for p in pts), max(p[1] for p in pts)
        pad = (y_hi - y_lo) * 0.05 or max(abs(y_hi) * 0.05, 1e-3)
        y_lo, y_hi = y_lo - pad, y_hi + pad

        def xy(s, v):
            return left + w * (s - 1) / (x_hi - 1), top + h * (y_hi - v) / (y_hi - y_lo)

        def line(points, color, stroke):
            coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(s, v) for s, v in points))
            if len(points) == 1:
                x, y = xy(*points[0])
                return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>'
            return f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="{stroke}"/>'

        parts.append(line(pts, "#9ecae1", 1.2))
        if len(pts) >= 8:
            ema, smooth = pts[0][1], []
            for s, v in pts:
                ema = 0.8 * ema + 0.2 * v
                smooth.append((s, ema))
            parts.append(line(smooth, "#08519c", 2))
        labels = [(left - 4, top + 10, "end", _num(y_hi - pad, ".3g")),
                  (left - 4, top + h, "end", _num(y_lo + pad, ".3g")),
                  (left, height - 6, "start", "1"),
                  (left + w, height - 6, "end", str(x_hi)),
                  (left + w / 2, height - 6, "middle", "step"),
                  (12, top + h / 2, "middle", "loss")]
        for x, y, anchor, text in labels:
            parts.append(f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" fill="#444">'
                         f'{html.escape(text)}</text>')
    else:
        parts.append(f'<text x="{left + w / 2:.1f}" y="{top + h / 2:.1f}" text-anchor="middle" '
                     f'fill="#888">no loss yet</text>')
    parts.append("</svg>")
    return "".join(parts)


def progress_html(metrics: list, total: int, elapsed_s: float, done: bool = False) -> str:
    """The rich view: a <progress> bar, the latest numbers and the loss plot."""
    row = metrics[-1] if metrics else None
    step = row["step"] if row else 0
    if row is None:
        status = "starting (the first step compiles the kernels)"
    else:
        status = (f"loss {_num(row.get('loss'))} · grad norm {_num(row.get('grad_norm'), '.3g')} · "
                  f"lr {_num(row.get('lr'), '.2e')} · {_num(row.get('tokens_per_s'), '.0f')} tok/s · "
                  f"elapsed {_fmt_time(elapsed_s)} · "
                  + (("done" if step >= total else "stopped") if done else f"eta {_fmt_time(row.get('eta_s'))}"))
    return ('<div class="bitlora-progress" style="font:13px sans-serif">'
            f'<div><progress max="{max(total, 1)}" value="{min(step, max(total, 1))}" '
            f'style="width:300px;vertical-align:middle"></progress> '
            f'<b>step {step}/{total}</b> {html.escape(status)}</div>'
            f'{loss_svg(metrics, total)}</div>')


class NotebookProgress:
    """Shows a Trainer's progress as it trains, by chaining its `on_step` callback.

    mode: "html" (an IPython display updated in place), "text" (a printed line every
    `every` steps, and on the first and last), or None to pick html inside an IPython
    kernel and text elsewhere. `out` receives the text lines (default: print).
    HTML updates are throttled to one per `min_interval_s` (the final state is always
    shown by `finish()`)."""

    def __init__(self, trainer, mode: str | None = None, every: int | None = None,
                 min_interval_s: float = 0.3, out=None):
        if mode not in (None, "html", "text"):
            raise ValueError(f"mode: expected 'html', 'text' or None, got {mode!r}")
        self.trainer = trainer
        self.total = int(trainer.total_steps)
        self.mode = mode or ("html" if _ipython_shell() is not None else "text")
        self.every = every or max(1, self.total // 10)
        self.min_interval_s = min_interval_s
        self.out = out or (lambda line: print(line, flush=True))
        self.t0 = time.perf_counter()
        self._shown_at = 0.0
        self._chained = trainer.on_step
        self.handle = None
        trainer.on_step = self.update
        if self.mode == "html":
            from IPython.display import display
            self.handle = display(self._bundle(), raw=True, display_id=True)
        else:
            self.out(text_line(None, self.total, 0.0))

    def _bundle(self, done: bool = False) -> dict:
        metrics = self.trainer.metrics
        elapsed = time.perf_counter() - self.t0
        row = metrics[-1] if metrics else None
        return {"text/html": progress_html(metrics, self.total, elapsed, done),
                "text/plain": text_line(row, self.total, elapsed)}

    def update(self, row: dict) -> None:
        """The trainer's on_step: called once per optimizer step with its metrics row."""
        if self._chained is not None:
            self._chained(row)
        step, last = row["step"], row["step"] >= self.total
        if self.mode == "html":
            now = time.perf_counter()
            if last or now - self._shown_at >= self.min_interval_s:
                self._shown_at = now
                self.handle.update(self._bundle(), raw=True)
        elif step == 1 or last or step % self.every == 0:
            self.out(text_line(row, self.total, time.perf_counter() - self.t0))

    def finish(self) -> None:
        """Show the final state (after training ends or is stopped)."""
        if self.mode == "html":
            self.handle.update(self._bundle(done=True), raw=True)
        elif self.trainer.metrics and self.trainer.metrics[-1]["step"] < self.total:
            self.out(text_line(self.trainer.metrics[-1], self.total, time.perf_counter() - self.t0) + " (stopped)")

    def detach(self) -> None:
        """Give the trainer its previous on_step back."""
        if self.trainer.on_step == self.update:
            self.trainer.on_step = self._chained


def attach_display(trainer, mode: str | None = None, every: int | None = None, out=None) -> NotebookProgress:
    """Show `trainer`'s progress live from now on (see NotebookProgress); then call
    trainer.train() as usual. Returns the display; call its finish() at the end."""
    return NotebookProgress(trainer, mode=mode, every=every, out=out)


async def atrain_with_display(trainer, mode: str | None = None, every: int | None = None, out=None):
    """`await trainer.atrain()` with the live display, in any kernel: the form for cells
    that run in both a native kernel and a Pyodide one (examples/finetune_demo.ipynb)."""
    progress = attach_display(trainer, mode=mode, every=every, out=out)
    try:
        return await trainer.atrain()
    finally:
        progress.finish()
        progress.detach()


def train_with_display(trainer, mode: str | None = None, every: int | None = None, out=None):
    """trainer.train() with a live display: returns the metrics natively, an awaitable
    under Pyodide. Natively, an interrupt (Ctrl-C, or the notebook's stop button) stops
    training at the next step boundary — the trainer stays usable (save_adapter, train
    again) — and then the KeyboardInterrupt goes on."""
    if gpu.IN_BROWSER:
        return atrain_with_display(trainer, mode=mode, every=every, out=out)
    progress = attach_display(trainer, mode=mode, every=every, out=out)
    import asyncio
    import concurrent.futures
    # The loop runs on a helper thread (as gpu.run does inside Jupyter's running loop),
    # so that this thread can take the interrupt and ask the trainer to stop.
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bitlora-train")
    try:
        job = pool.submit(asyncio.run, trainer.atrain())
        try:
            while True:
                try:   # in short waits: a SIGINT the OS handed to the training thread only sets
                    return job.result(timeout=0.2)   # Python's flag; this thread must wake to act on it
                except concurrent.futures.TimeoutError:
                    pass
        except KeyboardInterrupt:
            trainer.stop()
            job.result()
            raise
    finally:
        pool.shutdown(wait=True)
        progress.finish()      # on this thread, in the cell's context: the saved output is final
        progress.detach()


# -- the web app in a cell -----------------------------------------------------------

# The app's server forbids framing by other origins (frame-ancestors 'self'); a
# notebook on this machine (Jupyter on localhost, VS Code's webview) must be allowed.
FRAME_ANCESTORS = ("'self' http://localhost:* http://127.0.0.1:* https://localhost:* "
                   "https://127.0.0.1:* vscode-webview:")

_server = None


def _start_server(host: str, port: int):
    from .app.server import Server
    return Server(host=host, port=port, quiet=True, frame_ancestors=FRAME_ANCESTORS).start()


def show_app(port: int = 0, height: int = 900, host: str = "127.0.0.1"):
    """Start the web app's server on loopback (once per kernel, in a background thread)
    and return an IFrame showing it; outside a notebook print and return its URL.
    port 0 picks a free port. The browser showing the notebook must be on this machine.
    """
    global _server
    if gpu.IN_BROWSER:
        raise RuntimeError("show_app starts a local server, which a Pyodide kernel cannot; "
                           "open the bitlora page itself (`bitlora serve`)")
    if _server is None:
        _server = _start_server(host, port)
    url = _server.url
    if _ipython_shell() is None:
        print(f"bitlora app: {url}")
        return url
    from IPython.display import IFrame
    return IFrame(url, width="100%", height=int(height))
