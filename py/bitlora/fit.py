"""Settings that fit a memory budget, for a run that does not: the search behind the
page's "Fit to device" and the command line's out-of-memory advice.

    fit = fit_settings(cfg, fits=lambda c: need(c) <= free, floor=dataset.shortest_cutoff())

The order is what costs a user least: gradient checkpointing first (the same batches,
one more forward per layer), then the micro-batch halved (gradient accumulation raised
so a step still sees as many sequences), then the cutoff halved down to `floor`; only
where even micro-batch 1 at the floor does not fit, a smaller LoRA adapter (the rank
halved with alpha, so the update's scale alpha / r stays; then fewer target modules).

Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import dataclasses

# LoRA targets to fall back on, each within the configured ones: attention only, the
# query and value projections (LoRA's own choice), the query alone.
FEWER_TARGETS = (("q_proj", "k_proj", "v_proj", "o_proj"), ("q_proj", "v_proj"), ("q_proj",))


def adapters(cfg) -> list:
    """(lora_r, lora_alpha, target_modules) from the configured adapter down: the rank
    halved (alpha with it), then fewer targets."""
    targets = [list(cfg.target_modules)]
    for keep in FEWER_TARGETS + ((cfg.target_modules[0],),):
        t = [m for m in cfg.target_modules if m in keep]
        if t and t not in targets:
            targets.append(t)
    out = []
    for t in targets:
        r = cfg.lora_r
        while r >= 1:
            out.append((r, cfg.lora_alpha * r / cfg.lora_r, t))
            r //= 2
    return out


def smallest(cfg, floor: int, keep_adapter: bool = False):
    """The least memory fit_settings would try: micro-batch 1 at the floor's cutoff with
    checkpointing, and its smallest adapter (unless `keep_adapter`)."""
    r, alpha, targets = adapters(cfg)[0 if keep_adapter else -1]
    return dataclasses.replace(cfg, gradient_checkpointing=True, micro_batch_size=1,
                               grad_accum=cfg.micro_batch_size * cfg.grad_accum, lora_r=r, lora_alpha=alpha,
                               target_modules=targets, cutoff_len=min(floor, cfg.cutoff_len))


def fit_settings(cfg, fits, floor: int, keep_adapter: bool = False):
    """The first config in the order above for which fits(config) is true, or None.
    `floor` is the shortest sensible cutoff (every example keeps its prompt and one answer
    token); `keep_adapter` keeps the LoRA rank and targets (a resumed run's adapter)."""
    batch, floor = cfg.micro_batch_size * cfg.grad_accum, min(floor, cfg.cutoff_len)
    cuts = [c for c in (cfg.cutoff_len >> k for k in range(16)) if c > floor] + [floor]
    for r, alpha, targets in adapters(cfg)[:1] if keep_adapter else adapters(cfg):
        base = dataclasses.replace(cfg, gradient_checkpointing=True, lora_r=r, lora_alpha=alpha,
                                   target_modules=targets)
        if not fits(dataclasses.replace(base, micro_batch_size=1, grad_accum=batch, cutoff_len=floor)):
            continue                       # not even the smallest batch: a smaller adapter
        for cut in cuts:
            mb = cfg.micro_batch_size
            while mb >= 1:
                trial = dataclasses.replace(base, micro_batch_size=mb, grad_accum=max(1, -(-batch // mb)),
                                            cutoff_len=cut)
                if fits(trial):
                    return trial
                mb //= 2
    return None


def changes(cfg, fit) -> dict:
    """The settings `fit` changes, in the order a user reads them."""
    keys = ("gradient_checkpointing", "micro_batch_size", "grad_accum", "cutoff_len", "lora_r", "lora_alpha",
            "target_modules")
    return {k: getattr(fit, k) for k in keys if getattr(fit, k) != getattr(cfg, k)}


def as_flags(changed: dict) -> str:
    """changes() as `name=value, ...` (target modules comma-joined, alpha without a
    needless ".0"), the form the command line's config keys take."""
    def text(v):
        if isinstance(v, list):
            return ",".join(v)
        return f"{v:g}" if isinstance(v, float) else str(v)
    return ", ".join(f"{k}={text(v)}" for k, v in changed.items())
