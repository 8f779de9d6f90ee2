"""The training benchmark (native only: numpy, and torch + transformers + peft where a
CUDA GPU is there to compare). Not part of the wheel the browser gets.

`bitlora bench train --shape 2b4t`: LoRA training steps on a BitNet with random
ternary weights and the shapes of BitNet b1.58 2B-4T (or `--shape demo`, the demo
model's shapes), random token ids, every position but the first a target. Reported:
trained (target) tokens per second over whole optimizer steps (forward, loss,
backward, global-norm clip, AdamW), the GPU memory our buffers take at their peak,
and, in the same process when CUDA torch with transformers and peft is there, the same
steps with PEFT LoRA on transformers' BitNetForCausalLM (random weights, bf16 or f32)
and torch.optim.AdamW; and the ratio to the baseline of docs/PERFORMANCE.md (287 ms
per trained token).
"""
from __future__ import annotations

import asyncio
import collections
import json
import random
import struct
import time

from bitlora import gpu
from bitlora.bitnet import EMBED, FINAL_NORM, FULL, LM_HEAD, SHAPES, norm_sizes, projection_shapes
from bitlora.config import TrainConfig
from bitlora.data import MicroBatch
from bitlora.formats.tensors import FloatTensor, TernaryTensor
from bitlora.lora import Lora
from bitlora.model import Model
from bitlora.optim import AdamW

LEAN_MS_PER_TOKEN = 287.0   # the baseline's training time per trained token (docs/PERFORMANCE.md)


def random_loader(config: dict, seed: int):
    """load(name) for Model.create: random ternary projections (packed words with codes
    0..2), norm weights near 1, a N(0, 0.02) embedding in bf16 (as 2B-4T stores it)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    C = config["hidden_size"]
    out_dims = {FULL[m]: s for m, s in projection_shapes(config).items()}
    norm_dims = norm_sizes(config)

    def load(name: str):
        if name in (EMBED, LM_HEAD):
            e = rng.standard_normal((config["vocab_size"], C), dtype=np.float32) * np.float32(0.02)
            return FloatTensor(e.shape, "bf16", (e.view(np.uint32) >> 16).astype(np.uint16).tobytes())
        if name == FINAL_NORM:
            return FloatTensor((C,), "f32", (1 + 0.1 * rng.standard_normal(C, dtype=np.float32)).tobytes())
        module = name.split(".", 3)[3].rsplit(".", 1)[0]      # model.layers.{i}.<module>.weight
        if module in norm_dims:
            n = norm_dims[module]
            return FloatTensor((n,), "f32", (1 + 0.1 * rng.standard_normal(n, dtype=np.float32)).tobytes())
        O, I = out_dims[module]
        words = rng.integers(0, 1 << 32, size=O * -(-I // 16), dtype=np.uint32)
        words ^= (words & (words >> 1) & np.uint32(0x55555555)) << 1   # code 3 -> 1 (a zero weight)
        return TernaryTensor((O, I), words.tobytes(), 0.01)

    return load


def _batch(B: int, T: int, V: int, seed: int):
    rnd = random.Random(seed)
    ids = [rnd.randrange(2, V) for _ in range(B * T)]
    mask = ([0] + [1] * (T - 1)) * B
    return MicroBatch(B, T, ids, mask, [T] * B, list(range(B)), sum(mask))


async def _profile(dev, record_step) -> list:
    """GPU time per kernel over one step: every dispatch submitted and waited for on its
    own (so the figures add up to more than a step, but rank the kernels). Native only."""
    from bitlora.gpu.native import COPY_SRC     # imports wgpu
    fence = dev.backend.device.create_buffer(size=4, usage=COPY_SRC)
    times, counts = collections.Counter(), collections.Counter()
    plain = dev.dispatch

    def timed_dispatch(kernel, bindings, groups, params=None):
        dev.submit()
        dev.backend.queue.read_buffer(fence)
        t = time.perf_counter()
        plain(kernel, bindings, groups, params)
        dev.submit()
        dev.backend.queue.read_buffer(fence)
        times[kernel.name] += time.perf_counter() - t
        counts[kernel.name] += 1

    dev.dispatch = timed_dispatch
    try:
        await (await record_step())[1].get()
    finally:
        del dev.dispatch
    return [(name, round(sec * 1e3, 3), counts[name]) for name, sec in times.most_common()]


async def _bench_bitlora(config: dict, B: int, T: int, steps: int, r: int, targets: list, backend: str,
                         profile: bool = False) -> dict:
    dev = await gpu.get_device(backend)
    t = time.perf_counter()
    model = await Model.create(dev, config, random_loader(config, 0), name="random-" + str(config["num_hidden_layers"]))
    await dev.sync()
    out = {"adapter": dev.describe(), "model_upload_s": time.perf_counter() - t,
           "model_bytes": dev.allocated}
    cfg = TrainConfig(lora_r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=targets, micro_batch_size=B,
                      grad_accum=1, cutoff_len=T)
    lora = await Lora.create(model, cfg)
    acts = model.activations(B, T, lora)
    opt = AdamW(dev, lora.arena, lr=1e-4, weight_decay=0.0, max_grad_norm=1.0)
    mbs = [_batch(B, T, config["vocab_size"], s) for s in range(steps + 2)]

    async def step(i):
        dev.clear(acts.top.loss_sum)
        model.forward(mbs[i].rows(), acts, lora, targets=mbs[i].targets, step=i)
        model.backward(acts, lora)
        loss = dev.read_later(acts.top.loss_sum, 0, 4)
        return loss, await opt.step(mbs[i].n_targets)

    t = time.perf_counter()
    first = await step(0)           # the first submit of every pipeline
    await first[1].get()
    out["first_step_s"] = time.perf_counter() - t
    await (await step(1))[1].get()
    t = time.perf_counter()
    pending = []
    for i in range(2, steps + 2):
        pending.append(await step(i))
        if len(pending) > 1:            # read one step late, as the trainer does
            await pending.pop(0)[1].get()
    for _, res in pending:
        await res.get()
    dt = (time.perf_counter() - t) / steps
    if profile:
        out["profile"] = await _profile(dev, lambda: step(steps + 1))
    tokens = mbs[2].n_targets
    out.update({"step_s": dt, "tokens_per_step": tokens, "tokens_per_s": tokens / dt,
                "loss_last": struct.unpack("<f", await pending[-1][0].get())[0] / tokens if pending else None,
                "gpu_bytes_peak": dev.peak_allocated, "gpu_bytes_now": dev.allocated})
    out["nvidia_smi_process_mib"] = _nvidia_smi_mib()
    return out


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


def _bench_torch(config: dict, B: int, T: int, steps: int, r: int, targets: list, dtype: str) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    from peft import LoraConfig, get_peft_model
    from transformers import BitNetConfig, BitNetForCausalLM

    torch.manual_seed(0)
    cuda = torch.device("cuda")
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    dt = {"bf16": torch.bfloat16, "f32": torch.float32}[dtype]
    with torch.device(cuda):
        model = _online_bitnet(BitNetForCausalLM(BitNetConfig(**config)).to(dt))
    model = get_peft_model(model, LoraConfig(r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=targets,
                                             task_type="CAUSAL_LM"))
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
    torch.cuda.synchronize()
    t = time.perf_counter()
    for i in range(2, steps + 2):
        loss = step(ids[i])
    torch.cuda.synchronize()
    dt_s = (time.perf_counter() - t) / steps
    tokens = B * (T - 1)
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "torch_dtype": dtype,
           "torch_step_s": dt_s, "torch_tokens_per_s": tokens / dt_s, "torch_loss_last": float(loss),
           "torch_gpu_bytes_peak": torch.cuda.max_memory_allocated() - base}
    del model, opt, ids
    torch.cuda.empty_cache()
    return out


def bench_train(shape: str = "2b4t", micro_batch: int = 1, seq: int = 256, steps: int = 10, lora_r: int = 8,
                target_modules: str = "q_proj,v_proj", backend: str = "native", torch_dtypes: str = "bf16",
                compare_torch: bool | None = None, profile: bool = False) -> dict:
    """Time LoRA training steps on random weights of `shape`; print a summary and one
    JSON line; return the figures."""
    config = dict(SHAPES[shape], model_type="bitnet")
    targets = [m.strip() for m in target_modules.split(",") if m.strip()]
    res = {"shape": shape, "micro_batch": micro_batch, "seq": seq, "steps": steps, "lora_r": lora_r,
           "target_modules": targets}
    if compare_torch is not False:
        for dtype in [d for d in torch_dtypes.split(",") if d]:
            try:
                got = _bench_torch(config, micro_batch, seq, steps, lora_r, targets, dtype)
            except ImportError:
                if compare_torch:
                    raise
                break
            res.update({f"{k}_{dtype}" if k.startswith("torch_") and k != "torch_dtype" else k: v
                        for k, v in got.items()})
    res.update(asyncio.run(_bench_bitlora(config, micro_batch, seq, steps, lora_r, targets, backend, profile)))
    res["lean_tokens_per_s"] = 1000.0 / LEAN_MS_PER_TOKEN
    res["ratio_vs_lean"] = res["tokens_per_s"] / res["lean_tokens_per_s"]
    print(f"LoRA training, {shape} shapes (random ternary weights), r {lora_r} on {','.join(targets)}, "
          f"micro-batch {micro_batch} x {seq} tokens, on {res['adapter']}")
    print(f"  bitlora: {res['step_s'] * 1e3:.1f} ms/step, {res['tokens_per_s']:.0f} trained tokens/s "
          f"({res['ratio_vs_lean']:.0f}x the baseline's {res['lean_tokens_per_s']:.2f}/s); "
          f"GPU buffers {res['gpu_bytes_peak'] / 2**30:.2f} GiB at peak "
          f"(model {res['model_bytes'] / 2**30:.2f} GiB)")
    for dtype in torch_dtypes.split(","):
        if f"torch_tokens_per_s_{dtype}" in res:
            print(f"  torch {res['torch']} + PEFT, BitNetForCausalLM in {dtype}: "
                  f"{res[f'torch_step_s_{dtype}'] * 1e3:.1f} ms/step, {res[f'torch_tokens_per_s_{dtype}']:.0f} tokens/s, "
                  f"{res[f'torch_gpu_bytes_peak_{dtype}'] / 2**30:.2f} GiB peak; "
                  f"bitlora / torch tokens/s = {res['tokens_per_s'] / res[f'torch_tokens_per_s_{dtype}']:.2f}")
    for name, ms, n in res.get("profile", [])[:15]:
        print(f"    {ms:9.2f} ms  {n:4d} x  {name}")
    print("BENCH " + json.dumps(res))
    return res


def add_train_args(parser) -> None:
    """Flags of `bitlora bench train`."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default="2b4t", help="model shapes (default 2b4t)")
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=256, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps")
    parser.add_argument("--lora-r", type=int, default=8)
    parser.add_argument("--target-modules", default="q_proj,v_proj")
    parser.add_argument("--backend", default="native")
    parser.add_argument("--torch-dtypes", default="bf16", help="comma list of bf16, f32 for the torch runs")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch + PEFT comparison")
    parser.add_argument("--profile", action="store_true", help="also time each kernel over one step (native)")


def main_train(args) -> dict:
    return bench_train(args.shape, args.micro_batch, args.seq, args.steps, args.lora_r, args.target_modules,
                       args.backend, args.torch_dtypes, compare_torch=False if args.no_torch else None,
                       profile=args.profile)


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="bitlora training benchmark")
    add_train_args(ap)
    main_train(ap.parse_args())
