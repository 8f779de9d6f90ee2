"""The page's GPU memory estimate (webapp.memory_estimate) against what a training
step really allocates (Device.peak_allocated): never below it, and not wildly above
(the estimate assumes every sequence is cutoff_len long; the demo's are shorter)."""
from bitlora import webapp
from bitlora.config import TrainConfig
from bitlora.demo import MODEL_DIR
from bitlora.model import load_model
from bitlora.train import Trainer


def test_estimate_bounds_the_real_peak():
    from bitlora import gpu
    base = gpu.run(gpu.get_device("native")).reset_peak()   # the device is shared by the session's tests
    model = load_model(str(MODEL_DIR))
    cfg = TrainConfig(max_steps=1, cutoff_len=128, micro_batch_size=4, grad_accum=1, target_modules=["q_proj", "v_proj"])
    est = webapp.memory_estimate(model, cfg)
    Trainer(model, "demo", cfg).train()
    peak = model.dev.peak_allocated - base
    print(f"estimate {est['bytes']} B, peak {peak} B")
    assert est["fits"] and peak <= est["bytes"] <= 3 * peak
