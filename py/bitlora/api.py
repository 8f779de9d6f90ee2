"""The notebook API, the same in both backends: plain calls natively, awaitables in
the browser (Pyodide cannot block on the GPU, so there every call returns a coroutine).

    model = bitlora.load_model("path/to/hf-folder-or.gguf")   # or a URL, bytes, {name: bytes}
    # browser: model = await bitlora.load_model(...)
    model.tokenizer, model.config
    rows = model.logits([1, 2, 3])          # T rows of V floats (array('f'))
    out = model.generate("Hello", max_new_tokens=32, temperature=0.7, top_p=0.9, seed=1)
    out.text, out.ids

Browser-safe: standard library + bitlora only.
"""
from __future__ import annotations

import sys


def in_browser() -> bool:
    return sys.platform == "emscripten"


def maybe_run(coro):
    """Run `coro` to completion natively; hand it back to be awaited in Pyodide."""
    if in_browser():
        return coro
    from . import gpu
    return gpu.run(coro)


async def aload_model(src, progress=None, device=None, max_binding: int | None = None):
    """Open a checkpoint (HF folder, GGUF file, URL, bytes, {file name: bytes/Blob}),
    upload its weights to the GPU and return a `bitlora.model.Model` with its
    tokenizer (None if the checkpoint has none). `max_binding` caps the bytes of one
    embedding / lm_head chunk (default: the device's binding limit)."""
    from . import gpu
    from .formats import open_checkpoint
    from .model import Model
    from .tokenizer import Tokenizer
    dev = device or await gpu.get_device()
    ck = open_checkpoint(src, progress=progress)
    try:
        tok = None
        if getattr(ck, "tokenizer_json", None):
            tok = Tokenizer.from_json(ck.tokenizer_json)
        elif getattr(ck, "gguf_metadata", None) and "tokenizer.ggml.tokens" in ck.gguf_metadata:
            tok = Tokenizer.from_gguf_metadata(ck.gguf_metadata)
        return await Model.create(dev, ck.config, ck.load, tok, max_binding, model_name(src))
    finally:
        ck.close()


def model_name(src) -> str:
    """A short name for where a model came from: a path or URL as given, else "bitnet"."""
    if isinstance(src, str):
        return str(src).rstrip("/")
    if hasattr(src, "__fspath__"):
        return str(src.__fspath__()).rstrip("/")
    return "bitnet"


def load_model(src, progress=None, device=None, max_binding: int | None = None):
    """`aload_model` as a plain call natively; in Pyodide an awaitable."""
    return maybe_run(aload_model(src, progress, device, max_binding))
