"""Portable checkpoint-loading case: stdlib + bitlora only. In the browser the files
become JS Blobs read through BlobSource (FileReaderSync in the worker); natively they
are BytesSources. Returns a digest of every loaded tensor for the pytest side."""
from __future__ import annotations

import base64
import hashlib
import sys


def _source(name, data):
    """A JS Blob in the browser (open_checkpoint wraps it in a BlobSource), bytes natively."""
    if "pyodide" in sys.modules:
        import js
        from pyodide.ffi import to_js
        return js.Blob.new(to_js([to_js(data)]))
    return data


def digest(ck):
    out = {}
    for n in ck.tensor_names():
        t = ck.load(n)
        if hasattr(t, "packed"):
            out[n] = [hashlib.sha256(t.packed).hexdigest(), t.scale]
        else:
            out[n] = [hashlib.sha256(t.data).hexdigest(), t.dtype]
    return out


async def case_load_checkpoint(dev, files: dict):
    """files: {file name: base64}; one *.gguf file, or the files of a HF folder."""
    from bitlora.formats import open_checkpoint
    srcs = {name: _source(name, base64.b64decode(b)) for name, b in files.items()}
    gg = [s for n, s in srcs.items() if n.endswith(".gguf")]
    ticks = []
    ck = open_checkpoint(gg[0] if gg else srcs, progress=lambda d, t: ticks.append([d, t]))
    res = {"config": ck.config, "tensors": digest(ck), "last_tick": ticks[-1] if ticks else None,
           "blob": type(ck._sources[0]).__name__}
    ck.close()
    return res
