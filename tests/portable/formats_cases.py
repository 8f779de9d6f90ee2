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


async def case_ternary_throughput(dev, rows: int = 512, cols: int = 2560):
    """Million weights per second of the host-side codecs (no assertions)."""
    import random
    import time
    from bitlora.formats import ternary as T
    n = rows * cols
    rnd = random.Random(0)
    codes = rnd.randbytes(n).translate(bytes(b % 3 for b in range(256)))
    hp = T.hf_packed_from_codes(codes, rows, cols)
    i2 = bytes(T.I2_S.encode(codes, n))
    tq2 = bytes(T.TQ2_0.encode(codes, n))
    tq1 = bytes(T.TQ1_0.encode(codes, n))
    bf = rnd.randbytes(2 * n).translate(bytes(b if b % 2 == 0 else (b & 0x80) | 0x3C for b in range(256)))
    out = {}
    for name, f in [("pack", lambda: T.pack_codes(codes, rows, cols)),
                    ("hf_packed", lambda: T.packed_from_hf_packed(hp, rows, cols)),
                    ("i2_s", lambda: T.I2_S.decode_packed(i2, n)),
                    ("tq2_0", lambda: T.TQ2_0.decode_packed(tq2, n)),
                    ("tq1_0", lambda: T.TQ1_0.decode_packed(tq1, n)),
                    ("absmean_bf16", lambda: T.ternarize_absmean(bf, "bf16", n))]:
        t0 = time.perf_counter()
        f()
        out[name] = round(n / max(time.perf_counter() - t0, 1e-9) / 1e6, 1)
    return out
