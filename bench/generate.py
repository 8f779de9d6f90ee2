"""The generation benchmark: `bitlora bench generate`. Native (numpy-free itself, but
torch and transformers for the comparison); not part of the wheel the browser gets.

Greedy generation, batch 1, with a KV cache: a random prompt of `--prompt` tokens,
then `--new` tokens (EOS ignored), on a BitNet with random ternary weights of BitNet
b1.58 2B-4T's shapes (`--shape 2b4t`), the demo model's (`--shape demo`), or a model
(`--model`: a HF folder or .gguf). Reported (bench/steps.py case_bench_generate, which
runs natively or, with `--backend browser`, in Pyodide in headless Chromium): the
prompt's tokens/s (its forward and the first token), decoding tokens/s and ms per
token after the first, dispatches and host ms (recording and submitting) per decoding
token, the weights' GB/s (every weight is read once per token), and the same with a
LoRA adapter. Beside them, in the same process: transformers' BitNetForCausalLM
generating the same way — on CUDA in bf16 where there is one (its decoder linears as
online AutoBitLinear, as bench/train.py builds it), else on this CPU in float32 for
models small enough (the demo's). `--profile` adds the GPU time of a decoding step
(64 replayed into one submit), of each kernel of one decoding step and of the prompt's
forward (a kernel's dispatches repeated in one submit) with the GB/s of the
matrix-vector ones beside a buffer copy's in the same run.
"""
from __future__ import annotations

import json
import os
import pathlib
import time

from bitlora import gpu
from bitlora.bitnet import SHAPES

from . import count
from .steps import case_bench_generate
from .train import _online_bitnet, _sync, comparison_device


async def _native(config, prompt, new, r, targets, profile, model_path, reps) -> dict:
    dev = await gpu.get_device("native")
    model = None
    if model_path:
        from bitlora.model import Model
        model = await Model.load(model_path, device=dev)
    return await case_bench_generate(dev, config, prompt, new, r, targets, reps, profile, model)


def _browser(config, prompt, new, r, targets, profile, model_path, reps) -> dict:
    from bitlora.app.browser import BrowserSession
    if model_path:
        raise SystemExit("bitlora bench generate: --backend browser takes --shape, not --model")
    with BrowserSession() as session:
        return session.run_case(pathlib.Path(__file__).with_name("steps.py"), "case_bench_generate",
                                {"config": config, "prompt": prompt, "new": new, "r": r, "targets": targets,
                                 "reps": reps, "profile": profile}, timeout_s=3600)


def _bench_torch(config: dict, prompt: int, new: int, device: str, model_path=None, reps: int = 3) -> dict:
    """transformers' BitNetForCausalLM.generate, greedy, batch 1, KV cache, EOS ignored."""
    import torch
    from transformers import BitNetConfig, BitNetForCausalLM

    torch.manual_seed(0)
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cuda":
        torch.cuda.empty_cache()
    if model_path:
        model = BitNetForCausalLM.from_pretrained(model_path, dtype=dt).to(device)
    else:
        with torch.device(device):
            model = _online_bitnet(BitNetForCausalLM(BitNetConfig(**config)).to(dt))
    model.eval()
    gen = torch.Generator(device=device).manual_seed(1)
    ids = torch.randint(2, model.config.vocab_size, (1, prompt), device=device, generator=gen)

    def run(n):
        _sync(device)
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, use_cache=True,
                           pad_token_id=0, eos_token_id=None)
        _sync(device)
        return time.perf_counter() - t

    run(4)
    first = min(run(1) for _ in range(reps))
    total = min(run(new) for _ in range(reps))
    out = {"torch": torch.__version__, "torch_device": device, "torch_dtype": str(dt).split(".")[-1],
           "torch_threads": torch.get_num_threads(), "torch_prefill_tokens_per_s": prompt / first,
           "torch_decode_tokens_per_s": (new - 1) / (total - first), "torch_ms_per_token": 1e3 * (total - first) / (new - 1)}
    if device == "cuda":
        out["gpu"] = torch.cuda.get_device_name()
        del model
        torch.cuda.empty_cache()
    return out


def bench_generate(shape: str = "2b4t", prompt: int = 32, new: int = 128, lora_r: int = 8,
                   target_modules: str = "q_proj,v_proj", backend: str = "native", model: str | None = None,
                   compare_torch: bool | None = None, profile: bool = False, reps: int = 3) -> dict:
    """Time greedy generation; print a summary and one JSON line; return the figures."""
    config = dict(SHAPES[shape], model_type="bitnet")
    if model:
        from bitlora.formats import open_checkpoint
        with open_checkpoint(model) as ck:
            config = dict(ck.config)
    targets = [m.strip() for m in target_modules.split(",") if m.strip()]
    res = {"shape": None if model else shape, "model": model, "prompt": prompt, "new": new, "lora_r": lora_r,
           "target_modules": targets, "backend": backend}
    device = comparison_device(config, compare_torch)
    if device is not None and (model is None or os.path.isdir(model)):   # transformers reads HF folders
        res.update(_bench_torch(config, prompt, new, device, model))
    run = _browser if backend == "browser" else lambda *a: gpu.run(_native(*a))
    res.update(run(config, prompt, new, lora_r, targets, profile, model, reps))
    what = f"model {model}" if model else f"{shape} shapes (random ternary weights)"
    print(f"Greedy generation, {what}, batch 1, prompt {prompt} + {new} new tokens, "
          f"on {res['adapter']} ({res['kind']} kernels)")
    mb = res["weight_bytes_per_token"] / 1e6
    print(f"  bitlora: prompt {res['prefill_tokens_per_s']:.0f} tokens/s replayed (host {res['prefill_host_ms']:.1f} ms; "
          f"{res['prefill_first_tokens_per_s']:.0f} tokens/s the first time, not replayed); decoding {res['decode_tokens_per_s']:.1f} "
          f"tokens/s ({res['ms_per_token']:.2f} ms/token), {res['dispatches_per_token']:.0f} dispatches/token, "
          f"host {res['host_ms_per_token']:.2f} ms/token, weights {mb:.1f} MB/token = {res['weight_gb_per_s']:.1f} GB/s")
    print(f"  bitlora + LoRA r {lora_r} on {','.join(targets)}: decoding {res['lora_decode_tokens_per_s']:.1f} "
          f"tokens/s ({res['lora_ms_per_token']:.2f} ms/token), {res['lora_dispatches_per_token']:.0f} "
          f"dispatches/token, host {res['lora_host_ms_per_token']:.2f} ms/token; "
          f"{res['lora_vs_base']:.3f}x the base model's speed")
    if "torch_decode_tokens_per_s" in res:
        res["ratio_vs_torch"] = res["decode_tokens_per_s"] / res["torch_decode_tokens_per_s"]
        print(f"  transformers + torch {res['torch']} on {res['torch_device']} ({res['torch_threads']} threads), "
              f"BitNetForCausalLM in {res['torch_dtype']}: prompt {res['torch_prefill_tokens_per_s']:.0f} tokens/s; "
              f"decoding {res['torch_decode_tokens_per_s']:.1f} tokens/s ({res['torch_ms_per_token']:.2f} ms/token); "
              f"bitlora / torch decoding = {res['ratio_vs_torch']:.2f}")
    if "gpu_ms_per_token" in res:
        print(f"  GPU time of a decoding step (64 replayed in one submit): {res['gpu_ms_per_token']:.3f} ms "
              f"(LoRA {res['lora_gpu_ms_per_token']:.3f}); host encoding {res['replay_host_ms']:.3f} ms; "
              f"copy bandwidth {res['copy_gb_per_s']:.0f} GB/s (read + written; "
              f"{res['copy_kernel_gb_per_s']:.0f} GB/s by a vec4 copy kernel)")
    for title, key in (("decoding step", "profile"), ("adapted decoding step", "lora_profile"),
                       ("prompt", "profile_prefill")):
        if key in res:
            print(f"  GPU time per kernel of the {title} (ms a call, calls, kernel; weight GB/s vs copy's; "
                  f"{res['profile_method']}):")
        for name, ms, n, nbytes, gbs in res.get(key, [])[:24]:
            print(f"    {ms:9.4f} ms  {n:3d} x  {name}" + (
                f"  {nbytes / n / 1e6:.2f} MB a call, {gbs} GB/s = {gbs / res['copy_kernel_gb_per_s']:.2f} x copy" if gbs else ""))
    print("BENCH " + json.dumps(res))
    return res


def add_generate_args(parser) -> None:
    """Flags of `bitlora bench generate`."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default="2b4t", help="model shapes (default 2b4t)")
    parser.add_argument("--model", default=None, help="a model (HF folder or .gguf) instead of random weights")
    parser.add_argument("--prompt", type=count, default=32, help="prompt tokens")
    parser.add_argument("--new", type=count, default=128, help="new tokens")
    parser.add_argument("--lora-r", type=count, default=8)
    parser.add_argument("--target-modules", default="q_proj,v_proj")
    parser.add_argument("--backend", choices=("native", "browser"), default="native",
                        help="native: wgpu-py here; browser: Pyodide + WebGPU in headless Chromium")
    parser.add_argument("--no-torch", action="store_true", help="skip the transformers + torch comparison")
    parser.add_argument("--reps", type=count, default=3, help="timed generations of each kind (the best counts)")
    parser.add_argument("--profile", action="store_true", help="also time each kernel of one decoding step")


def main_generate(args) -> dict:
    return bench_generate(args.shape, args.prompt, args.new, args.lora_r, args.target_modules, args.backend,
                          args.model, compare_torch=False if args.no_torch else None, profile=args.profile,
                          reps=args.reps)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="bitlora generation benchmark")
    add_generate_args(ap)
    main_generate(ap.parse_args())
