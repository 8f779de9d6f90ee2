"""TrainConfig: defaults, type checks naming the field, dict and CLI round trips."""
from __future__ import annotations

import argparse
import json

import pytest

from bitlora.config import ConfigError, TrainConfig

FLAGS = ("--model --data --out --backend --epochs --max-steps --micro-batch-size --grad-accum "
         "--lr --weight-decay --max-grad-norm --lora-r --lora-alpha --lora-dropout --target-modules "
         "--cutoff-len --train-on-inputs --no-shuffle --seed --lr-scheduler --warmup-steps "
         "--init-adapter --save-every --resume").split()


def _parser():
    return TrainConfig.add_cli_args(argparse.ArgumentParser())


def test_defaults_are_alpaca_lora_like():
    c = TrainConfig()
    assert (c.lr, c.epochs, c.micro_batch_size, c.cutoff_len) == (3e-4, 3, 4, 256)
    assert (c.lora_r, c.lora_alpha, c.lora_dropout, c.target_modules) == (8, 16, 0.05, ["q_proj", "v_proj"])
    assert (c.weight_decay, c.adam_beta1, c.adam_beta2, c.adam_eps, c.max_grad_norm) == (0.0, 0.9, 0.999, 1e-8, 1.0)
    assert c.lr_scheduler == "linear" and c.model == "demo" and c.data == "demo"
    assert c.shuffle and not c.train_on_inputs and c.resume is None and c.init_adapter is None


def test_every_issue_flag_exists():
    opts = _parser()._option_string_actions
    for f in FLAGS:
        assert f in opts, f


def test_cli_fills_the_same_object_as_json():
    args = _parser().parse_args(
        ["--lr", "1e-3", "--epochs", "2", "--no-shuffle", "--train-on-inputs", "--target-modules",
         "q_proj,k_proj,down_proj", "--backend", "browser", "--resume", "ck", "--lr-scheduler", "cosine"])
    cli = TrainConfig.from_cli(args)
    js = TrainConfig.from_dict(json.loads(json.dumps({
        "lr": 1e-3, "epochs": 2, "shuffle": False, "train_on_inputs": True,
        "target_modules": ["q_proj", "k_proj", "down_proj"], "backend": "browser", "resume": "ck",
        "lr_scheduler": "cosine"})))
    assert cli == js
    assert TrainConfig.from_cli(_parser().parse_args([])) == TrainConfig()


def test_dict_round_trip():
    c = TrainConfig(lr=5e-4, target_modules=["o_proj"], max_steps=7, init_adapter="a")
    assert TrainConfig.from_dict(json.loads(json.dumps(c.to_dict()))) == c


@pytest.mark.parametrize("field,value,msg", [
    ("lr", "0.1", "lr: expected a number"),
    ("lr", True, "lr: expected a number"),
    ("lr", float("nan"), "lr: expected a finite"),
    ("lr", 0, "lr: must be > 0"),
    ("epochs", 1.5, "epochs: expected an integer"),
    ("epochs", True, "epochs: expected an integer"),
    ("epochs", 0, "epochs: must be >= 1"),
    ("shuffle", 1, "shuffle: expected true or false"),
    ("target_modules", "q_proj", "target_modules: expected a list"),
    ("target_modules", ["q_proj", "lm_head"], "target_modules: unknown module 'lm_head'"),
    ("target_modules", [], "target_modules: must name"),
    ("target_modules", ["q_proj", "q_proj"], "target_modules: lists a module twice"),
    ("backend", "cuda", "backend: must be one of"),
    ("lr_scheduler", "step", "lr_scheduler: must be one of"),
    ("cutoff_len", 1, "cutoff_len: must be >= 2"),
    ("lora_dropout", 1.0, "lora_dropout: must be in"),
    ("resume", 3, "resume: expected a string"),
    ("no_such_field", 1, "no_such_field: unknown config field"),
])
def test_bad_values_name_the_field(field, value, msg):
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_dict({field: value})
    assert str(e.value).startswith(msg), str(e.value)


def test_integral_float_from_json_is_an_int():
    c = TrainConfig.from_dict({"epochs": 2.0, "lr": 1})
    assert c.epochs == 2 and type(c.epochs) is int and type(c.lr) is float


def test_cli_rejects_bad_choice():
    with pytest.raises(SystemExit):
        _parser().parse_args(["--backend", "cuda"])


def test_counts_stay_exact_as_js_numbers():
    """max_steps 1e20 reached the page as a BigInt and broke its progress bar: counts are
    capped at 10**9."""
    from bitlora.config import ConfigError, TrainConfig
    for name in ("epochs", "max_steps", "warmup_steps", "save_every"):
        with pytest.raises(ConfigError, match=name):
            TrainConfig(**{name: 10**20})
    assert TrainConfig(max_steps=10**9).max_steps == 10**9


@pytest.mark.parametrize("argv, says", [
    (["serve", "--port", "99999"], "99999 is not a TCP port"),
    (["bench", "train", "--shape", "demo", "--steps", "0"], "--steps: must be at least 1"),
    (["bench", "generate", "--shape", "demo", "--new", "0"], "--new: must be at least 1"),
    (["bench", "optim", "--tensors", "0"], "--tensors: must be at least 1"),
    (["bench", "train", "--shape", "demo", "--steps", "1", "--seq", "16", "--no-torch", "--target-modules", "foo"],
     "unknown module 'foo'"),
])
def test_cli_bad_values_are_messages_not_tracebacks(argv, says, capsys):
    """Out-of-range ports and benchmark counts, and settings a benchmark's model refuses:
    exit 2 and one line naming the flag, not a traceback (or, for a count of 0, a
    division by zero or a figure of negative tokens/s)."""
    from bitlora.app.cli import main
    try:
        rc = main(argv)
    except SystemExit as e:      # argparse's own refusal
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2 and says in err and "Traceback" not in err, err
