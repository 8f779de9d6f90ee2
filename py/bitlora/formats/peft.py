"""LoRA adapters in PEFT's on-disk format: names, shapes, PEFT's initialisation, and
reading / writing `adapter_config.json` + `adapter_model.safetensors`.

    shapes = lora_shapes(hf_config, ["q_proj", "v_proj"], r=8)   # [(key, shape)], A then B
    tensors = init_lora(shapes, seed=42)                          # {key: (shape, array('f'))}
    save_adapter("out", tensors, cfg, base_model_name_or_path="demo")
    config, tensors = load_adapter("out")

Keys are PEFT's, `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`
(`mlp.` for gate_proj / up_proj / down_proj), and serve as the trainer's parameter
names too. Per targeted projection W[out, in]: A[R, in], B[out, R], and the layer
computes y = W x + (lora_alpha / R) * B (A dropout(x)).

PEFT initialises A with kaiming_uniform(a=sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)),
and B = 0. init_lora draws A from the same distribution with Python's random module,
seeded per tensor by (seed, key): reproducible, but not the numbers torch's generator
would give. With B = 0 the adapter starts as the identity either way.

What this is not: the GPU side (the trainer uploads these arrays), or every PEFT
feature (no DoRA, rsLoRA, rank patterns, biases).
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import array
import json
import math
import os
import random

from ..bitnet import FULL, MODULES, projection_shapes
from . import safetensors

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PREFIX = "base_model.model.model.layers"


def peft_key(layer: int, module: str, which: str) -> str:
    """PEFT's saved name of lora_A / lora_B (which = "A" | "B") of one projection."""
    if module not in FULL:
        raise ValueError(f"target_modules: unknown module {module!r}")
    return f"{PREFIX}.{layer}.{FULL[module]}.lora_{which}.weight"


def lora_shapes(hf_config: dict, target_modules, r: int) -> list:
    """[(key, shape)] of every LoRA tensor: A[R, in] then B[out, R], per layer, per
    module in layer order (whatever order target_modules lists them in)."""
    proj = projection_shapes(hf_config)
    out = []
    for i in range(hf_config["num_hidden_layers"]):
        for m in MODULES:
            if m in target_modules:
                o, n_in = proj[m]
                out.append((peft_key(i, m, "A"), (r, n_in)))
                out.append((peft_key(i, m, "B"), (o, r)))
    return out


def init_lora(shapes: list, seed: int) -> dict:
    """PEFT's default init: A ~ U(-1/sqrt(in), 1/sqrt(in)) (kaiming_uniform, a=sqrt(5)),
    B = 0. Python RNG seeded per tensor by (seed, key); not torch's numbers."""
    out = {}
    for key, shape in shapes:
        n = shape[0] * shape[1]
        if ".lora_A." in key:
            bound = 1.0 / math.sqrt(shape[1])
            rng = random.Random(f"bitlora-lora:{seed}:{key}")
            out[key] = (tuple(shape), array.array("f", (rng.uniform(-bound, bound) for _ in range(n))))
        else:
            out[key] = (tuple(shape), array.array("f", bytes(4 * n)))
    return out


def adapter_config(r: int, lora_alpha, lora_dropout: float, target_modules,
                   base_model_name_or_path: str | None = None) -> dict:
    """adapter_config.json as PEFT 0.21 writes it for a plain LoRA (same keys, same
    defaults), so that PeftModel.from_pretrained reads it without warnings."""
    return {
        "alora_invocation_tokens": None, "alpha_pattern": {}, "arrow_config": None,
        "auto_mapping": None, "base_model_name_or_path": base_model_name_or_path,
        "bias": "none", "corda_config": None, "ensure_weight_tying": False, "eva_config": None,
        "exclude_modules": None, "fan_in_fan_out": False, "inference_mode": True,
        "init_lora_weights": True, "kasa_config": None, "layer_replication": None,
        "layers_pattern": None, "layers_to_transform": None, "loftq_config": {},
        "lora_alpha": lora_alpha, "lora_bias": False, "lora_dropout": lora_dropout,
        "lora_ga_config": None, "megatron_config": None, "megatron_core": "megatron.core",
        "modules_to_save": None, "monteclora_config": None, "peft_type": "LORA",
        "peft_version": "0.21.2", "qalora_group_size": 16, "r": r, "rank_pattern": {},
        "revision": None, "target_modules": list(target_modules), "target_parameters": None,
        "task_type": "CAUSAL_LM", "trainable_token_indices": None, "use_bdlora": None,
        "use_dora": False, "use_qalora": False, "use_rslora": False, "velora_config": None,
    }


def save_adapter(out_dir, tensors: dict, cfg, base_model_name_or_path: str | None = None) -> None:
    """Write out_dir/adapter_config.json and out_dir/adapter_model.safetensors (F32).

    tensors: {peft key: (shape, f32 values: array('f'), a sequence, or raw bytes)}.
    cfg: a TrainConfig (or anything with lora_r, lora_alpha, lora_dropout, target_modules).
    Each file is replaced atomically."""
    os.makedirs(out_dir, exist_ok=True)
    conf = adapter_config(cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, cfg.target_modules,
                          base_model_name_or_path)
    safetensors.write_atomic(os.path.join(out_dir, WEIGHTS_FILE),
                                safetensors.dumps(tensors, {"format": "pt"}))
    safetensors.write_atomic(os.path.join(out_dir, CONFIG_FILE),
                                (json.dumps(conf, indent=2) + "\n").encode())


def load_adapter(adapter_dir) -> tuple:
    """(config dict, {peft key: (shape, array('f'))}) of a PEFT LoRA adapter folder
    (F32, F16 or BF16 tensors; PEFT's own saves load too). Raises ValueError if the
    folder holds something else."""
    cpath = os.path.join(adapter_dir, CONFIG_FILE)
    wpath = os.path.join(adapter_dir, WEIGHTS_FILE)
    for p in (cpath, wpath):
        if not os.path.exists(p):
            raise ValueError(f"{adapter_dir}: no {os.path.basename(p)} (not a PEFT adapter folder)")
    try:
        with open(cpath, encoding="utf-8") as f:
            conf = json.load(f)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ValueError(f"{cpath}: not a JSON adapter config ({e})") from None
    if not isinstance(conf, dict):
        raise ValueError(f"{cpath}: not a JSON object")
    if conf.get("peft_type") != "LORA":
        raise ValueError(f"{cpath}: peft_type is {conf.get('peft_type')!r}, expected 'LORA'")
    for key in ("use_dora", "use_rslora"):
        if conf.get(key):
            raise ValueError(f"{cpath}: {key} is not supported")
    if conf.get("bias", "none") != "none":
        raise ValueError(f"{cpath}: bias {conf['bias']!r} is not supported (only 'none')")
    for key in ("rank_pattern", "alpha_pattern"):
        if conf.get(key):
            raise ValueError(f"{cpath}: {key} (per-module ranks or alphas) is not supported")
    if conf.get("layers_to_transform") is not None:
        raise ValueError(f"{cpath}: layers_to_transform is not supported (bitlora adapts every layer)")
    for key in ("r", "lora_alpha", "target_modules"):
        if conf.get(key) is None:
            raise ValueError(f"{cpath}: no {key}")
    with open(wpath, "rb") as f:
        tensors, _ = safetensors.loads(f.read(), wpath)
    return conf, tensors


def adapter_settings(conf: dict, tensors: dict | None = None) -> dict:
    """The TrainConfig fields an adapter_config.json fixes: lora_r, lora_alpha,
    lora_dropout, target_modules (a list, in layer order). PEFT's target_modules may be
    short names, module paths (what "all-linear" is saved as: model.layers.0.mlp.up_proj,
    ...) or a regular expression over the paths; the adapted modules are then read from
    the tensors' keys (check_tensors makes sure every layer has them)."""
    tm = conf["target_modules"]
    if tensors is not None and (isinstance(tm, str) or any("." in m for m in tm)):
        tm = {k.split(".")[-3] for k in tensors if k.endswith((".lora_A.weight", ".lora_B.weight"))}
    elif tm == "all-linear":
        tm = list(MODULES)
    else:
        tm = [tm] if isinstance(tm, str) else [m.rsplit(".", 1)[-1] for m in tm]
    return {"lora_r": conf["r"], "lora_alpha": conf["lora_alpha"],
            "lora_dropout": conf.get("lora_dropout", 0.0),
            "target_modules": [m for m in MODULES if m in tm] + sorted(m for m in set(tm) if m not in MODULES)}


def check_tensors(tensors: dict, shapes: list, what: str = "adapter") -> None:
    """Raise ValueError unless `tensors` holds exactly the keys and shapes of `shapes`."""
    want = {k: tuple(s) for k, s in shapes}
    missing = [k for k in want if k not in tensors]
    extra = [k for k in tensors if k not in want]
    if missing or extra:
        raise ValueError(f"{what}: {len(missing)} tensors missing (e.g. {missing[:1]}), "
                         f"{len(extra)} unexpected (e.g. {extra[:1]})")
    for k, s in want.items():
        if tuple(tensors[k][0]) != s:
            raise ValueError(f"{what}: {k} has shape {list(tensors[k][0])}, expected {list(s)}")
