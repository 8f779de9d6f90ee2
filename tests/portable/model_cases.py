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
