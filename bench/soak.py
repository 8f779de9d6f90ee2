"""Soak: many optimizer steps of the demo model on a few demo records with small
settings, natively, watching for leaks. Every `every` steps (after a full garbage
collection) it records the GPU buffer bytes and count (Device.allocated,
Device.live_buffers), the bind-group cache, the trainer's recorded programs (one per
micro-batch shape, gpu.Programs) and the Python heap (tracemalloc). The
trainer's metrics history grows by design (one row per step, for the charts and the
checkpoint); its bytes are counted apart and left out of the heap figure.

    .venv/bin/python -m bitlora.bench.soak --steps 2000     # figures in docs/RELIABILITY.md

Growth is measured from the end of the warm-up (one epoch: every sequence length has
been seen, so the bind-group cache, keyed by buffer ranges, and the programs are full) to the largest
value after it. tests/test_soak.py runs a short version with the same 2 % bound.
"""
from __future__ import annotations

import argparse
import gc
import sys
import time
import tracemalloc

from bitlora.data import load_records
from bitlora.demo import MODEL_DIR
from bitlora.model import load_model
from bitlora.train import Trainer

SETTINGS = dict(micro_batch_size=1, grad_accum=1, cutoff_len=64, lr=1e-3, warmup_steps=0, lora_r=4)
MEASURES = ("gpu_bytes", "gpu_buffers", "bind_groups", "programs", "heap")


def _metrics_bytes(rows: list) -> int:
    return sys.getsizeof(rows) + sum(sys.getsizeof(r) + sum(sys.getsizeof(v) for v in r.values()) for r in rows)


def soak(steps: int, records: int = 20, every: int = 10, model=None) -> dict:
    """Train `steps` optimizer steps on the first `records` demo records (an epoch is
    `records` steps) and sample every `every` steps: {"rows": [...], "warmup": step,
    "growth": {measure: fraction}, "seconds"}."""
    tracemalloc.start()
    model = model or load_model(str(MODEL_DIR))
    data = [r for r in load_records("demo")][:records]
    tr = Trainer(model, data, dict(SETTINGS, max_steps=steps, epochs=steps // records + 1))
    dev, rows = model.dev, []

    def sample(row):
        if row["step"] % every:
            return
        gc.collect()
        kept = _metrics_bytes(tr.metrics)
        rows.append({"step": row["step"], "gpu_bytes": dev.allocated, "gpu_buffers": dev.live_buffers,
                     "bind_groups": len(dev._bind_groups), "programs": len(tr.programs),
                     "heap": tracemalloc.get_traced_memory()[0] - kept,
                     "metrics_bytes": kept, "loss": row["loss"]})
    tr.on_step = sample
    t0 = time.perf_counter()
    try:
        tr.train()
    finally:
        tracemalloc.stop()
        tr.close()
    warm = next(r for r in rows if r["step"] >= min(records + every, steps // 2))
    growth = {m: (max(r[m] for r in rows if r["step"] >= warm["step"]) - warm[m]) / warm[m] for m in MEASURES}
    return {"rows": rows, "warmup": warm["step"], "growth": growth, "seconds": time.perf_counter() - t0}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bitlora.bench.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--records", type=int, default=20, help="demo records trained on (one epoch = this many steps)")
    p.add_argument("--every", type=int, default=10, help="sample every N steps")
    args = p.parse_args(argv)
    res = soak(args.steps, args.records, args.every)
    print("step  gpu_bytes  buffers  bind_groups  programs  heap_bytes  metrics_bytes  loss")
    for r in res["rows"][:: max(1, len(res["rows"]) // 20)] + res["rows"][-1:]:
        print(f"{r['step']:5d} {r['gpu_bytes']:10d} {r['gpu_buffers']:8d} {r['bind_groups']:12d} "
              f"{r['programs']:9d} {r['heap']:11d} {r['metrics_bytes']:14d}  {r['loss']:.4f}")
    print(f"{args.steps} steps in {res['seconds']:.0f} s; growth after step {res['warmup']}: "
          + ", ".join(f"{m} {100 * g:+.2f} %" for m, g in res["growth"].items()))
    return 0 if all(g < 0.02 for g in res["growth"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
