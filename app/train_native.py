"""`bitlora train --backend native`: LoRA finetuning on this machine's GPU (wgpu-py),
with a progress bar, metrics.jsonl, checkpoints and a PEFT adapter in OUT.
"""
from __future__ import annotations

import os
import shutil
import sys


def _fail(msg: str) -> int:
    print(f"bitlora train: {msg}", file=sys.stderr)
    return 2


def out_folder_problem(out: str) -> str | None:
    """Make --out and write a file in it, before any model loads: why it cannot be used,
    or None."""
    import tempfile
    try:
        os.makedirs(out, exist_ok=True)
    except OSError as e:   # a file of that name, no permission, ...
        return f"--out {out}: cannot make the output folder ({e.strerror or e})"
    try:
        with tempfile.TemporaryFile(dir=out):
            pass
    except OSError as e:
        return f"--out {out}: cannot write in the output folder ({e.strerror or e})"
    return None


def _earlier_run(out: str, ckpt_dir: str) -> str | None:
    """What of an earlier run folder `out` holds (its steps in metrics.jsonl, its adapter,
    its checkpoint), in words; None where there is none."""
    from bitlora.formats.peft import WEIGHTS_FILE
    from bitlora.metrics import read_metrics

    found = []
    path = os.path.join(out, "metrics.jsonl")
    steps = [r.get("step", 0) for r in read_metrics(path)] if os.path.exists(path) else []
    if steps:
        found.append(f"metrics to step {max(steps)}")
    if os.path.exists(os.path.join(out, WEIGHTS_FILE)):
        found.append("an adapter")
    if os.path.isdir(ckpt_dir):
        found.append("a checkpoint")
    return ", ".join(found) or None


def replacing_earlier_run(cfg, ckpt_dir: str):
    """For a fresh run into an OUT that holds an earlier run: say what it holds and
    that it stays until this run's first step lands; returns what then removes the
    earlier run's checkpoint (MetricsWriter's on_replace), so a later --resume cannot
    mix the two runs. None for a resumed run or a new folder."""
    held = None if cfg.resume else _earlier_run(cfg.out, ckpt_dir)
    if held is None:
        return None
    hint = f" (to continue that run instead: --resume {ckpt_dir})" if os.path.isdir(ckpt_dir) else ""
    print(f"bitlora: {cfg.out} holds an earlier run ({held}); this run replaces it once its first step "
          f"lands{hint}", file=sys.stderr, flush=True)

    def drop_checkpoint():
        if os.path.isdir(ckpt_dir):
            shutil.rmtree(ckpt_dir, ignore_errors=True)
    return drop_checkpoint


def train_native(cfg) -> int:
    from tqdm import tqdm

    from bitlora import gpu
    from bitlora.data import DataError
    from bitlora.formats import FormatError
    from bitlora.metrics import MetricsWriter
    from bitlora.model import load_model
    from bitlora.train import Trainer

    problem = out_folder_problem(cfg.out)
    if problem:
        return _fail(problem)
    try:
        with tqdm(total=0, unit="B", unit_scale=True, desc="loading model", leave=False) as bar:
            def progress(done, total):
                bar.total = total
                bar.n = done
                bar.refresh()
            src = cfg.model
            if src == "demo":
                from bitlora.demo import MODEL_DIR
                src = str(MODEL_DIR)
            model = load_model(src, progress=progress)
        for w in model.warnings:
            print(f"bitlora: warning: {w}", file=sys.stderr, flush=True)
        trainer = Trainer(model, cfg.data, cfg)
    except (FormatError, DataError, ValueError, OSError, gpu.GPUError) as e:
        return _fail(str(e))
    ds = trainer.dataset
    print(f"bitlora: {model.name} on {model.dev.describe()}; {len(ds)} records "
          f"({len(ds.invalid)} skipped), {trainer.total_steps} optimizer steps", flush=True)
    est = trainer.memory_estimate()
    print("bitlora: GPU memory for training " + ", ".join(
        [f"{est['total'] / 2**20:.1f} MiB"] + [f"{k} {v / 2**20:.1f}" for k, v in est["parts"].items()]), flush=True)
    for index, reason in ds.invalid[:20]:
        print(f"  skipped record {index}: {reason}", file=sys.stderr)
    if len(ds.invalid) > 20:
        print(f"  ... and {len(ds.invalid) - 20} more", file=sys.stderr)

    trainer.checkpoint_dir = os.path.join(cfg.out, "checkpoint")
    replace = replacing_earlier_run(cfg, trainer.checkpoint_dir)
    bar = tqdm(total=trainer.total_steps, unit="step", desc="training", dynamic_ncols=True)

    def show(row):
        bar.n = row["step"]
        bar.set_postfix(loss=f"{row['loss']:.4f}", grad_norm=f"{row['grad_norm']:.3f}",
                        lr=f"{row['lr']:.2e}", tok_s=f"{row['tokens_per_s']:.0f}", refresh=False)
        bar.refresh()

    async def run():
        await trainer.setup()    # loads --resume state, so the metrics file can be trimmed to it
        resumed = trainer.step if cfg.resume else None
        for change in trainer.resume_changes:
            print(f"bitlora: resuming step {trainer.step} with {change}", file=sys.stderr, flush=True)
        metrics = MetricsWriter(os.path.join(cfg.out, "metrics.jsonl"), resume_step=resumed, on_replace=replace)

        def on_step(row):
            metrics.write(row)
            show(row)
        trainer.on_step = on_step
        bar.n = trainer.step
        try:
            await trainer.atrain()
        finally:   # the adapter so far (interrupted, failed later on), not an untrained one
            if trainer.metrics:
                await trainer.asave_adapter(cfg.out)

    try:
        gpu.run(run())
    except KeyboardInterrupt:
        bar.close()
        print("\nbitlora train: interrupted; " + (f"the adapter so far is in {cfg.out}" if trainer.metrics else
                                                    "no step had finished: nothing saved"), file=sys.stderr)
        return 130
    except (gpu.GPUError, ValueError, OSError) as e:
        bar.close()
        return _fail(str(e))
    bar.close()
    last = trainer.metrics[-1] if trainer.metrics else None
    if last:
        print(f"bitlora: done, step {last['step']}, loss {last['loss']:.4f}; adapter and metrics in {cfg.out}")
    return 0
