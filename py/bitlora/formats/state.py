"""Training-state checkpoints: everything `--resume` needs to continue a run so that
its losses equal those of an uninterrupted one.

    save_state(ckpt_dir, step=12, params=..., exp_avg=..., exp_avg_sq=...,
               cursor=step.cursor, rng={...}, config=cfg.to_dict(), extra={...})
    st = load_state(ckpt_dir)     # TrainState(step, params, exp_avg, exp_avg_sq, cursor, rng, config, extra)
    load_config(ckpt_dir)         # the run's TrainConfig dict alone, from the header

One file, `ckpt_dir/training_state.safetensors`: the LoRA tensors under their PEFT
keys, the AdamW moments as `exp_avg.<key>` / `exp_avg_sq.<key>` (torch's names), all
F32, and the rest as JSON in the header's `__metadata__["bitlora"]`. It is written to
a temporary file, flushed, then renamed over the old one (os.replace), so a run
killed mid-write leaves the previous checkpoint whole. A PEFT adapter of the same
parameters is written next to it (adapter_config.json, adapter_model.safetensors)
for convenience; the state file is the one that counts.

`cursor` is data.Step.cursor (epoch, micro_batch, step, and whatever the trainer
adds, e.g. the dataset fingerprint); `rng` is any JSON-able state of the trainer's
random streams (dropout); random_state_to_json / random_state_from_json convert a
Python random.Random's state. `step` is the number of optimizer steps taken, i.e.
AdamW's t, and the 0-based index of the next step.

Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field

from ..config import TrainConfig
from . import peft, safetensors
from .source import FileSource

STATE_FILE = "training_state.safetensors"
FORMAT = "bitlora-training-state"
VERSION = 1


@dataclass
class TrainState:
    step: int
    params: dict            # {peft key: (shape, array('f'))}
    exp_avg: dict           # same keys: AdamW first moments m
    exp_avg_sq: dict        # same keys: AdamW second moments v
    cursor: dict
    rng: dict | None = None
    config: dict = field(default_factory=dict)   # TrainConfig.to_dict() of the run
    extra: dict = field(default_factory=dict)    # anything else JSON-able the trainer keeps


def save_state(ckpt_dir, *, step: int, params: dict, exp_avg: dict, exp_avg_sq: dict,
               cursor: dict, rng: dict | None = None, config: dict | None = None,
               extra: dict | None = None, base_model_name_or_path: str | None = None) -> str:
    """Write ckpt_dir/training_state.safetensors atomically (and a PEFT adapter beside
    it). Tensors are (shape, f32 array('f') / sequence / bytes). Returns the state path."""
    for name, d in (("exp_avg", exp_avg), ("exp_avg_sq", exp_avg_sq)):
        if set(d) != set(params):
            raise ValueError(f"save_state: {name} keys differ from the parameter keys")
    tensors = dict(params)
    tensors.update({f"exp_avg.{k}": v for k, v in exp_avg.items()})
    tensors.update({f"exp_avg_sq.{k}": v for k, v in exp_avg_sq.items()})
    meta = {"format": FORMAT, "version": VERSION, "step": int(step), "cursor": cursor,
            "rng": rng, "config": config or {}, "extra": extra or {}}
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, STATE_FILE)
    safetensors.write_atomic(path, safetensors.dumps(tensors, {"bitlora": json.dumps(meta)}))
    if config:
        peft.save_adapter(ckpt_dir, params, TrainConfig.from_dict(config), base_model_name_or_path)
    return path


def _not_a_state(path, e: Exception) -> ValueError:
    """--resume named a file that is no safetensors file (e.g. metrics.jsonl)."""
    why = str(e).removeprefix(f"{path}: ")
    return ValueError(f"{path}: not a bitlora training state (give a checkpoint folder, or its "
                      f"{STATE_FILE}): {why}")


def load_state(path) -> TrainState:
    """Read a checkpoint folder (or the state file itself). Raises ValueError with the
    reason if it is missing or not ours."""
    if os.path.isdir(path):
        path = os.path.join(path, STATE_FILE)
    if not os.path.exists(path):
        raise ValueError(f"{path}: no training state to resume from")
    with open(path, "rb") as f:
        try:
            tensors, meta = safetensors.loads(f.read(), str(path))
        except ValueError as e:   # FormatError too: not a safetensors file at all
            raise _not_a_state(path, e) from None
    try:
        info = json.loads(meta["bitlora"])
    except (KeyError, ValueError):
        raise ValueError(f"{path}: not a bitlora training state") from None
    if info.get("format") != FORMAT or info.get("version") != VERSION:
        raise ValueError(f"{path}: training state format {info.get('format')!r} "
                         f"v{info.get('version')}, expected {FORMAT!r} v{VERSION}")
    params, m, v = {}, {}, {}
    for k, t in tensors.items():
        if k.startswith("exp_avg_sq."):
            v[k[len("exp_avg_sq."):]] = t
        elif k.startswith("exp_avg."):
            m[k[len("exp_avg."):]] = t
        else:
            params[k] = t
    if set(m) != set(params) or set(v) != set(params):
        raise ValueError(f"{path}: moments do not match the parameters")
    return TrainState(step=info["step"], params=params, exp_avg=m, exp_avg_sq=v,
                      cursor=info["cursor"], rng=info.get("rng"), config=info.get("config") or {},
                      extra=info.get("extra") or {})


def load_config(path) -> dict:
    """The TrainConfig dict a checkpoint (folder or state file) was saved with, from the
    file's header alone ({} for a state without one). ValueError as load_state's."""
    if os.path.isdir(path):
        path = os.path.join(path, STATE_FILE)
    if not os.path.exists(path):
        raise ValueError(f"{path}: no training state to resume from")
    src = FileSource(path)
    try:
        _, meta = safetensors.parse_header(src)
    except ValueError as e:
        raise _not_a_state(path, e) from None
    finally:
        src.close()
    try:
        info = json.loads(meta["bitlora"])
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"{path}: not a bitlora training state") from None
    return info.get("config") or {}


def random_state_to_json(rng: random.Random) -> list:
    """A random.Random's state as JSON-able nested lists."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def random_state_from_json(state: list) -> random.Random:
    rng = random.Random()
    rng.setstate((state[0], tuple(state[1]), state[2]))
    return rng
