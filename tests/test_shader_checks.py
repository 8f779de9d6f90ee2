"""BITLORA_SHADER_CHECKS (gpu/native.py): modules compiled with naga's runtime checks
switched off give the same training step, bit for bit, as the default modules."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("wgpu")


def _loss(checks):
    env = dict(os.environ)
    env.pop("BITLORA_SHADER_CHECKS", None)
    if checks is not None:
        env["BITLORA_SHADER_CHECKS"] = checks
    out = subprocess.run([sys.executable, "-m", "bitlora.bench.train", "--shape", "demo", "--micro-batch", "2",
                          "--seq", "32", "--steps", "2", "--no-torch"], env=env, capture_output=True, text=True,
                         timeout=600, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("BENCH "))
    return json.loads(line[6:])["loss_last"]


def test_unchecked_modules_train_the_same_bits():
    base = _loss(None)
    assert base == base   # a number, not NaN
    assert _loss("0") == base
