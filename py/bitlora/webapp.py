"""The web app's Python side: runs in the page's Web Worker under Pyodide.

The worker hands every message that is not raw code to `dispatch(msg)`; each
`type` has one handler here, and handlers answer with `post({...})`. A message with
an `id` is a request (the CLI's browser backend sends them): its answer, or the
`error` it ends in, carries the same `id`. Unknown types are rejected; a handler's
exception becomes an `error` message naming where it happened, and the app stays
usable. No numpy, no blocking: GPU work is awaited,
so pause/stop messages are handled while a training run is going.
"""
from __future__ import annotations

import array
import asyncio
import base64
import json
import os
import re
import shutil
import time
import traceback

from . import gpu
from .demo import MODEL_FILES as DEMO_FILES
from .ops import hello


def post(msg: dict) -> None:
    """Send a message to the page (the worker's global postMessage)."""
    import js
    from pyodide.ffi import to_js
    js.postMessage(to_js(msg, dict_converter=js.Object.fromEntries))


CKPT = "/bitlora-ckpt"          # IndexedDB-backed folder: checkpoints survive a reload
SAVE_INTERVAL_S = 60            # besides save_every and the first step: a reload loses about a minute at most


class Session:
    """What the page has loaded: one model, one dataset, at most one training run."""

    def __init__(self):
        self.model = None
        self.model_name = ""
        self.model_source = None  # {"source": "demo"} or a description of the user's file
        self.model_src = None     # what the model was read from (bytes, File, Blob): reloaded after a device loss
        self.device_lost = False  # the GPU device was lost: the next model load opens a fresh one
        self.saved_step = None    # step of the last checkpoint that reached the browser's storage
        self.records = None
        self.data_name = ""
        self.data_source = None   # "demo", "file" or "url": which radio the page checks
        self.longest = None       # tokens of the dataset's longest example (with the model's tokenizer)
        self.shortest = None      # the shortest cutoff that keeps every example's prompt and one answer token
        self.trainer = None
        self.task = None
        self.storage_ready = False
        self.cli_trainer = None   # the Trainer of a `bitlora train --backend browser` run
        self.cli_done = None      # set when its segment in flight (cli-train) has returned
        self.hold = None          # tests only: a Hold the page's training waits at
        self.generating = False   # a Generate is running (one at a time; training waits for it)
        self.stop_generating = False


class Hold:
    """Tests only, never set by the app: the page's ?test-hooks runs Python in the worker
    that sets `S.hold = Hold(step, micro)`. Training then waits as micro-batch `micro` of
    step `step` is about to start (steps before it landed) until `release()`, so a test's
    Pause, Stop, Export, reload or fault lands in mid-run whatever the device's speed.
    `await S.hold.reached.wait()` returns once training waits there."""

    def __init__(self, step: int, micro: int = 0):
        self.at = (step, micro)
        self.reached = asyncio.Event()
        self.released = asyncio.Event()

    async def __call__(self, info: dict) -> None:
        if (info["step"], info["micro"]) == self.at:
            self.reached.set()
            await self.released.wait()

    def release(self) -> str:
        self.released.set()
        return "released"


S = Session()


# -- reading what the page sends ------------------------------------------------------

def blob_bytes(blob) -> bytes:
    """The bytes of a JS File/Blob (a Worker may read synchronously)."""
    import js
    return js.Uint8Array.new(js.FileReaderSync.new().readAsArrayBuffer(blob)).to_bytes()


async def url_bytes(url: str) -> bytes:
    """The bytes of a URL (a dataset, the demo's files): webfetch.download's resuming and checks."""
    from .webfetch import download
    return blob_bytes(await download(url))


# -- handlers ------------------------------------------------------------------------

async def on_hello(msg: dict) -> None:
    """The GPU self-test: run a WGSL kernel on WebGPU and report the numbers; also
    send the settings' defaults (one source of truth: TrainConfig)."""
    from .config import TrainConfig
    post({"type": "defaults", "config": TrainConfig().to_dict()})
    try:
        dev = await gpu.get_device(fresh=S.device_lost)
    except gpu.GPUError as e:
        post({"type": "gpu-error", "text": str(e)})
        return
    n = int(msg.get("n", 8))
    x = dev.buffer(4 * n, "x", data=array.array("f", [float(i) for i in range(n)]))
    y = dev.buffer(4 * n, "y", data=array.array("f", [1.0] * n))
    await dev.prepare(hello.kernel_specs())
    hello.axpy(dev, 2.0, x, y, n)
    out = array.array("f")
    out.frombytes(await dev.read(y))
    post({"type": "hello", "adapter": dev.describe(), "info": dev.adapter_info,
          "limits": dev.limits, "x": [float(i) for i in range(n)], "y": list(out)})
    await on_checkpoint_query()


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
    S.longest = max(lengths) if lengths else None
    S.shortest = ds.shortest_cutoff() if lengths else None
    return {"type": "data-info", "name": S.data_name, "source": S.data_source, "total": len(records),
            "valid": len(records) - len(invalid), "invalid": invalid[:1000], "preview": preview,
            "histogram": _histogram(lengths) if lengths else None}


async def on_load_data(msg: dict) -> None:
    from .data import DataError, load_records
    from .formats import FormatError
    source = msg.get("source")
    if source == "demo":
        name, raw = "demo dataset", await url_bytes("/demo/alpaca_demo.json")
    elif source == "file":
        name, raw = str(msg.get("name") or "dataset"), blob_bytes(msg["file"])
    elif source == "url":
        url = str(msg["url"])
        name = url.split("?")[0].rstrip("/").split("/")[-1] or url
        try:
            raw = await url_bytes(url)
        except (OSError, FormatError) as e:     # no answer, an HTTP error, an HTML page, cut short
            post({"type": "error", "where": "dataset", "text": str(e)})
            return
    else:
        raise ValueError(f"unknown dataset source {source!r}")
    try:
        records = load_records(raw, name=name)
    except DataError as e:
        post({"type": "error", "where": "dataset", "text": str(e)})
        return
    S.records, S.data_name, S.data_source = records, name, source
    post(data_report())


# -- model ---------------------------------------------------------------------------

class _Progress:
    """Posts loading progress at most every 100 ms."""

    def __init__(self, what: str):
        self.what, self.last = what, 0.0

    def __call__(self, done, total, text=""):
        now = time.monotonic()
        if now - self.last >= 0.1 or done >= total:
            self.last = now
            post({"type": "progress", "what": self.what, "done": int(done), "total": int(total), "text": text})


MODEL_CACHE = "bitlora-models"     # Cache Storage: downloaded model files, keyed by URL


async def cached_download(url: str, progress, label: str):
    """A JS Blob of url's bytes: from the browser's Cache Storage, else downloaded with
    byte progress (webfetch.download: resumed if the connection drops) and kept there;
    then the cached copy, on disk, stands in for the downloaded one (a full cache only
    costs the next download)."""
    import js
    from .webfetch import download
    cache = await js.caches.open(MODEL_CACHE)
    hit = await cache.match(url)
    if hit:
        blob = await hit.blob()
        progress(blob.size, blob.size, f"{label} (from this browser's cache)")
        return blob
    blob = await download(url, progress, label)
    try:
        await cache.put(url, js.Response.new(blob))
        hit = await cache.match(url)
        if hit:
            blob = await hit.blob()
    except Exception as e:  # noqa: BLE001 - QuotaExceededError: the model still loads
        post({"type": "log", "level": "error", "text": f"{label}: not kept in the browser's cache ({e})"})
    return blob


async def hub_model(ref: dict, base: str, progress):
    """The files of a hub reference (hub.parse): a GGUF Blob, or {name: Blob} of a folder."""
    from . import hub
    files = {}
    for i, name in enumerate(ref["files"]):
        url = hub.file_url(ref["repo"], ref["revision"], name, base)
        try:
            files[name] = await cached_download(url, progress, f"{name} ({i + 1} of {len(ref['files'])})")
        except OSError as e:
            if name in hub.OPTIONAL and "HTTP 404" in str(e):
                continue
            if i == 0 and re.search(r": HTTP 40[134]\b", str(e)):    # the hub answers 401 for a repo it has not
                raise OSError(f"{e}: {base.rstrip('/')} has no repo {ref['repo']} with {name} at revision "
                              f"{ref['revision']} (or it is private or gated: this page cannot log in); "
                              f"check the repo id, the revision and the hub URL") from None
            raise
    return files[ref["files"][0]] if ref["files"][0].endswith(".gguf") else files


async def on_forget_models(msg: dict) -> None:
    import js
    gone = await js.caches.delete(MODEL_CACHE)
    post({"type": "model-cache", "text": "Cached models forgotten: the space is free again." if gone
          else "No models were cached in this browser."})


async def demo_model_files() -> dict:
    files = {}
    for name in DEMO_FILES:
        try:
            files[name] = await url_bytes(f"/demo/model/{name}")
        except OSError:
            if name in ("config.json", "model.safetensors"):
                raise
    return files


async def on_load_model(msg: dict) -> None:
    source = msg.get("source")
    if S.task is not None and not S.task.done():
        post({"type": "error", "where": "model", "text": "stop the training run before loading another model"})
        return
    progress = _Progress("model")
    try:
        if source == "demo":
            name, src = "bitlora demo model", await demo_model_files()
        elif source == "file":
            name, src = str(msg.get("name") or "model file"), msg["file"]
            if name.lower().endswith((".safetensors", ".json")):   # one file of a HF folder
                raise ValueError(f"{name}: a Hugging Face model is a folder (config.json, model.safetensors, "
                                  "tokenizer.json): pick it with Model folder; Model file takes a .gguf")
        elif source == "folder":
            paths = [str(n) for n in msg["names"]]
            names = [p.split("/")[-1] for p in paths]
            folder = paths[0].split("/")[0] if "/" in paths[0] else ""
            name, src = str(msg.get("folder") or folder or "model folder"), dict(zip(names, msg["files"]))
        elif source == "url":
            from . import hub
            url, base = str(msg["url"]).strip(), str(msg.get("hub") or hub.HUB)
            ref = hub.parse(url, base)
            progress(0, 1, "downloading…")
            if ref is not None:     # a repo id or a hub URL
                name = ref["repo"] + ("" if ref["revision"] == "main" else "@" + ref["revision"])
                src = await hub_model(ref, base, progress)
            else:
                name = url.split("?")[0].rstrip("/").split("/")[-1] or url
                src = await cached_download(url, progress, name)
        else:
            raise ValueError(f"unknown model source {source!r}")
    except (OSError, ValueError) as e:
        post({"type": "error", "where": "model", "text": str(e)})
        return
    await open_model(source, name, src, progress)


async def open_model(source: str, name: str, src, progress=None) -> bool:
    """Read a model onto the GPU (a fresh device after a loss) and describe it to the page."""
    from .formats import FormatError
    from .model import Model
    try:
        dev = await gpu.get_device(fresh=S.device_lost)
        S.device_lost = False
        model = await Model.load(src, progress=progress, device=dev)
    except (FormatError, OSError, ValueError, NotImplementedError, gpu.GPUError) as e:
        post({"type": "error", "where": "model", "text": str(e)})
        return False
    model.name = name
    for w in model.warnings:          # a default that differs between implementations (formats/gguf.py)
        post({"type": "log", "level": "warning", "text": f"{name}: {w}"})
    old, old_trainer = S.model, S.trainer
    S.model, S.model_name, S.trainer = model, name, None
    S.model_source, S.model_src = {"source": source, "name": name}, src
    for gone in (old_trainer, old):     # the replaced model's GPU memory (a lost device's is gone already)
        if gone is not None and getattr(gone, "model", gone).dev is model.dev:
            gone.close()
    c = model.config
    rows = [["Name", name], ["Architecture", "BitNet b1.58"], ["Parameters", f"{model.param_count() / 1e6:.2f} M"],
            ["Layers", c["num_hidden_layers"]], ["Hidden / FFN", f"{c['hidden_size']} / {c['intermediate_size']}"],
            ["Heads / KV heads", f"{c['num_attention_heads']} / {c['num_key_value_heads']}"],
            ["Vocabulary", c["vocab_size"]], ["Context", c.get("max_position_embeddings")]]
    post({"type": "model-info", "name": name, "source": source, "rows": [[str(a), str(b)] for a, b in rows]})
    if S.records is not None:
        post(data_report())
    return True


def _limit(model) -> int:
    """The largest buffer this device allows (WebGPU says nothing of its total memory)."""
    lim = model.dev.limits
    return min(lim.get("maxBufferSize", 1 << 30), lim.get("maxStorageBufferBindingSize", 1 << 30))


def _estimate(model, cfg) -> dict:
    return model.memory_estimate(cfg, seq_len=min(S.longest, cfg.cutoff_len) if S.longest else None)


# The tab's Python memory a run's checkpoints may take (Model.memory_estimate's "host"):
# Pyodide's heap is wasm32, at most 4 GiB, and Python, the model's tokenizer and the run's
# own data need the rest. A checkpoint past it ran the tab's Python out of memory.
HOST_LIMIT = 2 << 30


def _fits(model, cfg, budget) -> bool:
    est = _estimate(model, cfg)
    return est["largest"] <= _limit(model) and (not budget or est["total"] <= budget) and est["host"] <= HOST_LIMIT


def shortest_cutoff(model) -> int:
    """The shortest sensible cutoff: every example keeps its prompt and one token of its
    answer (the loaded dataset's longest prompt; before one is loaded, the template's)."""
    if S.shortest is not None:
        return S.shortest
    from .data import tokenize_record
    _, mask = tokenize_record(model.tokenizer, {"instruction": "", "input": "", "output": ""}, 1 << 30, False)
    return mask.index(1) + 1


def _mb(x: int) -> str:
    return f"{x / 2**20:.0f} MB" if x >= 10 * 2**20 else f"{x / 2**20:.2f} MB"


def _setting(key: str, value) -> str:
    words = {"lora_r": "LoRA rank", "lora_alpha": "LoRA alpha", "micro_batch_size": "micro-batch size",
             "grad_accum": "gradient accumulation", "cutoff_len": "cutoff length"}.get(key, key.replace("_", " "))
    if value is True:
        return words
    if isinstance(value, list):
        return f"{words} {' '.join(value)}"
    return f"{words} {value:g}" if isinstance(value, float) else f"{words} {value}"


def estimate_message(model, cfg, budget: int | None = None) -> dict:
    """The `estimate` message: the model's exact estimate of the run's GPU bytes (at the
    dataset's longest example when one is loaded), whether it fits the device's largest
    buffer and the user's memory budget, and if not, settings that do (`proposal`: the
    changes fit.fit_settings proposes)."""
    from .fit import changes, fit_settings, smallest
    est = _estimate(model, cfg)
    total, largest, limit = est["total"], est["largest"], _limit(model)
    fits = _fits(model, cfg, budget)
    text = (f"Training with these settings needs {_mb(total)} of GPU memory "
            f"(largest buffer {_mb(largest)}; this device allows {_mb(limit)} per buffer"
            + (f"; your budget is {_mb(budget)}" if budget else "") + ").")
    out = {"type": "estimate", "fits": fits, "bytes": total, "largest": largest, "limit": limit, "proposal": None}
    if not fits:
        why = (f"its largest buffer ({_mb(largest)}) is over the device's {_mb(limit)}" if largest > limit
               else f"{_mb(total)} is over your budget of {_mb(budget)}" if budget and total > budget
               else f"its checkpoints need about {_mb(est['host'])} of this tab's Python memory (the adapter "
                    f"and AdamW's moments, copied out of the GPU), over the {_mb(HOST_LIMIT)} it can use")
        text += f" Too big: {why}."
        floor = shortest_cutoff(model)
        fit = fit_settings(cfg, lambda c: _fits(model, c, budget), floor)
        if fit is None:
            least = smallest(cfg, floor)
            small = _estimate(model, least)
            text += (f" Nothing fits: even micro-batch 1, cutoff length {least.cutoff_len} (the shortest that "
                     f"keeps every prompt), gradient checkpointing and LoRA rank {least.lora_r} on "
                     f"{' '.join(least.target_modules)} need {_mb(small['total'])} (the model's weights alone "
                     f"{_mb(model.weight_bytes)}): "
                     + ("raise the budget, or choose a smaller model." if budget and small["total"] > budget
                        else "this device cannot train this model."))
        else:
            out["proposal"] = changes(cfg, fit)
            words = ", ".join(_setting(k, v) for k, v in out["proposal"].items())
            smaller = " (a smaller adapter: nothing else fits)" if "lora_r" in out["proposal"] or \
                "target_modules" in out["proposal"] else ""
            text += (f" Fits: {words} ({_mb(_estimate(model, fit)['total'])}){smaller}: press Fit to device "
                     f"(under Settings).")
    out["text"] = text
    return out


def _budget(msg: dict):
    b = msg.get("budget_mb")
    return int(float(b) * 2**20) if b else None


async def on_estimate(msg: dict) -> None:
    from .config import ConfigError, TrainConfig
    if S.model is None:
        return
    try:
        cfg = TrainConfig.from_dict(_given(msg.get("config")))
    except ConfigError as e:
        post({"type": "estimate", "text": f"Settings: {e}", "fits": False, "proposal": None})
        return
    post(estimate_message(S.model, cfg, _budget(msg)))


# -- training --------------------------------------------------------------------------

async def _syncfs(populate: bool) -> None:
    """Copy the IndexedDB-backed folder from (populate) or to the browser's storage."""
    import pyodide_js
    from pyodide.ffi import create_once_callable
    fut = asyncio.get_event_loop().create_future()

    def done(err=None):
        if err:   # an IndexedDB DOMException (QuotaExceededError, ...): its name and last line
            text = str(getattr(err, "message", "") or err).strip().splitlines() or [""]
            fut.set_exception(OSError(f"browser storage: {getattr(err, 'name', 'Error')}: {text[-1]}"))
        else:
            fut.set_result(None)
    pyodide_js.FS.syncfs(populate, create_once_callable(done))
    await fut


async def storage() -> bool:
    """Mount the checkpoint folder on IndexedDB once; False where that is unavailable."""
    if not S.storage_ready:
        try:
            import pyodide_js
            os.makedirs(CKPT, exist_ok=True)
            pyodide_js.FS.mount(pyodide_js.FS.filesystems.IDBFS, {}, CKPT)
            await _syncfs(True)
            S.storage_ready = True
        except Exception as e:  # noqa: BLE001 - no IndexedDB (private mode): train without checkpoints
            post({"type": "log", "level": "error", "text": f"checkpoints unavailable: {e}"})
            return False
    return True


def _given(raw) -> dict:
    """The page's settings without the empty fields (None, or JS null: each is the default)."""
    return {k: v for k, v in dict(raw or {}).items() if v is not None and v is not JSNULL}


def _training_config(raw: dict):
    from .config import TrainConfig
    raw = _given(raw)
    if not raw.get("save_every"):
        raw["save_every"] = 10     # in the browser a run is always checkpointed: reloads lose nothing
    raw.update({"model": "browser", "data": "browser", "out": CKPT, "backend": "browser"})
    return TrainConfig.from_dict(raw)


def _finite(x):
    """None for NaN/Inf (a skipped step's loss or norm): charts show a gap, JSON stays valid."""
    return x if isinstance(x, (int, float)) and x - x == 0 else None


def _step_message(row: dict, total: int) -> dict:
    msg = {"type": "step", "total_steps": total, **{k: row[k] for k in ("step", "loss", "grad_norm", "lr", "tokens",
                                                                       "tokens_per_s", "eta_s", "skipped")}}
    msg["loss"], msg["grad_norm"] = _finite(msg["loss"]), _finite(msg["grad_norm"])
    return msg


async def _lost(dev) -> bool:
    """Whether the device is gone. A destroyed device rejects pending reads before its
    `lost` promise settles, so give that promise a moment."""
    for _ in range(20):
        if isinstance(dev.backend.take_error(), gpu.DeviceLost):
            return True
        await asyncio.sleep(0.05)
    return False


async def _store_checkpoint(trainer, step: int) -> None:
    """The trainer's on_checkpoint: copy the checkpoint just written to the browser's
    storage. A failure (storage full, no IndexedDB) is reported and training goes on.
    IDBFS copies the changed files in one IndexedDB transaction (a quota error or a
    reload aborts it whole); even where only some files get through, the state file is
    one entry, old or new, and the resume offer takes the step from it."""
    t0 = time.monotonic()
    try:
        with open(CKPT + "/session.json", "w") as f:
            json.dump({"model": S.model_source, "data_name": S.data_name, "step": step,
                       "total_steps": trainer.total_steps, "saved_at": time.strftime("%Y-%m-%d %H:%M:%S"),
                       "saved_unix": time.time()}, f)     # the page shows it in the user's time zone
        await _syncfs(False)
    except Exception as e:  # noqa: BLE001 - quota exceeded, IndexedDB gone: keep training
        kept = f"the last saved one is step {S.saved_step}" if S.saved_step else "none is saved yet"
        post({"type": "checkpoint", "saved": False, "step": step,
              "text": f"Checkpoint at step {step} not saved ({e}); the browser's "
                      f"storage may be full. Training continues; {kept}."})
        return
    S.saved_step = step
    post({"type": "checkpoint", "saved": True, "step": step, "seconds": time.monotonic() - t0})


async def _run_training(trainer, resumed: bool) -> None:
    if S.trainer is not None and S.trainer is not trainer and not S.device_lost:
        S.trainer.close()          # the previous run's GPU buffers (its adapter was exportable until now)
    S.trainer = trainer
    total = trainer.total_steps
    trainer.checkpoint_dir = CKPT + "/state"
    can_save = await storage()
    S.saved_step = None
    trainer.on_step = lambda row: post(_step_message(row, total))

    def on_micro(m):
        post({"type": "micro", "total_steps": total, **m})
        return S.hold(m) if S.hold is not None else None     # tests only: a Hold waits here

    trainer.on_micro = on_micro
    trainer.keep_adapter = True      # Export answers from the last step's copy, even mid-step
    trainer.save_first, trainer.save_interval_s = True, SAVE_INTERVAL_S   # a reload loses little
    if can_save:
        with open(CKPT + "/records.json", "w") as f:   # reaches IndexedDB with the first checkpoint
            json.dump(S.records, f)
        trainer.on_checkpoint = lambda step: _store_checkpoint(trainer, step)
    else:
        trainer.config.save_every = 0
    post({"type": "train-state", "state": "running", "has_adapter": False,
          "history": trainer.metrics if resumed else None})
    try:
        await trainer.setup()
        if resumed:
            S.saved_step = trainer.step
            post({"type": "train-state", "state": "running", "history": trainer.metrics, "has_adapter": True})
        await trainer.atrain()
        state = "stopped" if trainer.control.stopped else "done"
        if can_save and trainer.metrics and trainer.step != S.saved_step:
            await trainer.save_checkpoint()
        text = (f"Stopped after step {trainer.step} of {total}: Export adapter saves the adapter of step "
                f"{trainer.step}, or press Train to start again." if state == "stopped" and trainer.step else
                "Stopped before step 1 was done: press Train to start again." if state == "stopped" else
                f"Training finished ({trainer.step} steps): Export adapter to download it, or try it below.")
        post({"type": "train-state", "state": state, "text": text,   # a resumed, finished run has no new
              "has_adapter": trainer.adapter_snapshot is not None or (trainer.step > 0 and trainer.lora is not None)})
    except Exception as e:  # noqa: BLE001 - the app stays usable
        if isinstance(e, gpu.OutOfMemory):   # the text names what did not fit and settings that would
            post({"type": "train-state", "state": "failed", "has_adapter": trainer.lora is not None, "text": str(e)})
            post({"type": "error", "where": "training", "text": str(e)})
            await on_checkpoint_query("Training ran out of GPU memory.")
            return
        if isinstance(e, gpu.GPUError) and (isinstance(e, gpu.DeviceLost) or await _lost(trainer.model.dev)):
            S.device_lost, S.trainer = True, None
            done = trainer.metrics[-1]["step"] if trainer.metrics else 0
            post({"type": "log", "level": "error", "text": f"the GPU device was lost after step {done}: {e}"})
            post({"type": "train-state", "state": "failed", "has_adapter": False,
                  "text": f"The GPU device was lost after step {done}."})
            if not await on_checkpoint_query("The GPU device was lost during training."):
                post({"type": "gpu-error", "text": "The GPU device was lost during training, before any "
                                                   "checkpoint was saved: press Train to start again."})
            return
        post({"type": "log", "level": "error", "text": traceback.format_exc()})
        post({"type": "error", "where": "training", "text": f"{type(e).__name__}: {e}"})
        post({"type": "train-state", "state": "failed",
              "has_adapter": S.trainer is not None and trainer.adapter_snapshot is not None})


async def on_train(msg: dict) -> None:
    from .config import ConfigError
    from .data import DataError
    from .train import Trainer
    if S.task is not None and not S.task.done():
        post({"type": "error", "where": "training", "text": "a training run is already going"})
        return
    if S.generating:
        post({"type": "error", "where": "training", "text": "wait for Generate to finish (or stop it)"})
        return
    if S.model is None:       # the defaults: what the page's radios show before anything is chosen
        post({"type": "train-state", "state": "starting", "text": "Loading the demo model…"})
        await on_load_model({"source": "demo"})
    if S.records is None and S.model is not None:
        post({"type": "train-state", "state": "starting", "text": "Loading the demo dataset…"})
        await on_load_data({"source": "demo"})
    if S.model is None or S.records is None:
        post({"type": "train-state", "state": "idle", "text": "Could not load the model or the dataset (see above)."})
        return
    try:
        cfg = _training_config(msg.get("config"))
        est = estimate_message(S.model, cfg, _budget(msg))
        if not est["fits"]:
            post({"type": "train-state", "state": "idle"})   # first: the error stays in the status
            post({"type": "error", "where": "training", "text": "not started: " + est["text"]})
            post(est)
            return
        trainer = Trainer(S.model, S.records, cfg)
    except (ConfigError, DataError, ValueError) as e:
        post({"type": "train-state", "state": "idle"})
        post({"type": "error", "where": "settings", "text": str(e)})
        return
    except Exception as e:  # noqa: BLE001 - anything else: said, and the page back to idle (not stuck "starting")
        post({"type": "log", "level": "error", "text": traceback.format_exc()})
        post({"type": "train-state", "state": "idle"})
        post({"type": "error", "where": "training", "text": f"not started: {type(e).__name__}: {e}"})
        return
    S.task = asyncio.ensure_future(_run_training(trainer, resumed=False))


async def on_pause(msg: dict) -> None:
    if S.trainer is not None:
        S.trainer.pause()
        post({"type": "train-state", "state": "paused"})


async def on_resume(msg: dict) -> None:
    if S.trainer is not None:
        S.trainer.resume()
        post({"type": "train-state", "state": "running"})


async def on_stop(msg: dict) -> None:
    if S.trainer is not None and S.task is not None and not S.task.done():
        S.trainer.stop()
        post({"type": "train-state", "state": "stopping",
              "text": f"Stopping after the current micro-batch (step {S.trainer.step + 1} is not kept)…"})


async def on_checkpoint_query(reason: str = "") -> bool:
    """Offer to resume the stored run (after a reload, or after the GPU was lost). The
    offer names the step of the state file itself, which must load."""
    from .formats.state import load_state
    if not await storage():
        return False
    try:
        with open(CKPT + "/session.json") as f:
            info = json.load(f)
        st = load_state(CKPT + "/state")
    except (OSError, ValueError) as e:
        if os.path.exists(CKPT + "/session.json"):
            post({"type": "log", "level": "error", "text": f"the stored checkpoint is unreadable: {e}"})
        return False
    post({"type": "checkpoint", "available": True, "step": st.step, "reason": reason,
          "total_steps": info.get("total_steps"), "saved_at": info.get("saved_at"),
          "saved_unix": info.get("saved_unix"), "model": (info.get("model") or {}).get("name"),
          "data": info.get("data_name")})
    return True


async def on_resume_checkpoint(msg: dict) -> None:
    """Continue the stored run: reload its model (the demo, or the user's file still held
    from this visit, onto a fresh device after a loss) and its dataset, then train
    from the checkpoint."""
    from .formats.state import load_state
    from .train import Trainer
    if not await storage():
        post({"type": "error", "where": "checkpoint", "text": "browser storage is unavailable"})
        return
    if S.task is not None and not S.task.done():
        post({"type": "error", "where": "checkpoint", "text": "a training run is already going"})
        return
    with open(CKPT + "/session.json") as f:
        info = json.load(f)
    with open(CKPT + "/records.json") as f:
        S.records = json.load(f)
    S.data_name = info.get("data_name") or "dataset"
    post(data_report())
    src = info.get("model") or {}
    if S.device_lost or S.model is None or S.model_source != src:
        if S.model_src is not None and S.model_source == src:
            await open_model(src.get("source"), src.get("name"), S.model_src)
        elif src.get("source") == "demo":
            await on_load_model({"source": "demo"})
        if S.device_lost or S.model is None or S.model_source != src:
            post({"type": "train-state", "state": "idle"})
            if src.get("source") != "demo" and S.model_source != src:
                post({"type": "error", "where": "checkpoint",
                      "text": f"load the model {src.get('name')!r} again, then press Resume training"})
            return
    st = load_state(CKPT + "/state")
    cfg = _training_config({k: v for k, v in st.config.items() if k not in ("resume", "init_adapter")})
    cfg.resume = CKPT + "/state"
    trainer = Trainer(S.model, S.records, cfg)
    S.task = asyncio.ensure_future(_run_training(trainer, resumed=True))


# -- try it, export ------------------------------------------------------------------------

GEN_POST_S = 0.05   # at most this often a `gen-token` per answer: the page shows tokens as they come


def _streamer(which: str, tokenizer):
    """on_token for agenerate: posts `gen-token` {which, text so far, tokens, tokens_per_s}."""
    state = {"t0": None, "last": 0.0}

    def on_token(tok, ids):
        now = time.monotonic()
        if state["t0"] is None:
            state["t0"] = now
        if now - state["last"] < GEN_POST_S:
            return
        state["last"] = now
        tps = (len(ids) - 1) / (now - state["t0"]) if len(ids) > 1 and now > state["t0"] else None
        text = tokenizer.decode(ids, skip_special_tokens=True) if tokenizer is not None else ""
        post({"type": "gen-token", "which": which, "text": text, "tokens": len(ids), "tokens_per_s": tps})
    return on_token


async def on_generate(msg: dict) -> None:
    """Generate with the base model, then with the adapter (when there is one), streaming
    each answer's tokens (`gen-token`) and ending with `generated`; `stop-generate` ends
    the answer being generated and skips the rest."""
    from .data import format_prompt
    if S.model is None:
        post({"type": "error", "where": "generate", "text": "load a model first"})
        return
    if S.generating:
        post({"type": "error", "where": "generate", "text": "a generation is already going"})
        return
    prompt = format_prompt({"instruction": str(msg.get("instruction") or ""), "input": str(msg.get("input") or ""),
                            "output": ""})
    n = max(1, min(int(msg.get("max_new_tokens") or 48), 1024))
    temp = float(msg.get("temperature") or 0.0)
    S.generating, S.stop_generating = True, False
    out = {"type": "generated", "base": "", "adapted": None, "stopped": False}
    try:
        kw = dict(max_new_tokens=n, temperature=temp, seed=0, should_stop=lambda: S.stop_generating)
        try:
            base = await S.model.agenerate(prompt, on_token=_streamer("base", S.model.tokenizer), **kw)
        except ValueError as e:      # a prompt that fills the model's context, a lone surrogate
            post({"type": "error", "where": "generate", "text": str(e).removeprefix("generate: ")})
            return
        out.update(base=base.text, base_tokens=len(base.ids), base_tokens_per_s=base.tokens_per_s(),
                   warning=base.warning)   # fewer new tokens than asked: the model's context is full
        if S.trainer is not None and S.trainer.lora is not None and not S.stop_generating:
            adapted = await S.trainer.agenerate(prompt, on_token=_streamer("adapted", S.model.tokenizer), **kw)
            out.update(adapted=adapted.text, adapted_tokens=len(adapted.ids),
                       adapted_tokens_per_s=adapted.tokens_per_s())
        out["stopped"] = S.stop_generating
    finally:
        S.generating = False
    post(out)


async def on_stop_generate(msg: dict) -> None:
    S.stop_generating = True


async def on_export(msg: dict) -> None:
    import js
    if S.trainer is None or S.trainer.lora is None:
        post({"type": "error", "where": "export", "text": "train first: there is no adapter yet"})
        return
    out = "/tmp/bitlora-export"
    if S.trainer.adapter_snapshot is not None:
        step = S.trainer.save_adapter_snapshot(out)     # no GPU wait: answers while a step runs
    else:                                               # a resumed run before its first new step
        await S.trainer.asave_adapter(out)
        step = S.trainer.step
    files = []
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        with open(os.path.join(out, name), "rb") as f:
            data = f.read()
        arr = js.Uint8Array.new(len(data))
        arr.assign(data)
        files.append({"name": name, "bytes": arr})
    post({"type": "export", "files": files, "step": step})


# -- `bitlora train --backend browser` (app/train_browser.py) ------------------------------
# The CLI sends its files base64-encoded and runs the Trainer one segment at a time:
# each `cli-train` trains to the next checkpoint, whose files go back to be written
# in OUT/checkpoint; the last one answers with the adapter's files. Metrics rows
# travel as JSON text: through JS a float 0.0 would arrive as the int 0, and
# metrics.jsonl is written as the native backend writes it.

CLI = "/tmp/bitlora-cli"        # the CLI run's files: init-adapter/, resume/, checkpoint/, adapter/


def _unpack(files: dict, folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(base64.b64decode(data))
    return folder


def _pack(folder: str) -> dict:
    files = {}
    for name in sorted(os.listdir(folder)):
        if os.path.isfile(os.path.join(folder, name)):
            with open(os.path.join(folder, name), "rb") as f:
                files[name] = base64.b64encode(f.read()).decode()
    return files


async def on_cli_setup(msg: dict) -> None:
    """{model_files, model_name, data, config, init_adapter, resume} -> `cli-ready`: load
    the model and data, build the Trainer, load --resume state, and answer what the CLI
    prints; a ValueError there (a bad checkpoint, other data) comes back as `error`."""
    from .data import load_records
    from .model import Model
    from .train import Trainer
    shutil.rmtree(CLI, ignore_errors=True)       # nothing left from an earlier run
    files = msg.get("model_files")
    if files is None:
        src = await demo_model_files()
    else:
        src = {name: base64.b64decode(data) for name, data in files.items()}
        if len(src) == 1 and next(iter(src)).endswith(".gguf"):
            src = next(iter(src.values()))
    model = await Model.load(src, device=await gpu.get_device())
    model.name = msg["model_name"]
    data = msg.get("data")
    if data is None:
        records = load_records(await url_bytes("/demo/alpaca_demo.json"), name="alpaca_demo.json")
    else:
        records = load_records(base64.b64decode(data["bytes"]), name=data["name"])
    config = dict(msg["config"])
    if msg.get("init_adapter") is not None:
        config["init_adapter"] = _unpack(msg["init_adapter"], CLI + "/init-adapter")
    if msg.get("resume") is not None:
        config["resume"] = _unpack(msg["resume"], CLI + "/resume")   # the training state only
    trainer = Trainer(model, records, config)
    trainer.checkpoint_dir = CLI + "/checkpoint"
    trainer.on_step = lambda row: post({"type": "cli-step", "row": json.dumps(row)})
    S.cli_trainer = trainer
    try:
        await trainer.setup()
        error = None
    except ValueError as e:
        error = str(e)
    post({"type": "cli-ready", "id": msg.get("id"), "error": error, "step": trainer.step,
          "total_steps": trainer.total_steps, "name": model.name, "device": model.dev.describe(),
          "records": len(trainer.dataset), "skipped": [list(x) for x in trainer.dataset.invalid],
          "warnings": model.warnings})


async def on_cli_train(msg: dict) -> None:
    """-> `cli-trained`: train to the next checkpoint (or the end); answer the new metrics
    rows and the checkpoint's files, or, once the run is over, the adapter's files."""
    trainer = S.cli_trainer
    every, seen = trainer.config.save_every, len(trainer.metrics)
    until = (trainer.step // every + 1) * every if every else None
    S.cli_done = asyncio.Event()
    try:
        await trainer.atrain(until_step=until)
    finally:
        S.cli_done.set()
    if trainer.control.stopped:   # cli-stop answers for this segment
        return
    out = {"type": "cli-trained", "id": msg.get("id"), "step": trainer.step, "rows": [json.dumps(r) for r in trainer.metrics[seen:]]}
    if trainer.step == until:          # a checkpoint was written at this step
        out["checkpoint"] = _pack(trainer.checkpoint_dir)
    else:
        await trainer.asave_adapter(CLI + "/adapter")
        out["adapter"] = _pack(CLI + "/adapter")
    post(out)


async def on_cli_stop(msg: dict) -> None:
    """-> `cli-stopped`: the CLI's Ctrl+C. Stop the run at the end of the step in flight
    and answer its metrics rows and the adapter so far (None before any step finished)."""
    trainer = S.cli_trainer
    adapter = None
    if trainer is not None:
        trainer.stop()
        if S.cli_done is not None:
            await S.cli_done.wait()
        if trainer.metrics:
            await trainer.asave_adapter(CLI + "/adapter")
            adapter = _pack(CLI + "/adapter")
    post({"type": "cli-stopped", "id": msg.get("id"), "step": trainer.step if trainer else 0,
          "rows": [json.dumps(r) for r in trainer.metrics] if trainer else [], "adapter": adapter})


HANDLERS = {
    "hello": on_hello,
    "load-data": on_load_data,
    "load-model": on_load_model,
    "estimate": on_estimate,
    "train": on_train,
    "pause": on_pause,
    "resume": on_resume,
    "stop": on_stop,
    "forget-models": on_forget_models,
    "resume-checkpoint": on_resume_checkpoint,
    "generate": on_generate,
    "stop-generate": on_stop_generate,
    "export": on_export,
    "cli-setup": on_cli_setup,
    "cli-train": on_cli_train,
    "cli-stop": on_cli_stop,
}


try:   # JS null through pyodide.toPy: not None, but pyodide's jsnull (a cleared number field sends one)
    from pyodide.ffi import jsnull as JSNULL
except ImportError:   # natively nothing is
    JSNULL = object()


async def dispatch(msg) -> None:
    kind = msg.get("type")
    handler = HANDLERS.get(kind)
    answer = {"id": msg["id"]} if "id" in msg else {}   # a request's error answers it
    if handler is None:
        post({"type": "error", "where": "worker", "text": f"unknown message type {kind!r}", **answer})
        return
    try:
        await handler(msg)
    except Exception as e:  # noqa: BLE001 - every failure becomes a message; the app goes on
        post({"type": "log", "level": "error", "text": traceback.format_exc()})
        post({"type": "error", "where": kind.split("-")[-1], "text": f"{type(e).__name__}: {e}", **answer})
