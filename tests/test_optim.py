"""The optimizer on the GPU against torch: AdamW (1000 steps), clip_grad_norm_ on the
loss-normalised gradient, the clipping gates of REFERENCE.md §1, NaN/Inf skipping,
no recompilation, asynchronous results. Cases live in tests/portable/optim_cases.py
and run natively and inside the browser."""
from __future__ import annotations

import base64
import math

import numpy as np
import pytest
import torch

import optim_cases as oc

SMALL = [1, 3, 257, 1000, 4099]          # odd sizes, ~5 400 elements: 1 000 steps stay quick
LARGE = [1, 3, 257, 1_000_003]


def f32(s: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(s), np.float32)


def assert_close(got, want, rtol, what):
    """Relative to the largest |want|: report the worst index and the first few pairs."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = np.abs(got - want)
    scale = max(np.abs(want).max(), 1e-30)
    i = int(err.argmax())
    assert err[i] <= rtol * scale, (
        f"{what}: max |diff| {err[i]:.3e} = {err[i] / scale:.2e} x max|want| at {i} "
        f"(got {got[i]!r}, want {want[i]!r}); first pairs {list(zip(got[:4], want[:4]))}")
    return err.max() / scale


def torch_run(sizes, steps, seed=0, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
              max_grad_norm=1.0, nan_step=-1):
    """The reference: mean gradient (raw * 1/N in f32), clip_grad_norm_, AdamW; a step
    with a non-finite norm is skipped (grads dropped), as GradScaler does."""
    params = [torch.nn.Parameter(torch.from_numpy(np.array(v, np.float32))) for v in oc.init_params(seed, sizes)]
    opt = torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    norms = []
    for k, (tokens, exps) in enumerate(oc.step_plan(seed, steps, len(sizes))):
        grads = [np.array(g, np.float32) for g in oc.raw_grads(seed, k, sizes, exps)]
        if k == nan_step:
            grads[-1][len(grads[-1]) // 2] = np.nan
        scale = np.float32(1.0 / tokens)
        for p, g in zip(params, grads):
            p.grad = torch.from_numpy(g * scale)
        if max_grad_norm:
            norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params])))
        norms.append(norm)
        if math.isfinite(norm):
            opt.param_groups[0]["lr"] = oc.lr_at(lr, k, steps)
            opt.step()
        opt.zero_grad()
    state = [opt.state[p] for p in params]
    cat = lambda xs: np.concatenate([x.detach().numpy().ravel() for x in xs])  # noqa: E731
    return {"params": cat(params), "m": cat([s["exp_avg"] for s in state]) if state[0] else None,
            "v": cat([s["exp_avg_sq"] for s in state]) if state[0] else None, "norms": norms}


def check_against_torch(r, want, rtol=1e-5):
    errs = {w: assert_close(f32(r[w]), want[w], rtol, w) for w in ("params", "m", "v")}
    # element by element too, where a parameter is not a cancellation near zero (GPUs
    # contract a*b+c into FMAs and round sqrt/division their own way)
    got, ref = f32(r["params"]).astype(np.float64), want["params"].astype(np.float64)
    rel = np.abs(got - ref) / np.maximum(np.abs(ref), 1e-2 * np.abs(ref).max())
    assert rel.max() <= rtol, f"params: element-wise relative error {rel.max():.2e} at {rel.argmax()}"
    errs["params_elementwise"] = rel.max()
    got_norms = [x["norm"] for x in r["reports"]]
    assert_close(got_norms, want["norms"], 1e-5, "norms")
    assert not f32(r["grads"]).any(), "gradients not zeroed after the step"
    assert r["recompiled"] == 0, "a pipeline was compiled after the first step"
    return errs


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_adamw_1000_steps_matches_torch(run_case, kind):
    """Either kind's gradient-norm passes (the CPU's without barriers) and AdamW."""
    steps = 1000
    r = run_case("optim_cases", "case_adamw_run", sizes=SMALL, steps=steps, seed=1, kind=kind)
    want = torch_run(SMALL, steps, seed=1)
    errs = check_against_torch(r, want)
    clips = [x["clip"] for x in r["reports"]]
    assert 0.2 < np.mean(np.array(clips) < 1) < 0.8, "the plan should clip on some steps, not all"
    assert [x["step"] for x in r["reports"]] == list(range(1, steps + 1))
    print("1000 steps, max error / max |torch|:", errs)


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
def test_adamw_million_elements_matches_torch(run_case, kind):
    r = run_case("optim_cases", "case_adamw_run", sizes=LARGE, steps=3, seed=2, per_tensor=True, kind=kind)
    want = torch_run(LARGE, 3, seed=2)
    check_against_torch(r, want)
    # per-tensor norms (logging) add up to the global one
    for rep in r["reports"]:
        tn = rep["tensor_norms"]
        assert math.isclose(math.sqrt(sum(x * x for x in tn.values())), rep["norm"], rel_tol=1e-5)


@pytest.mark.parametrize("per_thread", [2, 3])
def test_vec4s_per_invocation_change_nothing(run_case, per_thread):
    """The update kernel's PER override (vec4s per invocation) is a speed knob: the same
    bits as one vec4 per invocation, over sizes that leave partial workgroups."""
    sizes = [3, 257, 1031, 64 * 1024 + 5]
    one = run_case("optim_cases", "case_adamw_run", sizes=sizes, steps=3, seed=6, per_thread=1)
    more = run_case("optim_cases", "case_adamw_run", sizes=sizes, steps=3, seed=6, per_thread=per_thread)
    for what in ("params", "m", "v", "grads"):
        assert one[what] == more[what], what


@pytest.mark.parametrize("hp", [dict(betas=(0.8, 0.99), eps=1e-6, weight_decay=0.0, max_grad_norm=None),
                                dict(betas=(0.3, 0.95), eps=1e-8, weight_decay=0.1, max_grad_norm=0.5, lr=1e-2)])
def test_adamw_hyperparameters_match_torch(run_case, hp):
    r = run_case("optim_cases", "case_adamw_run", sizes=SMALL, steps=20, seed=3, **hp)
    check_against_torch(r, torch_run(SMALL, 20, seed=3, **hp))


def test_non_finite_gradient_skips_the_step(run_case):
    steps, bad = 6, 3
    r = run_case("optim_cases", "case_adamw_run", sizes=SMALL, steps=steps, seed=4, nan_step=bad)
    reps = r["reports"]
    assert not math.isfinite(reps[bad]["norm"]) and reps[bad]["skipped_step"]
    assert [x["skipped"] for x in reps] == [0, 0, 0, 1, 1, 1]
    assert [x["step"] for x in reps] == [1, 2, 3, 3, 4, 5], "a skipped step must not advance t"
    # training went on, exactly as torch with that step left out
    want = torch_run(SMALL, steps, seed=4, nan_step=bad)
    assert_close(f32(r["params"]), want["params"], 1e-5, "params")
    assert_close(f32(r["m"]), want["m"], 1e-5, "m")
    assert np.isfinite(f32(r["params"])).all() and not f32(r["grads"]).any()


def test_skipped_step_leaves_parameters_and_moments_bitwise(run_case):
    """m and v do not depend on lr, so a 4-step run whose last step is NaN must end with
    the moments of the 3-step run, bit for bit; its parameters are torch's."""
    a = run_case("optim_cases", "case_adamw_run", sizes=[3, 257], steps=4, seed=5, nan_step=3)
    c = run_case("optim_cases", "case_adamw_run", sizes=[3, 257], steps=3, seed=5)
    assert a["reports"][3]["skipped_step"] and a["reports"][3]["skipped"] == 1
    assert a["m"] == c["m"] and a["v"] == c["v"]
    want = torch_run([3, 257], 4, seed=5, nan_step=3)
    assert_close(f32(a["params"]), want["params"], 1e-6, "params")


# ---------------------------------------------------------------- clipping gates

def clip_reference(scaled: np.ndarray, max_norm: float) -> tuple[float, float]:
    p = torch.nn.Parameter(torch.zeros(len(scaled)))
    p.grad = torch.from_numpy(scaled.copy())
    norm = float(torch.nn.utils.clip_grad_norm_([p], max_norm))
    return norm, min(1.0, max_norm / (norm + 1e-6))


def test_gate_a_below_threshold_is_bitwise_identity(run_case):
    r = run_case("optim_cases", "case_clip_ops", sizes=SMALL, num_target_tokens=64, max_grad_norm=1e6)
    assert r["state"]["clip"] == 1.0
    assert r["clipped"] == r["scaled"], "below the threshold clipping changed some bits"
    # and in the fused step: clip on at a huge threshold == clip off, bit for bit
    on = run_case("optim_cases", "case_adamw_run", sizes=SMALL, steps=5, seed=6, max_grad_norm=1e9)
    off = run_case("optim_cases", "case_adamw_run", sizes=SMALL, steps=5, seed=6, max_grad_norm=None)
    assert on["params"] == off["params"] and on["m"] == off["m"] and on["v"] == off["v"]


@pytest.mark.parametrize("max_norm", [1e-3, 1.0, 1e3])
def test_gate_b_factor_never_exceeds_one(run_case, max_norm):
    for tokens in (1, 1000, 10**7):  # tiny gradients must not be amplified
        r = run_case("optim_cases", "case_clip_ops", sizes=[3, 257], num_target_tokens=tokens, max_grad_norm=max_norm)
        norm, want = clip_reference(f32(r["scaled"]), max_norm)
        assert 0.0 <= r["state"]["clip"] <= 1.0
        assert math.isclose(r["state"]["norm"], norm, rel_tol=1e-5)
        assert math.isclose(r["state"]["clip"], want, rel_tol=1e-5)
        assert np.all(np.abs(f32(r["clipped"])) <= np.abs(f32(r["scaled"])))


def test_gate_c_factor_is_shared_across_all_tensors(run_case):
    """Tensors of very different magnitudes, clipping active: g'/g is one constant."""
    r = run_case("optim_cases", "case_clip_ops", sizes=SMALL, num_target_tokens=2, max_grad_norm=0.5,
                 exponents=[104, 112, 120, 128, 136])
    g, gc = f32(r["scaled"]).astype(np.float64), f32(r["clipped"]).astype(np.float64)
    ratio = gc / g
    c = r["state"]["clip"]
    assert c < 0.01, "clipping should be active here"
    # one factor, exactly: each g' is the f32 rounding of g * c
    assert np.array_equal(f32(r["clipped"]), (f32(r["scaled"]) * np.float32(c)).astype(np.float32))
    assert np.abs(ratio / c - 1).max() < 2 ** -23
    # ... and it is the global factor, not a per-tensor one
    norm, want = clip_reference(f32(r["scaled"]), 0.5)
    assert math.isclose(c, want, rel_tol=1e-5) and math.isclose(r["state"]["norm"], norm, rel_tol=1e-5)


def test_gate_d_accumulated_micro_batches_clip_the_mean(run_case):
    sizes, tokens = [3, 257, 1000], (5, 9, 3)
    r = run_case("optim_cases", "case_accumulate", sizes=sizes, tokens=list(tokens), max_grad_norm=1.0)
    total = np.zeros(sum(sizes), np.float32)
    for j in range(len(tokens)):  # the case adds micro-batch j's raw sums, seed j, on the GPU
        total += np.concatenate([np.array(x, np.float32) for x in oc.raw_grads(j, 0, sizes, [120] * 3)])
    mean = total * np.float32(1.0 / sum(tokens))
    norm, factor = clip_reference(mean, 1.0)
    rep = r["report"]
    assert math.isclose(rep["norm"], norm, rel_tol=1e-5), (rep["norm"], norm)
    assert math.isclose(rep["clip"], factor, rel_tol=1e-5)
    sum_factor = min(1.0, 1.0 / (float(np.linalg.norm(total.astype(np.float64))) + 1e-6))
    assert not math.isclose(rep["clip"], sum_factor, rel_tol=0.1), "clipped the sum, not the mean"
    # and the parameters are torch's AdamW on the clipped mean
    params = torch.nn.Parameter(torch.from_numpy(np.concatenate([np.array(v, np.float32)
                                                                  for v in oc.init_params(0, sizes)])))
    params.grad = torch.from_numpy(mean.copy())
    torch.nn.utils.clip_grad_norm_([params], 1.0)
    torch.optim.AdamW([params]).step()
    assert_close(f32(r["params"]), params.detach().numpy(), 1e-6, "params")


def test_gate_e_zero_gradient(run_case):
    r = run_case("optim_cases", "case_zero_grad", sizes=[1, 3, 257])
    rep = r["report"]
    assert rep["norm"] == 0.0 and rep["clip"] == 1.0 and not rep["skipped_step"]
    assert np.isfinite(f32(r["params"])).all() and not f32(r["m"]).any()
    p0 = np.concatenate([np.array(v, np.float32) for v in oc.init_params(0, [1, 3, 257])])
    assert_close(f32(r["params"]), p0 * np.float32(1 - 1e-3 * 1e-2), 1e-7, "decay only")


def test_step_is_asynchronous(run_case):
    r = run_case("optim_cases", "case_step_is_async")
    assert r["unread_after_step"] == [True, True]
    assert r["first"]["step"] == 1 and r["second"]["step"] == 2
    assert r["first"]["norm"] != r["second"]["norm"]


def test_bench_optim_reports_every_round(capsys):
    """`bitlora bench optim` natively: the norm it reports is numpy's in float64, and every
    round of the step and its figures come out (no torch: this machine has no CUDA)."""
    from bitlora.bench.optim import bench_optim

    res = bench_optim(params=3 * 4096 + 7, tensors=5, iters=2, compare_torch=False, rounds=2)
    assert res["norm_rel_err_vs_float64"] < 1e-5
    assert res["rounds"] == 2 and len(res["wgsl_step_ms_rounds"]) == 2
    assert res["wgsl_norm_passes_ms"] > 0 and res["wgsl_adamw_ms"] > 0
    assert "BENCH {" in capsys.readouterr().out
    with pytest.raises(ValueError, match="rounds"):
        bench_optim(params=4096, tensors=2, rounds=0, compare_torch=False)
