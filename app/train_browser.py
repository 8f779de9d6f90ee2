"""`bitlora train --backend browser`: the same training, run headless inside Pyodide in
Chromium (real WebGPU) through Playwright, writing the same outputs as the native
backend: OUT/adapter_config.json, OUT/adapter_model.safetensors, OUT/metrics.jsonl,
and with --save-every N the checkpoint folder OUT/checkpoint.

The model, data, --init-adapter and --resume files are read here and handed to the
worker (the demo model is fetched by the page from the local server), so this suits
models that fit in memory twice. The worker keeps its Trainer between calls and runs
it one segment at a time: each segment trains up to the next checkpoint, which comes
back here as file bytes and is written to OUT/checkpoint atomically — the same files
train.py writes natively, so either backend resumes the other's checkpoints.
Progress lines and metrics.jsonl rows are written as the worker reports each step.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import sys

STATE = "_bitlora_cli_train"      # module in the worker's sys.modules that keeps the Trainer
CKPT = "/tmp/bitlora-ckpt"        # checkpoints inside the worker's file system
RESUME = "/tmp/bitlora-resume"    # --resume files, written there

# Load the model and data, build the Trainer, load --resume state; answer what the
# host prints. A ValueError (bad checkpoint, other data) comes back as {"error"}.
SETUP = """
import base64, json, os, shutil, sys, types
from bitlora import gpu
from bitlora.model import Model
from bitlora.train import Trainer
from bitlora.webapp import demo_model_files
args = json.loads({args!r})

for d in ({ckpt!r}, {resume!r}, "/tmp/bitlora-init-adapter", "/tmp/bitlora-out"):
    shutil.rmtree(d, ignore_errors=True)           # nothing left from an earlier run

def unpack(files, where):
    os.makedirs(where, exist_ok=True)
    for k, v in files.items():
        with open(os.path.join(where, k), "wb") as f:
            f.write(base64.b64decode(v))
    return where

files = args["model_files"]
src = await demo_model_files() if files is None else {{k: base64.b64decode(v) for k, v in files.items()}}
if isinstance(src, dict) and len(src) == 1 and next(iter(src)).endswith(".gguf"):
    src = next(iter(src.values()))
model = await Model.load(src, device=await gpu.get_device())
model.name = args["model_name"]
data = args["records"]
if data is None:
    from bitlora.webapp import url_bytes
    from bitlora.data import load_records
    data = load_records(await url_bytes("/demo/alpaca_demo.json"), name="alpaca_demo.json")
config = args["config"]
if args["init_adapter"] is not None:
    config["init_adapter"] = unpack(args["init_adapter"], "/tmp/bitlora-init-adapter")
if args["resume"] is not None:
    config["resume"] = unpack(args["resume"], {resume!r})   # holds the training state only
trainer = Trainer(model, data, config)
trainer.checkpoint_dir = {ckpt!r}
trainer.on_step = lambda row: print("BITLORA_STEP " + json.dumps(row))
trainer.on_checkpoint = lambda step: trainer.stop()      # end the segment: the host saves it
try:
    await trainer._setup()
    error = None
except ValueError as e:
    error = str(e)
sys.modules[{state!r}] = types.SimpleNamespace(trainer=trainer)
json.dumps({{"error": error, "step": trainer.step, "total_steps": trainer.total_steps, "name": model.name,
            "device": model.dev.describe(), "records": len(trainer.dataset),
            "skipped": [list(x) for x in trainer.dataset.invalid]}})
"""

# Train to the next checkpoint (or the end); answer the new metrics rows and the
# checkpoint's files, or, at the end, the adapter's files.
SEGMENT = """
import base64, json, os, sys
from bitlora.train import Control
trainer = sys.modules[{state!r}].trainer
seen = len(trainer.metrics)
trainer.control = Control()
await trainer.atrain()
read = lambda d: {{n: base64.b64encode(open(os.path.join(d, n), "rb").read()).decode()
                  for n in sorted(os.listdir(d)) if os.path.isfile(os.path.join(d, n))}}
if trainer.control.stopped:
    out = {{"checkpoint": read({ckpt!r}), "step": trainer.step}}
else:
    await trainer.asave_adapter("/tmp/bitlora-out")
    out = {{"adapter": read("/tmp/bitlora-out")}}
json.dumps(dict(out, rows=trainer.metrics[seen:]))
"""


def _files(path: str) -> dict:
    p = pathlib.Path(path)
    items = [q for q in p.iterdir() if q.is_file()] if p.is_dir() else [p]
    return {q.name: base64.b64encode(q.read_bytes()).decode() for q in items}


def _write_files(folder: str, files: dict) -> None:
    """Write base64 files into folder, each atomically; the training state last, so a
    reader never pairs a new adapter with an old state it is not."""
    from bitlora.formats.safetensors import write_atomic
    from bitlora.formats.state import STATE_FILE
    os.makedirs(folder, exist_ok=True)
    for name in sorted(files, key=lambda n: n == STATE_FILE):
        write_atomic(os.path.join(folder, name), base64.b64decode(files[name]))


def _model_name(model: str) -> str:
    """What the native backend records as base_model_name_or_path."""
    from bitlora.formats import source_name
    if model == "demo":
        from bitlora.demo import MODEL_DIR
        return source_name(str(MODEL_DIR))
    return source_name(model)


def train_in_browser(cfg, session=None, on_checkpoint=None) -> int:
    """Run `cfg` (a TrainConfig with backend "browser") in Chromium; returns the exit
    code. session: a started BrowserSession to use (else one is started and closed);
    on_checkpoint(step) is called after each checkpoint is written to OUT/checkpoint."""
    from bitlora.data import DataError, load_records
    from bitlora.formats import state as checkpoint_state
    from bitlora.metrics import MetricsWriter

    from .browser import BrowserError, BrowserSession

    try:
        model_files = None if cfg.model == "demo" else _files(cfg.model)
        records = None if cfg.data == "demo" else load_records(cfg.data)
        init = _files(cfg.init_adapter) if cfg.init_adapter else None
        resume = None
        if cfg.resume:
            checkpoint_state.load_state(cfg.resume)          # fail here, before Chromium starts
            state = (os.path.join(cfg.resume, checkpoint_state.STATE_FILE) if os.path.isdir(cfg.resume)
                     else cfg.resume)
            resume = {checkpoint_state.STATE_FILE: base64.b64encode(pathlib.Path(state).read_bytes()).decode()}
    except (OSError, DataError, ValueError) as e:
        return _fail(str(e))
    # all of cfg goes along (checkpoints record it), with the worker's own paths for these two
    config = {k: v for k, v in cfg.to_dict().items() if k not in ("init_adapter", "resume")}
    args = json.dumps({"model_files": model_files, "records": records, "init_adapter": init,
                       "resume": resume, "config": config, "model_name": _model_name(cfg.model)})
    ckpt_dir = os.path.join(cfg.out, "checkpoint")
    os.makedirs(cfg.out, exist_ok=True)
    mw, last = None, [{"step": 0}]    # metrics rows go to the file once each, in step order

    def write_rows(rows):
        for row in rows:
            if mw is not None and row["step"] > last[0]["step"]:
                mw.write(row)
                last[0] = row

    def on_console(line):
        if line.startswith("[log] [py] BITLORA_STEP "):
            row = json.loads(line.split("BITLORA_STEP ", 1)[1])
            write_rows([row])
            print(_fmt(row), flush=True)

    own = session is None
    if own:
        print("bitlora: starting Chromium (WebGPU in a Pyodide worker)…", flush=True)
        session = BrowserSession()
    chained = session.on_console
    try:
        if own:
            session.start()
        session.on_console = on_console
        info = json.loads(session.run(SETUP.format(args=args, state=STATE, ckpt=CKPT, resume=RESUME),
                                      timeout_s=3600))
        if info["error"]:
            return _fail(info["error"])
        print(f"bitlora: {info['name']} on {info['device']}; {info['records']} records "
              f"({len(info['skipped'])} skipped), {info['total_steps']} optimizer steps", flush=True)
        for index, reason in info["skipped"][:20]:
            print(f"  skipped record {index}: {reason}", file=sys.stderr)
        mw = MetricsWriter(os.path.join(cfg.out, "metrics.jsonl"),
                           resume_step=info["step"] if cfg.resume else None)
        last[0] = {"step": info["step"]}
        while True:
            seg = json.loads(session.run(SEGMENT.format(state=STATE, ckpt=CKPT), timeout_s=24 * 3600))
            write_rows(seg["rows"])
            if "adapter" in seg:
                _write_files(cfg.out, seg["adapter"])
                break
            _write_files(ckpt_dir, seg["checkpoint"])
            if on_checkpoint is not None:
                on_checkpoint(seg["step"])
    except BrowserError as e:
        print(f"bitlora train: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nbitlora train: interrupted" + (f"; the last checkpoint is in {ckpt_dir}"
                                                if os.path.isdir(ckpt_dir) else ""), file=sys.stderr)
        return 130
    finally:
        session.on_console = chained
        if own:
            session.close()
    if "loss" in last[0]:
        print(f"bitlora: done, step {last[0]['step']}, loss {last[0]['loss']:.4f}; adapter and metrics in {cfg.out}")
    return 0


def _fail(msg: str) -> int:
    print(f"bitlora train: {msg}", file=sys.stderr)
    return 2


def _fmt(row: dict) -> str:
    return (f"step {row['step']}: loss {row['loss']:.4f}, grad_norm {row['grad_norm']:.3f}, "
            f"lr {row['lr']:.2e}, {row['tokens_per_s']:.0f} tok/s")
