"""The one training configuration: a dataclass that the CLI flags and the page's JSON
both fill, type-checked field by field.

    cfg = TrainConfig.from_dict({"lr": 1e-3, "target_modules": ["q_proj", "v_proj"]})
    cfg = TrainConfig.from_cli(parser.parse_args())    # after TrainConfig.add_cli_args(parser)
    cfg.to_dict()                                      # JSON-able, round-trips through from_dict

Defaults follow alpaca-lora (tloen/alpaca-lora finetune.py) and the transformers
Trainer where alpaca-lora says nothing, except where the tiny demo needs otherwise;
each deviation is commented. Flags are generated from the fields: `max_steps` ->
`--max-steps`; a bool that defaults to False becomes a switch (`--train-on-inputs`),
one that defaults to True becomes `--no-<name>` (`--no-shuffle`); `target_modules`
is comma-separated on the command line and a list in JSON.

This is configuration only: no I/O, no defaults resolved ("demo" stays "demo").
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field

LORA_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
BACKENDS = ("native", "browser")
LR_SCHEDULERS = ("constant", "linear", "cosine")
DEMO = "demo"   # for `model` / `data`: the model and dataset shipped in bitlora.demo
MAX_COUNT = 10**9   # epochs, steps: far past any run, and exact as a JS number


class ConfigError(ValueError):
    """A field has the wrong type or value; the message names the field."""


@dataclass
class TrainConfig:
    # -- what to train on, where to write --------------------------------------------
    model: str = DEMO              # HF folder, .gguf file, or "demo"
    data: str = DEMO               # Alpaca .json (a list) or .jsonl, or "demo"
    out: str = "bitlora-out"       # adapter_config.json, adapter_model.safetensors, metrics.jsonl
    backend: str = "native"        # "native" (wgpu-py) or "browser" (Pyodide in Chromium)

    # -- length of the run -----------------------------------------------------------
    epochs: int = 3                # alpaca-lora num_epochs
    max_steps: int = 0             # > 0: stop after this many optimizer steps (overrides epochs,
                                   #   cycling through the data as the HF Trainer does); 0: off

    # -- batching --------------------------------------------------------------------
    micro_batch_size: int = 4      # alpaca-lora micro_batch_size
    grad_accum: int = 4            # alpaca-lora: 32 (batch 128). The demo dataset is small, so
                                   #   16 sequences per step gives a loss curve with many points
    cutoff_len: int = 256          # alpaca-lora cutoff_len, counting BOS and EOS
    train_on_inputs: bool = False  # alpaca-lora defaults to True; our loss is over response
                                   #   tokens (the step semantics), so prompts are masked
    shuffle: bool = True           # shuffle each epoch by (seed, epoch); --no-shuffle: file order
    gradient_checkpointing: bool = False  # keep only each layer's input and recompute the layer
                                   #   in the backward: far less GPU memory, one more forward;
                                   #   the same results bit for bit
    seed: int = 42                 # data order, LoRA init, dropout

    # -- optimizer (torch.optim.AdamW, as the HF Trainer's adamw_torch) ---------------
    lr: float = 3e-4               # alpaca-lora learning_rate
    weight_decay: float = 0.0      # HF TrainingArguments default (alpaca-lora sets none)
    adam_beta1: float = 0.9        # HF TrainingArguments defaults
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    max_grad_norm: float = 1.0     # HF TrainingArguments default; global norm, as clip_grad_norm_
    lr_scheduler: str = "linear"   # HF default; "constant" | "linear" | "cosine", all with warmup
    warmup_steps: int = 5          # alpaca-lora: 100, longer than a whole demo run

    # -- LoRA (PEFT LoraConfig) ------------------------------------------------------
    lora_r: int = 8                # alpaca-lora lora_r
    lora_alpha: float = 16         # alpaca-lora lora_alpha (scale alpha / r); an integer stays one
    lora_dropout: float = 0.05     # alpaca-lora lora_dropout
    target_modules: list = field(default_factory=lambda: ["q_proj", "v_proj"])  # list[str]

    # -- starting points and checkpoints ---------------------------------------------
    init_adapter: str | None = None  # PEFT adapter folder to start from instead of PEFT's init
    save_every: int = 0            # > 0: training-state checkpoint every N optimizer steps
    resume: str | None = None      # checkpoint folder to continue from

    # ---------------------------------------------------------------------------------

    def __post_init__(self):
        self.validate()

    def validate(self) -> "TrainConfig":
        """Check every field's type and range; raise ConfigError naming the field."""
        for f in dataclasses.fields(self):
            setattr(self, f.name, _check_type(f.name, getattr(self, f.name), _KIND[f.name]))
        _require(self.backend in BACKENDS, "backend", f"must be one of {', '.join(BACKENDS)}")
        _require(self.lr_scheduler in LR_SCHEDULERS, "lr_scheduler",
                 f"must be one of {', '.join(LR_SCHEDULERS)}")
        for name in ("model", "data", "out"):
            _require(getattr(self, name) != "", name, "must not be empty")
        for name in ("epochs", "micro_batch_size", "grad_accum", "lora_r"):
            _require(getattr(self, name) >= 1, name, "must be >= 1")
        _require(self.lora_alpha > 0, "lora_alpha", "must be > 0")
        for name in ("max_steps", "warmup_steps", "save_every", "seed"):
            _require(getattr(self, name) >= 0, name, "must be >= 0")
        for name in ("epochs", "max_steps", "warmup_steps", "save_every"):   # counts the page shows: JS numbers
            _require(getattr(self, name) <= MAX_COUNT, name, f"must be <= {MAX_COUNT}")
        _require(self.cutoff_len >= 2, "cutoff_len", "must be >= 2 (BOS plus one token)")
        _require(self.lr > 0, "lr", "must be > 0")
        _require(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        _require(self.max_grad_norm > 0, "max_grad_norm", "must be > 0")
        _require(0 <= self.adam_beta1 < 1, "adam_beta1", "must be in [0, 1)")
        _require(0 <= self.adam_beta2 < 1, "adam_beta2", "must be in [0, 1)")
        _require(self.adam_eps > 0, "adam_eps", "must be > 0")
        _require(0 <= self.lora_dropout < 1, "lora_dropout", "must be in [0, 1)")
        _require(len(self.target_modules) > 0, "target_modules", "must name at least one module")
        for m in self.target_modules:
            _require(m in LORA_MODULES, "target_modules",
                     f"unknown module {m!r}; choose from {', '.join(LORA_MODULES)}")
        _require(len(set(self.target_modules)) == len(self.target_modules), "target_modules",
                 "lists a module twice")
        return self

    # -- dict (the page's JSON) ------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        """Fields from a JSON-like dict; missing keys keep their defaults, unknown keys
        and wrong types are errors."""
        if not isinstance(d, dict):
            raise ConfigError(f"config: expected an object, got {type(d).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(k for k in d if k not in names)
        if unknown:
            raise ConfigError(f"{unknown[0]}: unknown config field")
        kw = {k: _check_type(k, v, _KIND[k]) for k, v in d.items()}
        return cls(**kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["target_modules"] = list(self.target_modules)
        return d

    # -- command line ----------------------------------------------------------------

    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """One flag per field; defaults are left as None so that from_cli can tell what
        was given (and leave the rest to the dataclass)."""
        defaults = cls()
        for f in dataclasses.fields(cls):
            kind, default = _KIND[f.name], getattr(defaults, f.name)
            flag = "--" + f.name.replace("_", "-")
            if kind is bool and default:
                parser.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name,
                                    action="store_const", const=False, default=None,
                                    help=f"turn off {f.name} (default: on)")
            elif kind is bool:
                parser.add_argument(flag, dest=f.name, action="store_const", const=True,
                                    default=None, help=f"turn on {f.name} (default: off)")
            elif kind is list:
                parser.add_argument(flag, dest=f.name, type=_comma_list, default=None,
                                    metavar="A,B", help=f"comma-separated (default: {','.join(default)})")
            else:
                parser.add_argument(flag, dest=f.name, type=_cli_type(kind), default=None,
                                    choices=_CHOICES.get(f.name), help=f"(default: {default})")
        return parser

    @classmethod
    def from_cli(cls, args: argparse.Namespace, base: dict | None = None) -> "TrainConfig":
        """The flags given; the rest from `base` (a to_dict() dict, e.g. the run a --resume
        checkpoint was saved with), else the defaults."""
        names = [f.name for f in dataclasses.fields(cls)]
        given = {k: getattr(args, k) for k in names if getattr(args, k, None) is not None}
        return cls.from_dict({**{k: v for k, v in (base or {}).items() if k in names}, **given})


# -- type checking ------------------------------------------------------------------

# field -> int | float | str | bool | list (of str) | "optional str"
_KIND = {f.name: f.type for f in dataclasses.fields(TrainConfig)}
_KIND = {k: {"str": str, "int": int, "float": float, "bool": bool, "list": list,
             "str | None": "optional str"}[v] for k, v in _KIND.items()}
_KIND["lora_alpha"] = "number"   # PEFT's is int or float: 16 stays 16 (adapter_config.json as PEFT writes it)


def _check_type(name, value, kind):
    if kind == "optional str":
        if value is None:
            return None
        kind = str
    if kind == "number":
        value = _check_type(name, value, float)
        return int(value) if value.is_integer() else value
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: expected true or false, got {value!r}")
    elif kind is int:
        # JSON numbers from the page may arrive as 3.0; bools are not numbers here.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}: expected an integer, got {value!r}")
    elif kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: expected a number, got {value!r}")
        value = float(value)
        if not math.isfinite(value):
            raise ConfigError(f"{name}: expected a finite number, got {value!r}")
    elif kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: expected a string, got {value!r}")
    elif kind is list:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{name}: expected a list of strings, got {value!r}")
        value = list(value)
    return value


_CHOICES = {"backend": BACKENDS, "lr_scheduler": LR_SCHEDULERS}


def _require(ok: bool, name: str, why: str) -> None:
    if not ok:
        raise ConfigError(f"{name}: {why}")


def _cli_type(kind):
    return {"optional str": str, "number": float}.get(kind, kind)


def _comma_list(text: str) -> list:
    return [s.strip() for s in text.split(",") if s.strip()]
