"""Recorded programs: a step's dispatches recorded once and replayed give the same bits as
recording them every step (a kernel chain, and the Trainer: losses, gradient norms and
the adapter after N steps, with dropout, accumulation and gradient checkpointing), natively
and in Chromium; a new micro-batch shape records a new program; a recording refuses what a
replay could not repeat and fails without leaving anything behind."""
import pytest

BASE = dict(micro_batch_size=2, grad_accum=2, lora_r=4, lora_alpha=8, lora_dropout=0.1, seed=3,
            target_modules=["q_proj", "v_proj", "down_proj"], lr=3e-3, warmup_steps=1)


@pytest.mark.parametrize("python_replay", [False, True])
def test_replay_repeats_recording_bitwise(run_case, backend, python_replay):
    if python_replay and backend == "native":
        pytest.skip("the browser's fallback (no static/replay.js, as in a JupyterLite kernel)")
    r = run_case("replay_cases", "case_record_replay", n=1000, steps=3, python_replay=python_replay)
    # the page's worker loads replay.js
    assert r["how"] == {"native": "native", "browser": "python" if python_replay else "js"}[backend]
    assert r["replay"]["y"] == r["record"]["y"]
    assert r["replay"]["keep"] == r["record"]["keep"]
    assert r["record"]["dispatches"] == r["replay"]["dispatches"] == [3, 3, 3]
    assert r["replay"]["recorded"] == 1
    for what, err in r["refused"].items():
        assert err is not None and "inside a recording" in err, (what, err)
    assert r["made"] == 1
    assert r["oom"] is not None and "too big" in r["oom"]
    assert r["after_failure"] == r["expect_after"]


@pytest.mark.parametrize("checkpointing", [False, True])
def test_trainer_replay_is_bitwise_the_same(run_case, checkpointing):
    r = run_case("replay_cases", "case_trainer_replay", config=dict(BASE, gradient_checkpointing=checkpointing),
                 steps=4)
    a, b = r["record"], r["replay"]
    assert a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]
    assert a["adapter"] == b["adapter"]
    assert a["recorded"] == 0
    # every distinct micro-batch shape recorded once; the demo data has several
    assert b["recorded"] == b["programs"] == b["shapes"] >= 2
