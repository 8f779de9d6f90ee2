"""metrics.jsonl: one JSON object per optimizer step, appended and flushed as it comes.

    mw = MetricsWriter("out/metrics.jsonl")                  # a fresh run: replaces the file
    mw = MetricsWriter("out/metrics.jsonl", resume_step=12)  # --resume: keeps steps <= 12
    mw.write({"step": 13, "loss": 2.31, "grad_norm": 0.8, "lr": 3e-4,
              "tokens": 512, "tokens_per_s": 1400.0})

Each line holds at least the REQUIRED keys; `step` is 1-based (the number of
optimizer steps taken once this one is done). On resume the lines of steps after the
checkpoint (written by the interrupted run after its last save) are dropped, so the
file ends up as an uninterrupted run's would, timings aside. A fresh run leaves an
earlier run's file as it is until its own first step is written (a run stopped before
that loses nothing); then the file holds this run's steps alone, and `on_replace` (if
given) is called once, for whatever else of the earlier run goes with it.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import json
import math
import os

from .formats.safetensors import write_atomic

REQUIRED = ("step", "loss", "grad_norm", "lr", "tokens", "tokens_per_s")


class MetricsWriter:
    def __init__(self, path, resume_step: int | None = None, on_replace=None):
        self.path = os.fspath(path)
        self._replace = None   # an earlier run's file, kept until this run's first step
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        if resume_step is None:
            if os.path.exists(self.path) and os.path.getsize(self.path):
                self._replace = on_replace or (lambda: None)
            else:
                write_atomic(self.path, b"")
        else:
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step] \
                if os.path.exists(self.path) else []
            write_atomic(self.path, "".join(_line(r) for r in kept).encode())

    def write(self, record: dict) -> None:
        missing = [k for k in REQUIRED if k not in record]
        if missing:
            raise ValueError(f"metrics: record lacks {', '.join(missing)}")
        if self._replace is not None:
            write_atomic(self.path, _line(record).encode())
            replaced, self._replace = self._replace, None
            replaced()
            return
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(_line(record))
            f.flush()


def _line(record: dict) -> str:
    # NaN / Inf are not JSON: write null so every line stays parseable everywhere.
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
    return json.dumps(clean, separators=(", ", ": ")) + "\n"


def read_metrics(path) -> list:
    """The records of a metrics.jsonl (blank and truncated last lines skipped)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out
