"""BITLORA_SHADER_CHECKS (gpu/native.py): modules compiled with any of naga's runtime
checks (the default: index clamping only; 3: wgpu's own, with loop bounding too; 0: none)
give the same training step, bit for bit."""
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


def test_runtime_checks_train_the_same_bits():
    base = _loss(None)
    assert base == base   # a number, not NaN
    assert _loss("0") == base
    assert _loss("3") == base


def test_default_checks_are_index_clamping_only(monkeypatch):
    from bitlora.gpu import native
    if native._lib is None:
        pytest.skip("wgpu-native's C entry points are not reachable: modules use wgpu-py's own call")
    monkeypatch.delenv("BITLORA_SHADER_CHECKS", raising=False)
    assert native.NativeBackend().shader_checks == native.SHADER_CHECKS == 1
