"""Learning-rate schedules, the same numbers as transformers'
get_constant_schedule_with_warmup / get_linear_schedule_with_warmup /
get_cosine_schedule_with_warmup (num_cycles 0.5).

`step` is the 0-based index of the optimizer step about to be taken: the HF Trainer
calls scheduler.step() after optimizer.step(), so its first update uses the factor at
0 (which is 0.0 when there is warmup) and its last the factor at total_steps - 1.

Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import math


def lr_factor(kind: str, step: int, warmup_steps: int, total_steps: int) -> float:
    """Multiplier of the base learning rate for optimizer step `step` (0-based)."""
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    if kind == "constant":
        return 1.0
    decay = max(1, total_steps - warmup_steps)
    if kind == "linear":
        return max(0.0, float(total_steps - step) / float(decay))
    if kind == "cosine":
        progress = float(step - warmup_steps) / float(decay)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * 0.5 * 2.0 * progress)))
    raise ValueError(f"lr_scheduler: unknown schedule {kind!r}")


def lr_at(cfg, step: int, total_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based) for a TrainConfig."""
    return cfg.lr * lr_factor(cfg.lr_scheduler, step, cfg.warmup_steps, total_steps)
