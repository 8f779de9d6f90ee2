"""`bitlora train --backend browser`: the same training, run headless inside Pyodide in
Chromium (real WebGPU) through Playwright, writing the same outputs as the native
backend: OUT/adapter_config.json, OUT/adapter_model.safetensors, OUT/metrics.jsonl,
and with --save-every N the checkpoint folder OUT/checkpoint.

The model, data, --init-adapter and --resume files are read here and handed to the
worker (the demo model is fetched by the page from the local server), so this suits
models that fit in memory twice. Two typed messages drive the worker's handlers
(bitlora.webapp): `cli-setup` builds its Trainer and answers `cli-ready`; each
`cli-train` trains up to the next checkpoint and answers `cli-trained` with the
checkpoint's files, written here to OUT/checkpoint atomically (the same files
train.py writes natively, so either backend resumes the other's checkpoints), or,
at the end, with the adapter's. Progress lines and metrics.jsonl rows are written
as the worker's `cli-step` messages report each step. On Ctrl+C, `cli-stop` ends the
run at the step in flight and answers the adapter so far, written to OUT as a
finished run's would be.
"""
from __future__ import annotations

import base64
import json
import os
import pathlib
import sys


def _dataset(data: str) -> dict | None:
    """The dataset file for the worker to read (its name says whether it is JSONL)."""
    from bitlora.data import load_records
    if data == "demo":
        return None
    load_records(data)                   # fail here, before Chromium starts
    return {"name": data, "bytes": base64.b64encode(pathlib.Path(data).read_bytes()).decode()}


def _files(path: str) -> dict:
    p = pathlib.Path(path)
    items = [q for q in p.iterdir() if q.is_file()] if p.is_dir() else [p]
    return {q.name: base64.b64encode(q.read_bytes()).decode() for q in items}


def _stop_and_save(session, out: str, write_rows) -> tuple[bool, str]:
    """After Ctrl+C: ask the page to stop at the step in flight (`cli-stop`) and write
    its metrics rows and adapter to `out`. -> (saved, why not). A Ctrl+C that landed in
    one of Playwright's event callbacks comes back out of its next call, once more:
    only a second signal (counted here) leaves at once."""
    import signal
    presses = [0]

    def count(signum, frame):
        presses[0] += 1
        raise KeyboardInterrupt
    try:
        old = signal.signal(signal.SIGINT, count)
    except ValueError:   # not the main thread: no handler of ours
        old = None
    try:
        for _ in range(3):
            try:
                seg = session.request({"type": "cli-stop"}, timeout_s=600)
                break
            except KeyboardInterrupt:
                if presses[0]:
                    return False, " (left at once)"
        else:
            return False, " (the page did not answer)"
        write_rows([json.loads(r) for r in seg["rows"]])
        if not seg.get("adapter"):
            return False, ""
        _write_files(out, seg["adapter"])
        return True, ""
    except Exception as e:   # noqa: BLE001 - the browser went away: say what is on disk
        return False, f" (the page did not answer: {str(e).splitlines()[0] if str(e) else type(e).__name__})"
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old)


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
    from bitlora.formats import state as checkpoint_state
    from bitlora.data import DataError
    from bitlora.metrics import MetricsWriter

    from .browser import BrowserError, BrowserSession
    from .train_native import out_folder_problem, replacing_earlier_run

    try:
        model_path, model_name = cfg.model, _model_name(cfg.model)
        if model_path != "demo" and not os.path.exists(model_path):
            from bitlora import hub       # a repo id or hub URL: downloaded once into the cache folder
            got = hub.download(model_path)
            if got is not None:
                model_path, model_name = got
        model_files = None if model_path == "demo" else _files(model_path)
        data = _dataset(cfg.data)
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
    setup = {"type": "cli-setup", "model_files": model_files, "data": data, "init_adapter": init,
             "resume": resume, "config": config, "model_name": model_name}
    ckpt_dir = os.path.join(cfg.out, "checkpoint")
    problem = out_folder_problem(cfg.out)
    if problem:
        return _fail(problem)
    mw, last = None, [{"step": 0}]    # metrics rows go to the file once each, in step order

    def write_rows(rows):
        for row in rows:
            if mw is not None and row["step"] > last[0]["step"]:
                mw.write(row)
                last[0] = row

    def on_message(msg):
        if msg.get("type") == "cli-step":
            row = json.loads(msg["row"])
            write_rows([row])
            print(_fmt(row), flush=True)

    own = session is None
    if own:
        print("bitlora: starting Chromium (WebGPU in a Pyodide worker)…", flush=True)
        session = BrowserSession()
    chained = session.on_message
    try:
        if own:
            session.start()
        session.on_message = on_message
        info = session.request(setup, timeout_s=3600)
        if info["error"]:
            return _fail(info["error"])
        for w in info.get("warnings") or []:
            print(f"bitlora: warning: {w}", file=sys.stderr, flush=True)
        print(f"bitlora: {info['name']} on {info['device']}; {info['records']} records "
              f"({len(info['skipped'])} skipped), {info['total_steps']} optimizer steps", flush=True)
        for index, reason in info["skipped"][:20]:
            print(f"  skipped record {index}: {reason}", file=sys.stderr)
        mw = MetricsWriter(os.path.join(cfg.out, "metrics.jsonl"),
                           resume_step=info["step"] if cfg.resume else None,
                           on_replace=replacing_earlier_run(cfg, ckpt_dir))
        last[0] = {"step": info["step"]}
        while True:
            seg = session.request({"type": "cli-train"}, timeout_s=24 * 3600)
            write_rows([json.loads(r) for r in seg["rows"]])
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
        print("\nbitlora train: interrupted; stopping at the end of the step in flight "
              "(Ctrl+C again to leave now)…", file=sys.stderr, flush=True)
        saved, why = _stop_and_save(session, cfg.out, write_rows)
        where = (f"the adapter so far is in {cfg.out}" if saved else
                 f"the last checkpoint is in {ckpt_dir}" if os.path.isdir(ckpt_dir) else
                 f"nothing saved{why}" if why else "no step had finished: nothing saved")
        print(f"bitlora train: interrupted; {where}", file=sys.stderr)
        return 130
    finally:
        session.on_message = chained
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
