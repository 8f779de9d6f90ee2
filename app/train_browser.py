"""`bitlora train --backend browser`: the same training, run headless inside Pyodide in
Chromium (real WebGPU) through Playwright, writing the same outputs as the native
backend: OUT/adapter_config.json, OUT/adapter_model.safetensors, OUT/metrics.jsonl.

The model and data files are read here and handed to the worker (the demo model is
fetched by the page from the local server), so this suits models that fit in memory
twice; progress lines are printed as the worker reports each step.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import sys

RUN = """
import base64, json
from bitlora import gpu
from bitlora.api import aload_model
from bitlora.train import Trainer
from bitlora.webapp import demo_model_files
args = json.loads({args!r})
files = args["model_files"]
src = await demo_model_files() if files is None else {{k: base64.b64decode(v) for k, v in files.items()}}
if isinstance(src, dict) and len(src) == 1 and next(iter(src)).endswith(".gguf"):
    src = next(iter(src.values()))
model = await aload_model(src, device=await gpu.get_device())
data = args["records"] if args["records"] is not None else "demo"
if data == "demo":
    from bitlora.webapp import url_bytes
    from bitlora.data import load_records
    data = load_records(await url_bytes("/demo/alpaca_demo.json"), name="alpaca_demo.json")
init = args["init_adapter"]
config = args["config"]
if init is not None:
    import os
    os.makedirs("/tmp/init-adapter", exist_ok=True)
    for k, v in init.items():
        open("/tmp/init-adapter/" + k, "wb").write(base64.b64decode(v))
    config["init_adapter"] = "/tmp/init-adapter"
trainer = Trainer(model, data, config)
trainer.on_step = lambda row: print("BITLORA_STEP " + json.dumps(row))
await trainer.atrain()
await trainer.asave_adapter("/tmp/bitlora-out")
out = {{n: base64.b64encode(open("/tmp/bitlora-out/" + n, "rb").read()).decode()
       for n in ("adapter_config.json", "adapter_model.safetensors")}}
json.dumps({{"metrics": trainer.metrics, "files": out, "skipped": [list(x) for x in trainer.dataset.invalid]}})
"""


def _files(path: str) -> dict:
    p = pathlib.Path(path)
    items = [q for q in p.iterdir() if q.is_file()] if p.is_dir() else [p]
    return {q.name: base64.b64encode(q.read_bytes()).decode() for q in items}


def train_in_browser(cfg) -> int:
    from bitlora.data import DataError, load_records

    from .browser import BrowserError, BrowserSession

    if cfg.resume:
        print("bitlora train: --resume is not supported with --backend browser yet; use the native backend",
              file=sys.stderr)
        return 2
    try:
        model_files = None if cfg.model == "demo" else _files(cfg.model)
        records = None if cfg.data == "demo" else load_records(cfg.data)
        init = _files(cfg.init_adapter) if cfg.init_adapter else None
    except (OSError, DataError) as e:
        print(f"bitlora train: {e}", file=sys.stderr)
        return 2
    config = {k: v for k, v in cfg.to_dict().items() if k not in ("model", "data", "out", "backend",
                                                                   "init_adapter", "resume")}
    config["save_every"] = 0
    args = json.dumps({"model_files": model_files, "records": records, "init_adapter": init, "config": config})
    os.makedirs(cfg.out, exist_ok=True)
    print("bitlora: starting Chromium (WebGPU in a Pyodide worker)…", flush=True)
    try:
        with BrowserSession() as session:
            session.on_console = lambda line: (line.startswith("[log] [py] BITLORA_STEP ") and print(
                _fmt(json.loads(line.split("BITLORA_STEP ", 1)[1])), flush=True))
            result = json.loads(session.run(RUN.format(args=args), timeout_s=24 * 3600))
    except BrowserError as e:
        print(f"bitlora train: {e}", file=sys.stderr)
        return 1
    for name, b64 in result["files"].items():
        pathlib.Path(cfg.out, name).write_bytes(base64.b64decode(b64))
    from bitlora.metrics import MetricsWriter
    mw = MetricsWriter(os.path.join(cfg.out, "metrics.jsonl"))
    for row in result["metrics"]:
        mw.write(row)
    last = result["metrics"][-1] if result["metrics"] else None
    if last:
        print(f"bitlora: done, step {last['step']}, loss {last['loss']:.4f}; adapter and metrics in {cfg.out}")
    return 0


def _fmt(row: dict) -> str:
    return (f"step {row['step']}: loss {row['loss']:.4f}, grad_norm {row['grad_norm']:.3f}, "
            f"lr {row['lr']:.2e}, {row['tokens_per_s']:.0f} tok/s")
