"""LoRA training against transformers' BitNet + PEFT + torch AdamW + clip_grad_norm_.

A random tiny HF BitNet (online master weights), an adapter with nonzero B on
q_proj and v_proj, 8 optimizer steps of micro-batch 2 x accumulation 2: per-step
loss within 1e-4 relative, step-1 LoRA gradients within 1e-4 * max|g|, the final
adapter within 1e-4 * max|w| — with clipping active on every step, and inactive.
The same steps in the browser match the native losses within 1e-4.

Why the model seed is fixed: BitLinear rounds activations to int8 per token, and an
activation within float32 noise of a rounding boundary (x*s near k + 0.5) can round
differently in our kernels and in torch's sgemm, which sum in other orders. Such a
flip is float32 noise made discrete; it moves gradients by ~1e-4 relative (seen with
model seed 1). Seed 2 has no flip on these steps: everything agrees to ~1e-6.
"""
import base64
import pathlib

import numpy as np
import pytest
import torch

from bitlora.formats import peft as adapter_io
from bitlora.config import TrainConfig
from bitlora.data import Dataset
from bitlora.schedule import lr_at
from bitlora.tokenizer import Tokenizer

from conftest import PORTABLE, run_native_case
from fixtures.make_tiny import SMALL, make_hf

RECORDS = [{"instruction": f"Add {a} and {b}.", "input": "" if a % 2 else f"{a} {b}", "output": f"{a + b}"}
           for a, b in [(1, 2), (3, 4), (10, 7), (2, 9), (5, 5), (12, 30), (8, 1), (6, 6), (9, 9), (4, 11)]]
BASE = dict(micro_batch_size=2, grad_accum=2, max_steps=8, lr=1e-3, weight_decay=0.01, lora_r=4, lora_alpha=8,
            lora_dropout=0.0, target_modules=["q_proj", "v_proj"], lr_scheduler="linear", warmup_steps=2,
            cutoff_len=256, seed=3)


# widths that are not multiples of 4 (C 42, F 90, head dim 14, one KV head): the CPU
# kernels' vec4 paths (and their override constants) give way to the general ones
UNALIGNED = dict(SMALL, hidden_size=42, intermediate_size=90, num_attention_heads=3, num_key_value_heads=1)
WIDE = dict(SMALL, hidden_size=1024, intermediate_size=1024, num_attention_heads=8, num_key_value_heads=2)
ALL_SEVEN = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("train"), SMALL, BASE)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Widths at which the GPU kernels split o_proj's and down_proj's input gradients (C =
    F = 1024), LoRA on q and v only: their reduces fold into the norms' backward."""
    return _tiny(tmp_path_factory.mktemp("train_wide"), WIDE, dict(BASE, max_steps=2))


@pytest.fixture(scope="module")
def unaligned(tmp_path_factory):
    return _tiny(tmp_path_factory.mktemp("train_unaligned"), UNALIGNED, dict(BASE, target_modules=ALL_SEVEN))


def _tiny(root, dims: dict, config: dict) -> dict:
    folder = make_hf(root / "model", "online_f32", dims=dims, seed=2)
    cfg = TrainConfig.from_dict(config)
    shapes = adapter_io.lora_shapes(dict(dims), cfg.target_modules, cfg.lora_r)
    rng = np.random.default_rng(7)
    init = {k: (s, rng.uniform(-0.3, 0.3, size=s).astype(np.float32).ravel().tolist()) for k, s in shapes}
    adapter_io.save_adapter(root / "init", init, cfg)
    enc = lambda d: {p.name: base64.b64encode(p.read_bytes()).decode() for p in d.iterdir() if p.is_file()}  # noqa: E731
    return {"folder": folder, "init": root / "init", "model_files": enc(folder), "adapter_files": enc(root / "init")}


def torch_reference(tiny, config: dict):
    """The same steps with transformers + PEFT + torch: (losses, norms, step-1 grads, final adapter)."""
    from peft import PeftModel
    from transformers import BitNetForCausalLM
    torch._dynamo.config.disable = True
    cfg = TrainConfig.from_dict(config)
    base = BitNetForCausalLM.from_pretrained(tiny["folder"], torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, tiny["init"], is_trainable=True).train()
    params = {n.replace(".default", ""): p for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW(list(params.values()), lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                            eps=cfg.adam_eps, weight_decay=cfg.weight_decay)
    tok = Tokenizer.from_json((pathlib.Path(tiny["folder"]) / "tokenizer.json").read_text())
    ds = Dataset(RECORDS, tok, cfg.cutoff_len, cfg.train_on_inputs)
    total = ds.total_steps_for(cfg)
    losses, norms, grads1 = [], [], None
    for step in ds.steps_for(cfg):
        opt.zero_grad()
        loss_sum = 0.0
        for mb in step.micro_batches:
            ids = torch.tensor(mb.ids).view(mb.B, mb.T)
            logits = model(input_ids=ids).logits.float()
            tgt = torch.tensor(mb.targets).view(-1)
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), tgt, ignore_index=-1,
                                                     reduction="sum")
            (loss / step.n_targets).backward()
            loss_sum += loss.item()
        losses.append(loss_sum / step.n_targets)
        if grads1 is None:
            grads1 = {k: p.grad.detach().clone().numpy().ravel() for k, p in params.items()}
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(params.values()), cfg.max_grad_norm)))
        for g in opt.param_groups:
            g["lr"] = lr_at(cfg, step.index, total)
        opt.step()
    final = {k: p.detach().numpy().ravel() for k, p in params.items()}
    return losses, norms, grads1, final


@pytest.mark.parametrize("clip", ["active", "inactive"])
def test_training_matches_peft_and_torch(tiny, clip):
    config = dict(BASE, max_grad_norm=1e-2 if clip == "active" else 1e9)
    check_against_torch(tiny, config, clip, run_native_case)


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_training_matches_peft_on_unaligned_widths(unaligned, kind):
    """Widths that are not multiples of 4, LoRA on all seven projections, with either
    kernel kind (lavapipe runs both)."""
    config = dict(BASE, target_modules=ALL_SEVEN, max_grad_norm=1e-2, max_steps=4)
    run = lambda module, name, **kw: run_native_case(module, name, kind=kind, **kw)  # noqa: E731
    check_against_torch(unaligned, config, "active", run)


@pytest.mark.browser
def test_browser_training_matches_native_and_torch(tiny, browser_session):
    """The same steps inside Pyodide (fewer of them: SwiftShader is slow)."""
    config = dict(BASE, max_grad_norm=1e-2, max_steps=3)
    run = lambda module, name, **kw: browser_session.run_case(PORTABLE / f"{module}.py", name, kw, timeout_s=1200)  # noqa: E731
    browser = check_against_torch(tiny, config, "active", run)
    native = run_native_case("train_cases", "case_train", model_files=tiny["model_files"],
                             adapter_files=tiny["adapter_files"], records=RECORDS, config=config)
    for a, b in zip(browser["metrics"], native["metrics"]):
        assert abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"])


def check_against_torch(tiny, config, clip, run_case):
    losses, norms, grads1, final = torch_reference(tiny, config)
    got = run_case("train_cases", "case_train", model_files=tiny["model_files"],
                   adapter_files=tiny["adapter_files"], records=RECORDS, config=config)
    ours = [m["loss"] for m in got["metrics"]]
    assert len(ours) == len(losses) == config["max_steps"]
    for step, (a, b) in enumerate(zip(ours, losses), 1):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: loss {a} vs torch {b}"
    our_norms = [m["grad_norm"] for m in got["metrics"]]
    # pre-clip norms: not pinned by the issue; later steps can see an int8 rounding flip
    np.testing.assert_allclose(our_norms, norms, rtol=5e-3)
    if clip == "active":
        assert all(n > 1e-2 for n in norms), "clipping must be active on every step"
        assert all(m["clip"] < 1 for m in got["metrics"])
    else:
        assert all(m["clip"] == 1.0 for m in got["metrics"])
    if config["max_steps"] >= 8:
        assert losses[-1] < losses[0]
    for k, w in final.items():
        mine = np.asarray(got["adapter"][k])
        scale = np.abs(w).max()
        assert np.abs(mine - w).max() <= 1e-4 * scale, f"{k}: max |diff| {np.abs(mine - w).max()} vs max|w| {scale}"
    return got


def test_step1_gradients_match_peft(tiny):
    config = dict(BASE, max_grad_norm=1e9)
    _, _, grads1, _ = torch_reference(dict(tiny), dict(config, max_steps=1))
    got = run_native_case("train_cases", "case_step1_grads", model_files=tiny["model_files"],
                   adapter_files=tiny["adapter_files"], records=RECORDS, config=config)
    gmax = max(np.abs(g).max() for g in grads1.values())
    for k, g in grads1.items():
        mine = np.asarray(got["grads"][k])
        assert np.abs(mine - g).max() <= 1e-4 * gmax, f"{k}: max |diff| {np.abs(mine - g).max()}, max|g| {gmax}"


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_first_micro_batch_writes_gradients(tiny, kind):
    """The Trainer's step: micro-batch 0 writes the LoRA gradients over whatever the
    arena holds (AdamW does not zero them), later ones add: the same values as adding
    every micro-batch into zeroed gradients, with either kernel kind."""
    got = run_native_case("train_cases", "case_first_micro_writes", model_files=tiny["model_files"],
                          adapter_files=tiny["adapter_files"], records=RECORDS,
                          config=dict(BASE, micro_batch_size=1, grad_accum=2), kind=kind)
    assert got["micro_batches"] == 2
    for k, want in got["added"].items():
        assert got["written"][k] == want, k


@pytest.mark.parametrize("backend", ["native", pytest.param("browser", marks=pytest.mark.browser)])
def test_adapted_decoding_over_kv_cache(tiny, backend, request):
    """Generation with the adapter runs the model's KV-cached loop with the LoRA hook:
    its logits equal the training forward's, and greedy tokens equal re-running it."""
    ids = [1, 5, 9, 14, 3, 27, 8, 30, 2]
    kwargs = dict(model_files=tiny["model_files"], adapter_files=tiny["adapter_files"], config=BASE, ids=ids, n_new=6)
    if backend == "native":
        r = run_native_case("train_cases", "case_adapted_decoding", **kwargs)
    else:
        r = request.getfixturevalue("browser_session").run_case(PORTABLE / "train_cases.py", "case_adapted_decoding",
                                                                 kwargs)
    full, cached = np.array(r["full"]), np.array(r["cached"])
    assert np.abs(cached - full).max() <= 1e-5 * np.abs(full).max()
    assert r["gen"] == r["ref"][:len(r["gen"])] and len(r["gen"]) >= 1


def test_folded_reduces_train_the_same_bits(wide):
    """On a GPU kind, the split reduces of o_proj's and down_proj's input gradients done
    inside the norms' backward after them (Model.FOLD_REDUCES) give the same losses,
    gradient norms and adapter bits as each reduce in its own dispatch, with fewer
    dispatches."""
    r = run_native_case("train_cases", "case_fold_reduces", model_files=wide["model_files"],
                        adapter_files=wide["adapter_files"], records=RECORDS,
                        config=dict(BASE, max_steps=2))
    fold, apart = r["fold"], r["apart"]
    assert fold["loss"] == apart["loss"] and fold["grad_norm"] == apart["grad_norm"]
    assert fold["adapter"] == apart["adapter"]
    assert fold["dispatches"] < apart["dispatches"], (fold["dispatches"], apart["dispatches"])
