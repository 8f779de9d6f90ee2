"""bitlora.schedule against transformers' schedulers, step by step."""
from __future__ import annotations

import pytest

from bitlora.config import TrainConfig
from bitlora.schedule import lr_at, lr_factor


def _hf_lrs(kind, lr, warmup, total):
    import torch
    from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                              get_linear_schedule_with_warmup)
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    if kind == "constant":
        sch = get_constant_schedule_with_warmup(opt, warmup)
    elif kind == "linear":
        sch = get_linear_schedule_with_warmup(opt, warmup, total)
    else:
        sch = get_cosine_schedule_with_warmup(opt, warmup, total)
    out = []
    for _ in range(total + 3):          # a few past the end: clamps at 0 (or stays constant)
        out.append(opt.param_groups[0]["lr"])   # the lr the optimizer step uses
        opt.step()
        sch.step()
    return out


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
@pytest.mark.parametrize("warmup,total", [(0, 10), (3, 10), (5, 5), (1, 1), (100, 37), (0, 1)])
def test_matches_transformers(kind, warmup, total):
    cfg = TrainConfig(lr=3e-4, lr_scheduler=kind, warmup_steps=warmup)
    ref = _hf_lrs(kind, 3e-4, warmup, total)
    ours = [lr_at(cfg, s, total) for s in range(total + 3)]
    assert ours == pytest.approx(ref, rel=1e-12, abs=1e-18)


def test_warmup_starts_at_zero_and_reaches_base():
    assert lr_factor("linear", 0, 4, 10) == 0.0
    assert lr_factor("cosine", 4, 4, 10) == 1.0
    assert lr_factor("constant", 0, 0, 10) == 1.0


def test_unknown_kind():
    with pytest.raises(ValueError, match="lr_scheduler"):
        lr_factor("step", 5, 0, 10)
