"""LoRA training steps on a BitNet with random weights, timed: the part of `bitlora bench
train` that runs on a bitlora device. Standard library + bitlora only, so the same
function runs natively and inside Pyodide in Chromium (`--backend browser` hands this
file to the page's worker, as the portable tests do).

    res = await case_bench_steps(dev, config, B, T, steps, r, targets, profile=False)

Random weights: ternary codes from random bytes (code 3, not a weight, becomes 0), norm
weights near 1, a bf16 embedding of magnitude ~0.01 (2B-4T stores it in bf16). Random
token ids; every position but the first of a sequence is a target.
"""
from __future__ import annotations

import array
import collections
import random
import struct
import time

from bitlora.bitnet import EMBED, FINAL_NORM, FULL, LM_HEAD, norm_sizes, projection_shapes
from bitlora.config import TrainConfig
from bitlora.data import MicroBatch
from bitlora.formats.tensors import FloatTensor, TernaryTensor
from bitlora.lora import Lora
from bitlora.model import Model
from bitlora.optim import AdamW

# byte -> the same byte with every 2-bit code 3 turned into 1 (a zero weight)
_NO_CODE3 = bytes(sum(((1 if (b >> s) & 3 == 3 else (b >> s) & 3) << s) for s in (0, 2, 4, 6)) for b in range(256))
# byte -> a bf16 high byte of magnitude 2^-7..2^-6 with the byte's sign
_BF16_HIGH = bytes(0x3C | (b & 0x80) for b in range(256))


def _randbytes(rnd: random.Random, n: int) -> bytes:
    """n random bytes (in pieces: one randbytes call takes fewer than 2^28)."""
    piece = 1 << 24
    return b"".join(rnd.randbytes(min(piece, n - i)) for i in range(0, n, piece))


def random_loader(config: dict, seed: int):
    """load(name) for Model.create with random weights of `config`'s shapes."""
    rnd = random.Random(seed)
    C, V = config["hidden_size"], config["vocab_size"]
    out_dims = {FULL[m]: s for m, s in projection_shapes(config).items()}
    norm_dims = norm_sizes(config)

    def near_one(n):
        return FloatTensor((n,), "f32", array.array("f", (1 + 0.1 * rnd.gauss(0, 1) for _ in range(n))).tobytes())

    def load(name: str):
        if name in (EMBED, LM_HEAD):
            raw = bytearray(2 * V * C)
            raw[0::2] = _randbytes(rnd, V * C)
            raw[1::2] = _randbytes(rnd, V * C).translate(_BF16_HIGH)
            return FloatTensor((V, C), "bf16", bytes(raw))
        if name == FINAL_NORM:
            return near_one(C)
        module = name.split(".", 3)[3].rsplit(".", 1)[0]      # model.layers.{i}.<module>.weight
        if module in norm_dims:
            return near_one(norm_dims[module])
        O, I = out_dims[module]
        return TernaryTensor((O, I), _randbytes(rnd, 4 * O * -(-I // 16)).translate(_NO_CODE3), 0.01)

    return load


def random_batch(B: int, T: int, V: int, seed: int) -> MicroBatch:
    rnd = random.Random(seed)
    ids = [rnd.randrange(2, V) for _ in range(B * T)]
    mask = ([0] + [1] * (T - 1)) * B
    return MicroBatch(B, T, ids, mask, [T] * B, list(range(B)), sum(mask))


async def _profile(dev, record_step, reps: int = 3, batches: int = 3) -> list:
    """GPU time per kernel over one step: the step's dispatches of each kernel recorded
    again `reps` times in one submit and waited for (best of `batches`), so a kernel's
    figure is its share of a step without the cost of waiting for each dispatch."""
    pending = []

    def timed_dispatch(kernel, bindings, groups, params=None):
        pending.append((kernel, bindings, groups, params))

    dev.dispatch = timed_dispatch
    try:
        res = await record_step()
    finally:
        del dev.dispatch
    dev.submit()
    await res[1].get()
    await dev.sync()
    by_kernel = collections.defaultdict(list)
    for d in pending:
        by_kernel[d[0].name].append(d)
    times = {}
    for name, calls in by_kernel.items():
        best = float("inf")
        for _ in range(batches):
            t = time.perf_counter()
            for _ in range(reps):
                for kernel, bindings, groups, params in calls:
                    dev.dispatch(kernel, bindings, groups, params)
            await dev.sync()
            best = min(best, (time.perf_counter() - t) / reps)
        times[name] = best
    return [[name, round(times[name] * 1e3, 3), len(by_kernel[name])] for name in sorted(times, key=times.get, reverse=True)]


async def case_bench_steps(dev, config: dict, B: int, T: int, steps: int, r: int, targets: list,
                           profile: bool = False, checkpointing: bool = False) -> dict:
    """Time `steps` optimizer steps (forward, loss, backward, clip, AdamW) of micro-batch
    B x T after two warm-up steps: ms/step, trained tokens/s, dispatches per step, the
    host's share (recording and submitting a step, not waiting for it) and peak GPU bytes."""
    base = dev.reset_peak()
    t = time.perf_counter()
    model = await Model.create(dev, config, random_loader(config, 0), name="random-" + str(config["num_hidden_layers"]))
    await dev.sync()
    out = {"adapter": dev.describe(), "kind": dev.kind, "model_upload_s": time.perf_counter() - t,
           "model_bytes": dev.allocated - base}
    cfg = TrainConfig(lora_r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=targets, micro_batch_size=B,
                      grad_accum=1, cutoff_len=T)
    lora = await Lora.create(model, cfg)
    acts = model.activations(B, T, lora, checkpointing=checkpointing)
    opt = AdamW(dev, lora.arena, lr=1e-4, weight_decay=0.0, max_grad_norm=1.0)
    await opt.prepare()
    mbs = [random_batch(B, T, config["vocab_size"], s) for s in range(steps + 3)]
    host = []

    async def step(i):
        t0 = time.perf_counter()
        n0 = dev.dispatches
        dev.clear(acts.top.loss_sum)
        model.forward(mbs[i].rows(), acts, lora, targets=mbs[i].targets, step=i)
        model.backward(acts, lora)
        loss = dev.read_later(acts.top.loss_sum, 0, 4)
        res = await opt.step(mbs[i].n_targets)
        host.append((time.perf_counter() - t0, dev.dispatches - n0))
        return loss, res

    t = time.perf_counter()
    await (await step(0))[1].get()
    out["first_step_s"] = time.perf_counter() - t
    await (await step(1))[1].get()
    host.clear()
    t = time.perf_counter()
    pending = []
    for i in range(2, steps + 2):
        pending.append(await step(i))
        if len(pending) > 1:            # read one step late, as the trainer does
            await pending.pop(0)[1].get()
    for _, res in pending:
        await res.get()
    dt = (time.perf_counter() - t) / steps
    tokens = mbs[2].n_targets
    out.update({"step_s": dt, "tokens_per_step": tokens, "tokens_per_s": tokens / dt,
                "host_s_per_step": sum(h for h, _ in host) / len(host), "dispatches_per_step": host[-1][1],
                "loss_last": struct.unpack("<f", await pending[-1][0].get())[0] / tokens,
                "gpu_bytes_peak": dev.peak_allocated - base})
    if profile:
        out["profile"] = await _profile(dev, lambda: step(steps + 2))
    return out
