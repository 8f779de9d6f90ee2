"""The GPU memory estimate (Model.memory_estimate, shown by the page and the CLI)
against what a real training step allocates (Device.peak_allocated): the estimate
adds up the same activation table, arena and split-K plans the step allocates from."""
import pytest

from bitlora import gpu
from bitlora.config import TrainConfig
from bitlora.demo import MODEL_DIR
from bitlora.model import load_model
from bitlora.train import Trainer


@pytest.mark.parametrize("settings", [
    dict(cutoff_len=128, micro_batch_size=4, grad_accum=1, target_modules=["q_proj", "v_proj"]),
    dict(cutoff_len=48, micro_batch_size=2, grad_accum=3, lora_r=4,
         target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
    dict(cutoff_len=128, micro_batch_size=4, grad_accum=2, gradient_checkpointing=True,
         target_modules=["q_proj", "v_proj", "down_proj"]),
])
def test_estimate_is_within_10_percent_of_the_real_peak(settings):
    base = gpu.run(gpu.get_device("native")).reset_peak()   # the device is shared by the session's tests
    model = load_model(str(MODEL_DIR))
    trainer = Trainer(model, "demo", TrainConfig(max_steps=1, **settings))
    est = trainer.memory_estimate()
    trainer.train()
    peak = model.dev.peak_allocated - base
    print(f"estimate {est['total']} B, peak {peak} B, parts {est['parts']}")
    assert abs(est["total"] - peak) <= 0.10 * peak, (est, peak)
    assert est["largest"] <= est["total"]


def test_a_micro_batch_larger_than_the_data_allocates_for_the_data():
    """micro_batch_size 64 on three records: activations for three sequences, as the
    estimate says, and the same step as micro_batch_size 3 (one micro-batch of all)."""
    model = load_model(str(MODEL_DIR))
    recs = [{"instruction": f"Add {a} and {a}.", "output": f"{2 * a}"} for a in (1, 2, 3)]
    runs = []
    for mb in (64, 3):
        base = model.dev.reset_peak()
        tr = Trainer(model, recs, TrainConfig(max_steps=1, micro_batch_size=mb, grad_accum=1, cutoff_len=64))
        est = tr.memory_estimate()
        tr.train()
        runs.append((est["total"], tr.metrics[0]["loss"], model.dev.peak_allocated - base))
        tr.close()
    (est64, loss64, peak64), (est3, loss3, peak3) = runs
    assert est64 == est3 and loss64 == loss3 and abs(peak64 - peak3) <= 1024
    full = model.memory_estimate(TrainConfig(micro_batch_size=64, grad_accum=1, cutoff_len=64), seq_len=64)
    assert peak64 < full["total"] / 4   # what 64 rows would have taken


@pytest.mark.parametrize("r", [256, 2048])
def test_host_estimate_bounds_what_a_checkpoint_takes_in_python(r, tmp_path):
    """memory_estimate's "host" (the page refuses a run past the tab's Python memory with
    it: r 100000 on the demo ran the tab out of memory at its first checkpoint) bounds the
    Python heap's peak over steps with the page's adapter snapshot and a checkpoint, and
    is not loose by more than 2x (tracemalloc, above what was allocated before)."""
    import tracemalloc
    model = load_model(str(MODEL_DIR))
    trainer = Trainer(model, "demo", TrainConfig(max_steps=2, lora_r=r, micro_batch_size=1, cutoff_len=64,
                                                  save_every=2, out=str(tmp_path)))
    trainer.keep_adapter = True                  # as the page trains: a copy of the adapter each step
    gpu.run(trainer.setup())
    est = trainer.memory_estimate()["host"]
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        trainer.train()
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        trainer.close()
    print(f"r {r}: host estimate {est / 2**20:.1f} MiB, traced peak {peak / 2**20:.1f} MiB "
          f"({peak / (est / model.HOST_COPIES):.1f} copies of the adapter)")
    assert est / 2 <= peak <= est, (est, peak)
