"""Portable cases for the whole model (py/bitlora/model.py): load a checkpoint given
as {file name: base64}, run the forward / generation, return plain lists. The pytest
side (tests/test_model.py) compares with transformers' BitNetForCausalLM.
Standard library + bitlora only."""
from __future__ import annotations

import base64
import time

from bitlora.model import Model


async def _load(dev, files, max_binding=None):
    srcs = {name: base64.b64decode(b) for name, b in files.items()}
    gg = [s for n, s in srcs.items() if n.endswith(".gguf")]
    return await Model.load(gg[0] if gg else srcs, device=dev, max_binding=max_binding)


async def case_logits(dev, files, ids, max_binding=None, upload_piece=None, kind=None, int8=True):
    """logits[T, V] (or [B*T, V] for ids[B, T]) and how the vocabulary was chunked. `kind`
    ("gpu" or "cpu") forces the device kind's kernel variants (Device.kind), `int8` False
    turns the GPU's int8 forward off (Device.int8_dot), as on a GPU without dot4I8Packed."""
    from bitlora.model import Model
    old = Model.UPLOAD_PIECE
    Model.UPLOAD_PIECE = upload_piece or old
    kind0, int8_0 = dev.kind, dev.int8_dot
    dev.kind, dev.int8_dot = kind or kind0, int8_0 and int8
    try:
        m = await _load(dev, files, max_binding)
        t0 = time.perf_counter()
        rows = await m.alogits(ids)
    finally:
        Model.UPLOAD_PIECE = old
        dev.kind, dev.int8_dot = kind0, int8_0
    return {"logits": [list(r) for r in rows], "chunks": [[v0, n] for v0, n, _ in m.embed],
            "seconds": time.perf_counter() - t0}


async def case_incremental(dev, files, ids, split):
    """Logits of the last position: ids[:split] at once, then one token at a time
    through the KV cache; every step's last row."""
    import array
    m = await _load(dev, files)
    cache = m.kv_cache(1, len(ids))
    out = []
    for chunk in [ids[:split]] + [[t] for t in ids[split:]]:
        buf = m.forward(chunk, cache=cache, logits="last")
        a = array.array("f")
        a.frombytes(await dev.read(buf, 0, 4 * m.V))
        out.append(list(a))
    return out


async def case_generate(dev, files, prompt, max_new_tokens, temperature=0.0, top_p=1.0, seed=0, eos=None):
    m = await _load(dev, files)
    if eos is not None:
        m.config["eos_token_id"] = eos
        m.tokenizer.eos_id = None
    g = await m.agenerate(prompt, max_new_tokens, temperature, top_p, seed)
    return {"text": g.text, "ids": g.ids, "prompt_ids": g.prompt_ids, "eos": g.stopped_at_eos}


async def case_generate_again(dev, files, prompt, max_new_tokens, times=3):
    """The same greedy generation `times` times (a prompt length's first run is plain, its
    second recorded in parts, its third replayed): the ids of each, the prompt's parts
    (layer ranges) and the recordings each run made."""
    m = await _load(dev, files)
    out = {"parts": [[r.start, r.stop] for r in m.prompt_parts()], "L": m.L, "ids": [], "recorded": []}
    for _ in range(times):
        before = m._steps.recorded
        out["ids"].append((await m.agenerate(prompt, max_new_tokens)).ids)
        out["recorded"].append(m._steps.recorded - before)
    return out


async def case_compile_once(dev, files, ids):
    """Pipelines compiled by a first logits + generate, and by doing both again."""
    m = await _load(dev, files)
    c0 = dev.pipelines_compiled
    await m.alogits(ids)
    await m.agenerate(ids[:3], 2)
    c1 = dev.pipelines_compiled
    await m.alogits(ids[:5])
    await m.agenerate(ids[:4], 3, temperature=1.0, top_p=0.5, seed=3)
    return {"first": c1 - c0, "again": dev.pipelines_compiled - c1}


async def case_generate_paths(dev, files, prompt, max_new_tokens, kind, lora_targets=None):
    """Greedy ids three ways on a device of `kind` ("gpu" or "cpu": the ops' variants):
    agenerate (one-token steps over the KV cache, ids chosen on the GPU, steps
    submitted ahead), and the argmax of the last row of a whole forward of prompt +
    ids so far for every step (no cache, the many-row kernels): "generate", "full".
    With lora_targets, both with a LoRA adapter whose B is random too (PEFT's init
    leaves B = 0), and the base model's generate as "base"."""
    import random
    from bitlora.config import TrainConfig
    from bitlora.formats import peft
    from bitlora.lora import Lora
    m = await _load(dev, files)
    kind0, dev.kind = dev.kind, kind
    try:
        await m.prepare(training=False)
        lora = None
        out = {}
        if lora_targets:
            out["base"] = (await m.agenerate(prompt, max_new_tokens)).ids
            cfg = TrainConfig(lora_r=4, lora_alpha=8, target_modules=lora_targets)
            rnd = random.Random(3)
            init = {k: (shape, [rnd.uniform(-0.5, 0.5) for _ in range(shape[0] * shape[1])])
                    for k, shape in peft.lora_shapes(m.config, cfg.target_modules, cfg.lora_r)}
            lora = await Lora.create(m, cfg, init=init)
        g = await m.agenerate(prompt, max_new_tokens, lora=lora)
        ids = list(g.prompt_ids)
        full = []
        for _ in range(len(g.ids)):
            row = (await m.alogits(ids, lora=lora))[-1]
            tok = max(range(len(row)), key=row.__getitem__)
            full.append(tok)
            ids.append(tok)
        out.update({"generate": g.ids, "full": full, "prompt_ids": g.prompt_ids})
        return out
    finally:
        dev.kind = kind0


async def case_generate_grows(dev, files):
    """A short generation, then a longer one (a bigger KV cache and scratch), then one
    with a LoRA adapter (the scratch grows its LoRA rows): each replaces the buffers it
    outgrows. Returns the device's buffer count and bytes after each, the long run's
    ids, and the same long run on a model that ran nothing else."""
    from bitlora.config import TrainConfig
    from bitlora.lora import Lora
    m = await _load(dev, files)
    await m.prepare(training=False)
    out = {"loaded": [dev.live_buffers, dev.allocated]}
    await m.agenerate("Hi", 3)
    out["short"] = [dev.live_buffers, dev.allocated]
    long_prompt = "The quick brown fox jumps over the lazy dog " * 2
    out["long_ids"] = (await m.agenerate(long_prompt, 24)).ids
    out["long"] = [dev.live_buffers, dev.allocated]
    out["scratch_before"] = len(m._scratch.buffers())
    lora = await Lora.create(m, TrainConfig(lora_r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    out["lora_made"] = [dev.live_buffers, dev.allocated]
    await m.agenerate("Hi", 3, lora=lora)
    out["adapted"] = [dev.live_buffers, dev.allocated]
    out["scratch_after"] = len(m._scratch.buffers())
    m.close()
    fresh = await _load(dev, files)
    await fresh.prepare(training=False)
    base = [dev.live_buffers, dev.allocated]
    out["fresh_long_ids"] = (await fresh.agenerate(long_prompt, 24)).ids
    out["fresh_long_growth"] = [dev.live_buffers - base[0], dev.allocated - base[1]]
    fresh.close()
    return out


async def case_generate_stream(dev, files, prompt, max_new_tokens, stop_after):
    """on_token sees every id as it arrives; should_stop ends the generation there."""
    m = await _load(dev, files)
    seen = []
    full = await m.agenerate(prompt, max_new_tokens, on_token=lambda t, ids: seen.append((t, len(ids))))

    async def slow(t, ids):   # an awaitable callback is awaited
        seen_async.append(t)
    seen_async = []
    cut = await m.agenerate(prompt, max_new_tokens, on_token=slow, should_stop=lambda: len(seen_async) >= stop_after)
    again = await m.agenerate(prompt, max_new_tokens)   # nothing left over from the stopped one
    return {"ids": full.ids, "seen": seen, "cut": cut.ids, "stopped": cut.stopped, "seen_async": seen_async,
            "again": again.ids, "steps_recorded": m._steps.recorded, "prompt_parts": len(m.prompt_parts()), "first_token_s": full.first_token_s, "total_s": full.total_s,
            "tokens_per_s": full.tokens_per_s(), "dispatches": full.dispatches, "host_s": full.host_s}
