"""Training behaviour: a resumed run equals an uninterrupted one (natively, and with
--backend browser, whose checkpoints the native backend resumes too); two identical
runs are bitwise equal; bitlora train writes PEFT files and metrics.jsonl."""
import asyncio
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from bitlora import gpu
from bitlora.model import load_model
from bitlora.train import Trainer

from fixtures.make_tiny import SMALL, make_hf

RECORDS = [{"instruction": f"Add {a} and {b}.", "input": "", "output": f"{a + b}"} for a, b in
           [(1, 2), (3, 4), (10, 7), (2, 9), (5, 5), (12, 30), (8, 1), (6, 6)]]
CFG = dict(micro_batch_size=2, grad_accum=2, max_steps=6, lr=3e-3, lora_r=4, lora_alpha=8, lora_dropout=0.1,
           warmup_steps=1, seed=5, target_modules=["q_proj", "v_proj", "down_proj"])


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    return make_hf(tmp_path_factory.mktemp("resume") / "model", "online_f32", dims=SMALL, seed=2)


@pytest.fixture(scope="module")
def tiny_model(tiny_folder):
    return load_model(str(tiny_folder))


def test_gradient_checkpointing_is_bitwise_the_same_in_less_memory(tiny_model, tmp_path):
    """Recomputing each layer in the backward repeats the kept activations exactly: the
    same losses, gradient norms and adapter, bit for bit, with fewer activation bytes."""
    runs = {}
    for ckpt in (False, True):
        tr = Trainer(tiny_model, RECORDS, dict(CFG, gradient_checkpointing=ckpt), out=str(tmp_path / str(ckpt)))
        tr.train()
        runs[ckpt] = (tr.metrics, gpu.run(tr.aadapter_tensors()), tr.memory_estimate())
    (m0, a0, e0), (m1, a1, e1) = runs[False], runs[True]
    assert [(m["loss"], m["grad_norm"]) for m in m1] == [(m["loss"], m["grad_norm"]) for m in m0]
    assert {k: list(v[1]) for k, v in a1.items()} == {k: list(v[1]) for k, v in a0.items()}
    assert e1["parts"]["activations"] < e0["parts"]["activations"]


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_training_where_the_head_dim_is_not_a_multiple_of_4(tmp_path, kind):
    """Head dim 18: on a CPU adapter the GPU attention kernels are the fallback, and the
    backward takes the forward's out and lse there too; both kinds prepare what they run."""
    model = load_model(str(make_hf(tmp_path / "d18", "online_f32", dims=dict(SMALL, hidden_size=72),
                                   seed=4)))
    assert model.D == 18
    with model.dev.kind_as(kind):
        tr = Trainer(model, RECORDS, dict(CFG, max_steps=2), out=str(tmp_path / "out"))
        tr.train()
    assert len(tr.metrics) == 2 and all(m["loss"] == m["loss"] and m["loss"] > 0 for m in tr.metrics)


def test_resume_equals_uninterrupted_and_runs_repeat_bitwise(tiny_model, tmp_path):
    full = Trainer(tiny_model, RECORDS, CFG, out=str(tmp_path / "a"))
    full.train()
    again = Trainer(tiny_model, RECORDS, CFG, out=str(tmp_path / "b"))
    again.train()
    assert [m["loss"] for m in again.metrics] == [m["loss"] for m in full.metrics]   # bitwise
    part = Trainer(tiny_model, RECORDS, dict(CFG, save_every=3, max_steps=6), out=str(tmp_path / "d"))
    part.on_step = lambda row: row["step"] == 3 and part.stop()
    part.train()
    assert part.step in (3, 4)
    resumed = Trainer(tiny_model, RECORDS, dict(CFG, resume=str(tmp_path / "d" / "checkpoint")),
                      out=str(tmp_path / "e"))
    resumed.train()
    losses = [m["loss"] for m in resumed.metrics]
    assert [m["step"] for m in resumed.metrics] == list(range(1, 7))
    assert losses == [m["loss"] for m in full.metrics], (losses, [m["loss"] for m in full.metrics])


def test_resume_refuses_other_batching_or_adapter_settings_and_names_the_rest(tiny_model, tmp_path):
    """A checkpoint's cursor is a place in its run's batching and its tensors have its
    adapter's shape: a resume with another micro-batch, accumulation, seed, shuffle, rank,
    alpha or set of modules is refused before any GPU buffer is made, naming the settings;
    the optimizer's and the length's may change (listed in resume_changes)."""
    part = Trainer(tiny_model, RECORDS, dict(CFG, save_every=2, max_steps=2), out=str(tmp_path / "p"))
    part.train()
    ckpt = str(tmp_path / "p" / "checkpoint")
    for change in (dict(micro_batch_size=1), dict(grad_accum=1), dict(seed=6), dict(shuffle=False),
                   dict(lora_r=8), dict(lora_alpha=4), dict(target_modules=["q_proj"]),
                   dict(target_modules=["q_proj", "k_proj", "v_proj", "down_proj"])):
        tr = Trainer(tiny_model, RECORDS, dict(CFG, resume=ckpt, **change), out=str(tmp_path / "x"))
        with pytest.raises(ValueError, match=next(iter(change))):
            tr.train()
        assert tr.lora is None   # nothing was allocated, and a later setup() checks again
    tr = Trainer(tiny_model, RECORDS, dict(CFG, resume=ckpt, lr=1e-3, max_steps=3,
                                           target_modules=["down_proj", "v_proj", "q_proj"]), out=str(tmp_path / "y"))
    tr.train()
    assert tr.resume_changes == ["max_steps 3 (checkpoint: 2)", "lr 0.001 (checkpoint: 0.003)"]
    assert [m["step"] for m in tr.metrics] == [1, 2, 3]


def test_cli_resume_takes_the_checkpoints_settings_where_no_flag_is_given(tmp_path):
    """`bitlora train --resume CKPT --max-steps N`: every setting not on the command line
    comes from the run that saved CKPT, and the losses are the uninterrupted run's; a flag
    that contradicts the checkpoint's batching is refused."""
    bin_ = pathlib.Path(sys.executable).parent / "bitlora"
    run = lambda *a: subprocess.run([str(bin_), "train", *a], capture_output=True, text=True, timeout=600)  # noqa: E731
    flags = ["--micro-batch-size", "2", "--grad-accum", "2", "--cutoff-len", "64", "--lr-scheduler", "constant",
             "--warmup-steps", "0", "--lr", "3e-3", "--seed", "3", "--lora-r", "4"]
    losses = lambda out: {r["step"]: r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())}  # noqa: E731
    full = run(*flags, "--max-steps", "3", "--out", str(tmp_path / "full"))
    assert full.returncode == 0, full.stderr[-2000:]
    part = run(*flags, "--max-steps", "1", "--save-every", "1", "--out", str(tmp_path / "part"))
    assert part.returncode == 0, part.stderr[-2000:]
    ckpt = str(tmp_path / "part" / "checkpoint")
    bad = run("--resume", ckpt, "--micro-batch-size", "1", "--max-steps", "3", "--out", str(tmp_path / "bad"))
    assert bad.returncode != 0 and "micro_batch_size" in bad.stderr and "Traceback" not in bad.stderr
    res = run("--resume", ckpt, "--max-steps", "3", "--out", str(tmp_path / "res"))
    assert res.returncode == 0, res.stderr[-2000:]
    assert "max_steps 3 (checkpoint: 1)" in res.stderr
    full_losses = losses(tmp_path / "full")
    assert losses(tmp_path / "res") == {2: full_losses[2], 3: full_losses[3]}
    assert json.loads((tmp_path / "res" / "adapter_config.json").read_text())["r"] == 4


def test_atrain_until_step_goes_on_where_it_stopped_and_awaits_the_checkpoint_hook(tiny_model, tmp_path):
    """atrain(until_step=3) takes steps 1-3; atrain() then finishes the run with the
    uninterrupted run's losses. An async on_checkpoint is awaited after each
    checkpoint is on disk."""
    from bitlora import gpu
    from bitlora.formats.state import STATE_FILE
    full = Trainer(tiny_model, RECORDS, CFG, out=str(tmp_path / "a"))
    full.train()
    tr = Trainer(tiny_model, RECORDS, dict(CFG, save_every=2), out=str(tmp_path / "b"))
    saved = []

    async def on_checkpoint(step):
        await asyncio.sleep(0)
        saved.append((step, (tmp_path / "b" / "checkpoint" / STATE_FILE).exists()))
    tr.on_checkpoint = on_checkpoint

    async def go():
        await tr.setup()
        await tr.atrain(until_step=3)
        assert tr.step == 3 and [m["step"] for m in tr.metrics] == [1, 2, 3]
        await tr.atrain()
    gpu.run(go())
    assert saved == [(2, True), (4, True), (6, True)]
    assert [m["loss"] for m in tr.metrics] == [m["loss"] for m in full.metrics]   # bitwise


def test_save_first_and_save_interval_add_checkpoints_and_change_nothing_else(tiny_model, tmp_path):
    """save_first writes a checkpoint after the first step (the page: a reload before the
    first save_every checkpoint lost every step); save_interval_s one whenever that long
    has passed, at least 20 x the last save's duration apart; the losses stay bitwise."""
    import time
    full = Trainer(tiny_model, RECORDS, CFG, out=str(tmp_path / "full"))
    full.train()
    runs = {}
    for name, first, interval in (("first", True, None), ("never", False, 1e9), ("always", False, 0.0)):
        tr = Trainer(tiny_model, RECORDS, dict(CFG, save_every=4), out=str(tmp_path / name))
        tr.save_first, tr.save_interval_s = first, interval
        saved = []
        tr.on_checkpoint = lambda step, tr=tr, saved=saved: saved.append((step, time.monotonic(), tr.save_s))
        tr.train()
        runs[name] = saved
        assert [m["loss"] for m in tr.metrics] == [m["loss"] for m in full.metrics], name   # bitwise
    assert [s for s, _, _ in runs["first"]] == [1, 4]
    assert [s for s, _, _ in runs["never"]] == [4]
    always = runs["always"]
    assert always[0][0] == 1 and 4 in [s for s, _, _ in always]
    for (s0, t0, _), (s1, t1, cost) in zip(always, always[1:]):   # cost: what s0's save took
        assert s1 > s0 and (s1 % 4 == 0 or t1 - t0 >= 20 * cost), (s0, s1, t1 - t0, cost)
    print(f"\nsave_interval_s 0: checkpoints at steps {[s for s, _, _ in always]}")


def test_cli_train_writes_peft_files_and_metrics(tmp_path):
    out = tmp_path / "out"
    bin_ = pathlib.Path(sys.executable).parent / "bitlora"
    r = subprocess.run([str(bin_), "train", "--max-steps", "2", "--micro-batch-size", "2", "--grad-accum", "1",
                        "--cutoff-len", "64", "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    conf = json.loads((out / "adapter_config.json").read_text())
    assert conf["peft_type"] == "LORA" and conf["target_modules"] == ["q_proj", "v_proj"]
    assert (out / "adapter_model.safetensors").stat().st_size > 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("step", "loss", "grad_norm", "lr", "tokens", "tokens_per_s"):
        assert key in rows[0]
    bad = subprocess.run([str(bin_), "train", "--data", str(tmp_path / "missing.json"), "--out", str(out)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "missing.json" in bad.stderr


@pytest.mark.browser
def test_browser_resume_equals_uninterrupted(tiny_folder, tiny_model, tmp_path, browser_session):
    """bitlora train --backend browser: --save-every writes OUT/checkpoint; --resume from
    the step-2 checkpoint repeats the uninterrupted run's losses exactly; each backend
    resumes the other's checkpoint (losses within 1e-4: other GPUs sum in other orders)."""
    from bitlora.app.train_browser import train_in_browser
    from bitlora.config import TrainConfig
    from bitlora.metrics import read_metrics

    data = tmp_path / "data.json"
    data.write_text(json.dumps(RECORDS))
    base = dict(CFG, max_steps=4, grad_accum=1, model=str(tiny_folder), data=str(data), backend="browser")
    snap = tmp_path / "ckpt2"

    def on_checkpoint(step):             # keep the step-2 checkpoint (step 4 overwrites it)
        if step == 2:
            shutil.copytree(tmp_path / "full" / "checkpoint", snap)

    cfg = TrainConfig.from_dict(dict(base, out=str(tmp_path / "full"), save_every=2))
    assert train_in_browser(cfg, browser_session, on_checkpoint) == 0
    full = read_metrics(tmp_path / "full" / "metrics.jsonl")
    assert [r["step"] for r in full] == [1, 2, 3, 4]
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (tmp_path / "full" / name).stat().st_size > 0
        assert (snap / name).stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "full" / "checkpoint").iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors", "training_state.safetensors"]

    cfg = TrainConfig.from_dict(dict(base, out=str(tmp_path / "resumed"), resume=str(snap)))
    assert train_in_browser(cfg, browser_session) == 0
    resumed = read_metrics(tmp_path / "resumed" / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [3, 4]
    assert [r["loss"] for r in resumed] == [r["loss"] for r in full[2:]]       # bitwise
    assert ((tmp_path / "resumed" / "adapter_model.safetensors").read_bytes()
            == (tmp_path / "full" / "adapter_model.safetensors").read_bytes())

    native = Trainer(tiny_model, RECORDS, dict(base, backend="native", resume=str(snap)))
    native.train()
    assert [m["step"] for m in native.metrics] == [1, 2, 3, 4]
    close = lambda rows: all(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"])  # noqa: E731
                             for a, b in zip(rows, full[2:]))
    assert close(native.metrics[2:]), (native.metrics, full)

    part = Trainer(tiny_model, RECORDS, dict(base, backend="native", save_every=2), out=str(tmp_path / "native"))
    part.on_step = lambda row: row["step"] == 2 and part.stop()
    part.train()
    cfg = TrainConfig.from_dict(dict(base, out=str(tmp_path / "from-native"),
                                     resume=str(tmp_path / "native" / "checkpoint")))
    assert train_in_browser(cfg, browser_session) == 0
    rows = read_metrics(tmp_path / "from-native" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [3, 4] and close(rows), (rows, full)


def test_browser_resume_refuses_a_missing_checkpoint_before_starting_chromium(tmp_path, capsys):
    from bitlora.app.train_browser import train_in_browser
    from bitlora.config import TrainConfig
    cfg = TrainConfig.from_dict(dict(backend="browser", out=str(tmp_path / "out"), resume=str(tmp_path / "nope")))
    assert train_in_browser(cfg, session=object()) == 2    # the session is never touched
    assert "no training state" in capsys.readouterr().err


def test_user_errors_are_messages(tiny_folder, tiny_model, tmp_path):
    """--out naming a file is a message and exit 2, not a traceback; Trainer.generate with a
    record that has no instruction names the field."""
    (tmp_path / "afile").write_text("x")
    bin_ = pathlib.Path(sys.executable).parent / "bitlora"
    r = subprocess.run([str(bin_), "train", "--out", str(tmp_path / "afile")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and "cannot make the output folder" in r.stderr and "Traceback" not in r.stderr
    tr = Trainer(tiny_model, RECORDS, dict(CFG, max_steps=1), out=str(tmp_path / "o"))
    with pytest.raises(ValueError, match="missing field 'instruction'"):
        tr.generate({"input": "2 and 3"})
    assert tr.lora is None   # refused before the adapter was made
    with pytest.raises(ValueError, match="lone surrogate"):
        tiny_model.generate("half an emoji: \ud83d", max_new_tokens=2)
    bad = Trainer(tiny_model, RECORDS + [{"instruction": "cut \ud83d", "output": "x"}], dict(CFG, max_steps=1))
    assert bad.dataset.invalid == [(len(RECORDS), bad.dataset.invalid[0][1])] and "lone surrogate" in bad.dataset.invalid[0][1]
    folder = tmp_path / "no-tokenizer"
    shutil.copytree(tiny_folder, folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="has no tokenizer"):
        Trainer(load_model(str(folder)), RECORDS, dict(CFG, max_steps=1))


def test_cli_fresh_run_into_an_earlier_runs_folder(tmp_path):
    """A fresh `bitlora train --out OUT` where OUT holds an earlier run says so (and how to
    resume it instead), keeps the earlier run's files until its own first step lands, then
    holds this run alone: its metrics only, and no checkpoint of the earlier run left
    for a later --resume to mix in."""
    bin_ = pathlib.Path(sys.executable).parent / "bitlora"
    run = lambda *a: subprocess.run([str(bin_), "train", "--micro-batch-size", "1", "--grad-accum", "1", *a],  # noqa: E731
                                    capture_output=True, text=True, timeout=600)
    out = tmp_path / "out"
    first = run("--max-steps", "3", "--save-every", "1", "--out", str(out))
    assert first.returncode == 0, first.stderr[-2000:]
    assert (out / "checkpoint").is_dir() and len((out / "metrics.jsonl").read_text().splitlines()) == 3
    second = run("--max-steps", "1", "--lora-r", "4", "--out", str(out))
    assert second.returncode == 0, second.stderr[-2000:]
    assert "holds an earlier run (metrics to step 3, an adapter, a checkpoint)" in second.stderr, second.stderr
    assert f"--resume {out / 'checkpoint'}" in second.stderr
    assert [json.loads(r)["step"] for r in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    assert not (out / "checkpoint").exists()
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4


def test_cli_init_adapter_refuses_flags_that_contradict_it(tmp_path):
    """--init-adapter fixes rank, alpha and modules: a flag that says otherwise is refused
    (it was ignored, and the memory line counted the ignored rank), one that agrees is fine."""
    bin_ = pathlib.Path(sys.executable).parent / "bitlora"
    run = lambda *a: subprocess.run([str(bin_), "train", "--micro-batch-size", "1", "--grad-accum", "1",  # noqa: E731
                                     "--max-steps", "1", *a], capture_output=True, text=True, timeout=600)
    base = run("--lora-r", "4", "--out", str(tmp_path / "base"))
    assert base.returncode == 0, base.stderr[-2000:]
    init = ("--init-adapter", str(tmp_path / "base"))
    for flags, says in ((("--lora-r", "16"), "--lora-r contradicts"),
                        (("--target-modules", "q_proj,k_proj"), "--target-modules contradicts")):
        bad = run(*init, *flags, "--out", str(tmp_path / "bad"))
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr[-2000:]
        assert not (tmp_path / "bad" / "adapter_config.json").exists()
    ok = run(*init, "--lora-r", "4", "--out", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads((tmp_path / "ok" / "adapter_config.json").read_text())["r"] == 4


@pytest.mark.browser
def test_browser_ctrl_c_saves_the_adapter_so_far(tmp_path):
    """A terminal's Ctrl+C (SIGINT to the whole process group) during `bitlora train
    --backend browser`: Chromium and Playwright's driver are not in that group, so the
    run stops in the page at the step in flight and its adapter and metrics land in OUT,
    as natively; exit 130."""
    import os
    import signal
    import time
    bin_ = pathlib.Path(sys.executable).parent / "bitlora"
    out = tmp_path / "out"
    p = subprocess.Popen([str(bin_), "train", "--backend", "browser", "--max-steps", "100000", "--micro-batch-size",
                          "1", "--grad-accum", "1", "--out", str(out)], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines, deadline = [], time.monotonic() + 300
    try:
        for line in p.stdout:
            lines.append(line)
            if line.startswith("step 3:") or time.monotonic() > deadline:
                break
        os.killpg(p.pid, signal.SIGINT)
        rest, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    text = "".join(lines) + rest
    assert p.returncode == 130, text[-3000:]
    assert f"the adapter so far is in {out}" in text, text[-3000:]
    steps = [json.loads(r)["step"] for r in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps and steps == list(range(1, len(steps) + 1)) and len(steps) >= 3, steps
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 8
    assert (out / "adapter_model.safetensors").stat().st_size > 0


def test_out_folder_problem_is_found_before_any_model_loads(tmp_path, monkeypatch):
    """--out that cannot be made or written in is refused up front with the reason (it
    was found only after the model had loaded, as a bare errno line)."""
    import tempfile

    from bitlora.app.train_native import out_folder_problem
    assert out_folder_problem(str(tmp_path / "new")) is None and (tmp_path / "new").is_dir()
    (tmp_path / "afile").write_text("")
    assert "cannot make the output folder" in out_folder_problem(str(tmp_path / "afile"))

    def refuse(*a, **k):
        raise PermissionError(1, "Operation not permitted")
    monkeypatch.setattr(tempfile, "TemporaryFile", refuse)   # what an immutable folder answers (root too)
    assert out_folder_problem(str(tmp_path / "new")) == \
        f"--out {tmp_path / 'new'}: cannot write in the output folder (Operation not permitted)"
