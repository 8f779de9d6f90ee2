"""Times the BitNet forward (prefill and KV-cache decoding) at b1.58 2B-4T shapes on
the native wgpu device, with random weights (bench.train's). Native-only (numpy). This measures
speed; tests/test_model.py proves the numerics against transformers. It also checks
that decoding through the KV cache reproduces the prefill's last logits row.

    python -m bitlora.bench.forward [--layers 30] [--T 128] [--decode 32]

(Run it on a real GPU as docs/PERFORMANCE.md describes; on lavapipe, one layer + the
128256-row lm_head takes tens of seconds per token.)
"""
import argparse
import time

import numpy as np

from bitlora import gpu
from bitlora.bench.steps import random_loader
from bitlora.bitnet import CONFIG_2B4T
from bitlora.model import Model

async def main(layers, T, decode):
    dev = await gpu.get_device("native")
    print(dev.describe())
    cfg = dict(CONFIG_2B4T, num_hidden_layers=layers)
    t0 = time.perf_counter()
    m = await Model.create(dev, cfg, random_loader(cfg, 0))
    await dev.sync()
    print(f"upload {time.perf_counter() - t0:.1f} s; embedding chunks {[(v0, n) for v0, n, _ in m.embed]}")
    rng = np.random.default_rng(1)
    ids = rng.integers(0, cfg["vocab_size"], T + decode).tolist()
    V = cfg["vocab_size"]

    async def last_row(toks, cache):
        buf = m.forward(toks, cache=cache, logits="last")
        return np.frombuffer(await dev.read(buf, 0, 4 * V), np.float32)

    for _ in range(2):   # warm-up: buffers sized
        await last_row(ids[:T], m.kv_cache(1, T + decode))
    reps = 5
    t0 = time.perf_counter()
    for _ in range(reps):
        cache = m.kv_cache(1, T + decode)
        full = await last_row(ids[:T], cache)
    t_pre = (time.perf_counter() - t0) / reps
    print(f"prefill T={T}, L={layers}: {1e3 * t_pre:.1f} ms  ({T / t_pre:.0f} tokens/s)")
    t0 = time.perf_counter()
    for p in range(T, T + decode):
        row = await last_row([ids[p]], cache)
    t_dec = (time.perf_counter() - t0) / decode
    print(f"decode (KV cache, positions {T}..{T + decode - 1}): {1e3 * t_dec:.2f} ms/token "
          f"({1 / t_dec:.1f} tokens/s)")
    # KV-cache consistency: prefill all T + decode tokens at once, compare the last row
    ref = await last_row(ids[:T + decode], m.kv_cache(1, T + decode))
    d = np.abs(ref - row).max() / np.abs(ref).max()
    print(f"incremental vs full prefill, last row: max |diff| / max |logit| = {d:.2e}; "
          f"argmax {int(row.argmax())} vs {int(ref.argmax())}")
    del full


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--T", type=int, default=128)
    ap.add_argument("--decode", type=int, default=32)
    a = ap.parse_args()
    gpu.run(main(a.layers, a.T, a.decode))
