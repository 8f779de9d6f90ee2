"""The web app's Python side: runs in the page's Web Worker under Pyodide.

The worker hands every message that is not raw code to `dispatch(msg)`; each
`type` has one handler here, and handlers answer with `post({...})`. Unknown types
are rejected; a handler's exception becomes an `error` message naming where it
happened, and the app stays usable. No numpy, no blocking: GPU work is awaited,
so pause/stop messages are handled while a training run is going.
"""
from __future__ import annotations

import array
import traceback

from . import gpu
from .ops.hello import axpy


def post(msg: dict) -> None:
    """Send a message to the page (the worker's global postMessage)."""
    import js
    from pyodide.ffi import to_js
    js.postMessage(to_js(msg, dict_converter=js.Object.fromEntries))


class Session:
    """What the page has loaded: one model, one dataset, at most one training run."""

    def __init__(self):
        self.model = None
        self.model_name = ""
        self.records = None
        self.data_name = ""
        self.trainer = None


S = Session()


# -- reading what the page sends ------------------------------------------------------

def blob_bytes(blob) -> bytes:
    """The bytes of a JS File/Blob (a Worker may read synchronously)."""
    import js
    return js.Uint8Array.new(js.FileReaderSync.new().readAsArrayBuffer(blob)).to_bytes()


async def url_bytes(url: str) -> bytes:
    from pyodide.http import pyfetch
    resp = await pyfetch(url)
    if not resp.ok:
        raise OSError(f"{url}: HTTP {resp.status}")
    return await resp.bytes()


# -- handlers ------------------------------------------------------------------------

async def on_hello(msg: dict) -> None:
    """The GPU self-test: run a WGSL kernel on WebGPU and report the numbers; also
    send the settings' defaults (one source of truth: TrainConfig)."""
    from .config import TrainConfig
    post({"type": "defaults", "config": TrainConfig().to_dict()})
    try:
        dev = await gpu.get_device()
    except gpu.GPUError as e:
        post({"type": "gpu-error", "text": str(e)})
        return
    n = int(msg.get("n", 8))
    x = dev.buffer(4 * n, "x", data=array.array("f", [float(i) for i in range(n)]))
    y = dev.buffer(4 * n, "y", data=array.array("f", [1.0] * n))
    await axpy(dev, 2.0, x, y, n)
    out = array.array("f")
    out.frombytes(await dev.read(y))
    post({"type": "hello", "adapter": dev.describe(), "info": dev.adapter_info,
          "limits": dev.limits, "x": [float(i) for i in range(n)], "y": list(out)})


def _histogram(lengths: list, bins: int = 20) -> dict:
    lo, hi = min(lengths), max(lengths)
    width = max(1, -(-(hi - lo + 1) // bins))
    counts = [0] * (-(-(hi - lo + 1) // width))
    for n in lengths:
        counts[(n - lo) // width] += 1
    return {"edges": [lo + i * width for i in range(len(counts))], "counts": counts}


def data_report() -> dict:
    """Counts, preview, invalid records and (with a tokenizer) the token-length histogram."""
    from .data import check_record
    records = S.records
    invalid, lengths = [], []
    tok = getattr(S.model, "tokenizer", None)
    ds = None
    if tok is not None:
        from .data import Dataset, DataError
        try:
            ds = Dataset(records, tok, cutoff_len=100_000)
        except DataError:
            ds = None
    if ds is not None:
        invalid = [{"index": i, "reason": why} for i, why in ds.invalid]
        lengths = [len(ids) for _, ids, _ in ds.examples]
    else:
        for i, rec in enumerate(records):
            why = check_record(rec)
            if why is not None:
                invalid.append({"index": i, "reason": why})
    preview = []
    for i, rec in enumerate(records[:20]):
        if isinstance(rec, dict):
            preview.append({"index": i, **{k: str(rec.get(k) if rec.get(k) is not None else "")
                                           for k in ("instruction", "input", "output")}})
    return {"type": "data-info", "name": S.data_name, "total": len(records),
            "valid": len(records) - len(invalid), "invalid": invalid[:1000], "preview": preview,
            "histogram": _histogram(lengths) if lengths else None}


async def on_load_data(msg: dict) -> None:
    from .data import DataError, load_records
    source = msg.get("source")
    if source == "demo":
        name, raw = "demo dataset", await url_bytes("/demo/alpaca_demo.json")
    elif source == "file":
        name, raw = str(msg.get("name") or "dataset"), blob_bytes(msg["file"])
    elif source == "url":
        name = str(msg["url"])
        raw = await url_bytes(name)
    else:
        raise ValueError(f"unknown dataset source {source!r}")
    try:
        records = load_records(raw, name=name)
    except DataError as e:
        post({"type": "error", "where": "dataset", "text": str(e)})
        return
    S.records, S.data_name = records, name
    post(data_report())


HANDLERS = {
    "hello": on_hello,
    "load-data": on_load_data,
}


async def dispatch(msg) -> None:
    kind = msg.get("type")
    handler = HANDLERS.get(kind)
    if handler is None:
        post({"type": "error", "where": "worker", "text": f"unknown message type {kind!r}"})
        return
    try:
        await handler(msg)
    except Exception as e:  # noqa: BLE001 - every failure becomes a message; the app goes on
        post({"type": "log", "level": "error", "text": traceback.format_exc()})
        post({"type": "error", "where": kind.split("-")[-1], "text": f"{type(e).__name__}: {e}"})
