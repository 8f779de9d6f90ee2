"""The training benchmark: `bitlora bench train`. Native (numpy-free itself, but torch,
transformers and peft for the comparison); not part of the wheel the browser gets.

LoRA training steps on a BitNet with random ternary weights and the shapes of BitNet
b1.58 2B-4T (`--shape 2b4t`) or of the demo model (`--shape demo`), random token ids,
every position but the first a target (bench/steps.py, which runs natively or, with
`--backend browser`, inside Pyodide in headless Chromium). Reported: trained (target)
tokens per second over whole optimizer steps (forward, loss, backward, global-norm
clip, AdamW), ms per step, dispatches per step, the host's ms per step (recording and
submitting, not waiting), and the peak of our GPU buffers; beside them, in the same
run, the same steps with PEFT LoRA on transformers' BitNetForCausalLM and
torch.optim.AdamW, on CUDA where there is one (bf16, and f32 when asked), else on this
machine's CPU in float32 (for the shapes that fit: the demo's), and the ratio.
"""
from __future__ import annotations

import json
import pathlib
import time

from bitlora import gpu
from bitlora.bitnet import SHAPES

from . import count
from .steps import case_bench_steps

LEAN_MS_PER_TOKEN = 287.0   # the baseline's training time per trained token (docs/PERFORMANCE.md)
TORCH_CPU_MAX_PARAMS = 50_000_000   # torch on the CPU only for models this small (the demo)


async def _native_steps(config, B, T, steps, r, targets, profile, checkpointing, kind, int8, replay,
                        record_only) -> dict:
    dev = await gpu.get_device("native")
    return await case_bench_steps(dev, config, B, T, steps, r, targets, profile, checkpointing, kind, int8, replay,
                                  record_only)


def _browser_steps(config, B, T, steps, r, targets, profile, checkpointing, kind, int8, replay, record_only) -> dict:
    """bench/steps.py inside the page's worker: Pyodide + the browser's WebGPU."""
    from bitlora.app.browser import BrowserSession
    with BrowserSession() as session:
        return session.run_case(pathlib.Path(__file__).with_name("steps.py"), "case_bench_steps",
                                {"config": config, "B": B, "T": T, "steps": steps, "r": r, "targets": targets,
                                 "profile": profile, "checkpointing": checkpointing, "kind": kind, "int8": int8,
                                 "replay": replay, "record_only": record_only}, timeout_s=3600)


def _nvidia_smi_mib():
    """GPU memory nvidia-smi reports for this process (MiB; includes a CUDA context when
    torch ran in the same process), or None where there is no nvidia-smi."""
    import os
    import subprocess
    try:
        rows = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for row in rows.splitlines():
        pid, _, mib = row.partition(",")
        if pid.strip() == str(os.getpid()):
            return int(mib)
    return None


def _online_bitnet(model):
    """The decoder's nn.Linear layers as transformers' AutoBitLinear in online mode (what
    a checkpoint with quantization_mode "online" loads as: bf16 master weights, both
    quantisers with the straight-through estimator in every forward), sharing weights."""
    from transformers.integrations.bitnet import AutoBitLinear
    import torch

    for name, mod in list(model.named_modules()):
        if isinstance(mod, torch.nn.Linear) and ".layers." in f".{name}":
            new = AutoBitLinear(mod.in_features, mod.out_features, bias=False, device=mod.weight.device,
                                dtype=mod.weight.dtype, online_quant=True)
            new.weight = mod.weight
            model.set_submodule(name, new)
    return model


def torch_device(config: dict) -> str | None:
    """Where the torch comparison runs: "cuda", "cpu" (a small model, no CUDA) or None."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    C, F, L, V = (config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size"))
    return "cpu" if L * (4 * C * C + 3 * C * F) + V * C <= TORCH_CPU_MAX_PARAMS else None


def comparison_device(config: dict, compare_torch: bool | None) -> str | None:
    """torch_device for a run asked to compare with torch (None: where torch is there;
    True: torch must be there; False: never)."""
    if compare_torch is False:
        return None
    try:
        return torch_device(config)
    except ImportError:
        if compare_torch:
            raise
        return None


def _sync(device: str) -> None:
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def _bench_torch(config: dict, B: int, T: int, steps: int, r: int, targets: list, dtype: str,
                 device: str = "cuda", checkpointing: bool = False) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BitNetConfig, BitNetForCausalLM

    torch.manual_seed(0)
    cuda = torch.device(device)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    dt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    with torch.device(cuda):
        model = _online_bitnet(BitNetForCausalLM(BitNetConfig(**config)).to(dt))
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=targets,
                                             task_type="CAUSAL_LM"))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.0)
    gen = torch.Generator(device=cuda).manual_seed(0)
    ids = [torch.randint(2, config["vocab_size"], (B, T), device=cuda, generator=gen) for _ in range(steps + 2)]

    def step(x):
        loss = model(input_ids=x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(2):
        step(ids[i])
    _sync(device)
    t = time.perf_counter()
    for i in range(2, steps + 2):
        loss = step(ids[i])
    _sync(device)
    dt_s = (time.perf_counter() - t) / steps
    tokens = B * (T - 1)
    out = {"torch": torch.__version__, "torch_device": device, "torch_dtype": dtype,
           "torch_threads": torch.get_num_threads(), "torch_step_s": dt_s, "torch_tokens_per_s": tokens / dt_s,
           "torch_loss_last": loss.item()}
    if device == "cuda":
        out.update({"gpu": torch.cuda.get_device_name(),
                    "torch_gpu_bytes_peak": torch.cuda.max_memory_allocated() - base})
        del model, opt, ids
        torch.cuda.empty_cache()
    return out


def bench_train(shape: str = "2b4t", micro_batch: int = 1, seq: int = 256, steps: int = 10, lora_r: int = 8,
                target_modules: str = "q_proj,v_proj", backend: str = "native", torch_dtypes: str | None = None,
                compare_torch: bool | None = None, profile: bool = False, checkpointing: bool = False,
                kind: str | None = None, int8: bool = True, replay: bool = True, record_only: bool = False,
                layers: int | None = None) -> dict:
    """Time LoRA training steps on random weights of `shape` (with `layers`: that many
    decoder layers); print a summary and one JSON line; return the figures. `kind` forces
    the kernel variants ("gpu", "cpu": Device.kind), `int8` False the GPU's f32 forward
    (Device.int8_dot). `record_only`: the host's part of each step alone, never run (no
    torch comparison); `replay` False records every step anew."""
    config = dict(SHAPES[shape], model_type="bitnet")
    if layers:
        config["num_hidden_layers"] = layers
    if record_only:
        compare_torch = False
    targets = [m.strip() for m in target_modules.split(",") if m.strip()]
    res = {"shape": shape, "layers": config["num_hidden_layers"], "micro_batch": micro_batch, "seq": seq,
           "steps": steps, "lora_r": lora_r,
           "target_modules": targets, "backend": backend, "gradient_checkpointing": checkpointing}
    dtypes = []
    device = comparison_device(config, compare_torch)
    if device is not None:
        dtypes = [d for d in (torch_dtypes or ("bf16" if device == "cuda" else "f32")).split(",") if d]
    for dtype in dtypes:
        got = _bench_torch(config, micro_batch, seq, steps, lora_r, targets, dtype, device, checkpointing)
        res.update({f"{k}_{dtype}" if k.startswith("torch_") and k not in ("torch_dtype", "torch_device", "torch_threads") else k: v
                    for k, v in got.items()})
    run = _browser_steps if backend == "browser" else lambda *a: gpu.run(_native_steps(*a))
    res.update(run(config, micro_batch, seq, steps, lora_r, targets, profile, checkpointing, kind, int8, replay,
                   record_only))
    if backend != "browser":
        res["nvidia_smi_process_mib"] = _nvidia_smi_mib()
    print(f"LoRA training, {shape} shapes (random ternary weights, {res['layers']} layers), r {lora_r} on "
          f"{','.join(targets)}, micro-batch {micro_batch} x {seq} tokens, on {res['adapter']} ({res['kind']} kernels"
          f"{', int8 forward' if res['int8'] else ''})")
    host = (f"host {res['host_s_per_step'] * 1e3:.2f} ms/step (building the step {res['host_record_s_per_step'] * 1e3:.2f}"
            f" = {res['host_us_per_dispatch']:.1f} us/dispatch, CPU time {res['host_cpu_s_per_step'] * 1e3:.2f}; submit "
            f"{res['host_submit_s_per_step'] * 1e3:.2f}; {'replayed' if replay else 'recorded every step'}, first step "
            f"{res['first_step_host_s'] * 1e3:.1f})")
    if record_only:
        print(f"  bitlora, recorded and not run: {res['dispatches_per_step']} dispatches/step, {host}")
        print("BENCH " + json.dumps(res))
        return res
    res["lean_tokens_per_s"] = 1000.0 / LEAN_MS_PER_TOKEN
    res["ratio_vs_lean"] = res["tokens_per_s"] / res["lean_tokens_per_s"]
    print(f"  bitlora: {res['step_s'] * 1e3:.1f} ms/step, {res['tokens_per_s']:.0f} trained tokens/s, "
          f"{res['dispatches_per_step']} dispatches/step, {host}; "
          f"GPU buffers {res['gpu_bytes_peak'] / 2**30:.3f} GiB at peak (model {res['model_bytes'] / 2**30:.3f} GiB)")
    for dtype in dtypes:
        line = (f"  torch {res['torch']} + PEFT on {res['torch_device']} ({res['torch_threads']} threads), "
                f"BitNetForCausalLM in {dtype}: {res[f'torch_step_s_{dtype}'] * 1e3:.1f} ms/step, "
                f"{res[f'torch_tokens_per_s_{dtype}']:.0f} tokens/s")
        if f"torch_gpu_bytes_peak_{dtype}" in res:
            line += f", {res[f'torch_gpu_bytes_peak_{dtype}'] / 2**30:.2f} GiB peak"
        res[f"ratio_vs_torch_{dtype}"] = res["tokens_per_s"] / res[f"torch_tokens_per_s_{dtype}"]
        print(line + f"; bitlora / torch tokens/s = {res[f'ratio_vs_torch_{dtype}']:.3f}")
    if "profile" in res:
        print(f"  per kernel over one step ({res.get('profile_method', '')}; "
              f"sum {sum(r[1] for r in res['profile']):.1f} ms):")
    for name, ms, n in res.get("profile", [])[:25]:
        print(f"    {ms:9.2f} ms  {n:4d} x  {name}")
    if "profile_by_grid" in res:
        print("  by kernel and grid:")
    for name, groups, ms, n in res.get("profile_by_grid", [])[:30]:
        print(f"    {ms:9.2f} ms  {n:4d} x  {name} {groups}")
    print("BENCH " + json.dumps(res))
    return res


def add_train_args(parser) -> None:
    """Flags of `bitlora bench train`."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default="2b4t", help="model shapes (default 2b4t)")
    parser.add_argument("--micro-batch", type=count, default=1)
    parser.add_argument("--seq", type=count, default=256, help="tokens per sequence")
    parser.add_argument("--steps", type=count, default=10, help="timed optimizer steps")
    parser.add_argument("--lora-r", type=count, default=8)
    parser.add_argument("--target-modules", default="q_proj,v_proj")
    parser.add_argument("--backend", choices=("native", "browser"), default="native",
                        help="native: wgpu-py here; browser: Pyodide + WebGPU in headless Chromium")
    parser.add_argument("--torch-dtypes", default=None,
                        help="comma list of bf16, f32 for the torch runs (default bf16 on CUDA, f32 on the CPU)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch + PEFT comparison")
    parser.add_argument("--profile", action="store_true", help="also time each kernel over one step")
    parser.add_argument("--gradient-checkpointing", action="store_true",
                        help="recompute each layer in the backward (both bitlora and torch)")
    parser.add_argument("--kind", choices=("gpu", "cpu"), default=None,
                        help="force the kernel variants of a device kind (default: the adapter's; "
                             "--kind gpu --record-only gives a GPU's dispatch list on a CPU adapter)")
    parser.add_argument("--no-int8", action="store_true",
                        help="the GPU forward in f32 sums even where dot4I8Packed exists (the kernel before it)")
    parser.add_argument("--no-replay", action="store_true",
                        help="record every step's dispatches anew instead of replaying the first step's")
    parser.add_argument("--record-only", action="store_true",
                        help="time the host's part of each step only: build it and never run it")
    parser.add_argument("--layers", type=count, default=None, help="decoder layers (default: the shape's)")


def main_train(args) -> dict:
    return bench_train(args.shape, args.micro_batch, args.seq, args.steps, args.lora_r, args.target_modules,
                       args.backend, args.torch_dtypes, compare_torch=False if args.no_torch else None,
                       profile=args.profile, checkpointing=args.gradient_checkpointing, kind=args.kind,
                       int8=not args.no_int8, replay=not args.no_replay, record_only=args.record_only,
                       layers=args.layers)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="bitlora training benchmark")
    add_train_args(ap)
    main_train(ap.parse_args())
