"""Out of GPU memory, natively: a device memory budget (Device.memory_limit) smaller
than a run needs. The run stops with gpu.OutOfMemory naming the buffer that did not fit
and settings that would; the buffers of the failed set-up are given back, the last
checkpoint is left as it was, a run with a suggested setting then works, and
`bitlora train` exits with the message. (The page's version: tests/test_app_faults.py.)"""
import hashlib
import re

import pytest

from bitlora import gpu
from bitlora.app.cli import main as cli
from bitlora.config import TrainConfig
from bitlora.model import load_model
from bitlora.train import Trainer

from fixtures.make_tiny import SMALL, make_hf

RECORDS = [{"instruction": f"Add {a} and {b}.", "input": "", "output": f"{a + b}"} for a, b in
           [(1, 2), (3, 4), (10, 7), (2, 9), (5, 5), (12, 30), (8, 1), (6, 6)]]
CFG = dict(micro_batch_size=4, grad_accum=1, lr=3e-3, lora_r=4, warmup_steps=0, save_every=2,
           target_modules=["q_proj", "v_proj", "down_proj"])


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("oom") / "model", "online_f32", dims=SMALL, seed=2)


def hashes(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def need(model, tr, **changes):
    """GPU bytes a run with `changes` allocates besides the model's weights."""
    return tr.memory_estimate(TrainConfig.from_dict({**tr.config.to_dict(), **changes}))["total"] - model.weight_bytes


def test_budget_too_small_stops_with_advice_and_keeps_the_checkpoint(tiny_folder, tmp_path):
    model = load_model(str(tiny_folder))
    dev = model.dev
    first = Trainer(model, RECORDS, dict(CFG, max_steps=2), out=str(tmp_path / "run"))
    first.train()
    first.close()
    ckpt = tmp_path / "run" / "checkpoint"
    saved = hashes(ckpt)
    base = dev.allocated
    tr = Trainer(model, RECORDS, dict(CFG, max_steps=4, resume=str(ckpt)), out=str(tmp_path / "run"))
    full, light = need(model, tr), need(model, tr, gradient_checkpointing=True)
    assert light < full
    dev.memory_limit = base + (full + light) // 2      # gradient checkpointing fits, the plain run does not
    try:
        with pytest.raises(gpu.OutOfMemory) as err:
            tr.train()
        text = str(err.value)
        print("\n" + text)
        assert text.startswith("Out of GPU memory: buffer '") and err.value.label in text
        assert "does not fit" in text and "Settings that fit: gradient_checkpointing=True" in text
        assert dev.allocated == base and tr.lora is None     # the failed set-up gave its buffers back
        assert hashes(ckpt) == saved                          # the checkpoint is as it was
        # the first suggestion works: the run resumes from the checkpoint within the budget
        fix = re.search(r"Settings that fit: ([^(]*) \(", text).group(1)
        changes = {k: v == "True" if v in ("True", "False") else int(v)
                   for k, v in (kv.split("=") for kv in fix.split(", "))}
        again = Trainer(model, RECORDS, dict(CFG, max_steps=4, resume=str(ckpt), **changes), out=str(tmp_path / "run"))
        again.train()
        assert [m["step"] for m in again.metrics] == [1, 2, 3, 4] and dev.allocated <= dev.memory_limit
        again.close()
        assert dev.allocated == base
    finally:
        dev.memory_limit = None


def test_cli_exits_with_the_message(tiny_folder, tmp_path, capsys):
    model = load_model(str(tiny_folder))       # the CLI loads its own copy on the same device
    dev = model.dev
    tr = Trainer(model, RECORDS, dict(CFG, max_steps=1))
    dev.memory_limit = dev.allocated + model.weight_bytes + need(model, tr) // 3
    try:
        data = tmp_path / "data.json"
        data.write_text(__import__("json").dumps(RECORDS))
        rc = cli(["train", "--model", str(tiny_folder), "--data", str(data), "--out", str(tmp_path / "out"),
                  "--max-steps", "1", "--micro-batch-size", "4", "--grad-accum", "1", "--lora-r", "4"])
    finally:
        dev.memory_limit = None
    err = capsys.readouterr().err
    print(err)
    assert rc == 2
    assert "bitlora train: Out of GPU memory: buffer '" in err and "Settings that fit" in err
