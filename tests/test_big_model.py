"""Big model files: a checkpoint with BitNet b1.58 2B-4T's layout and sizes and random
weights (scripts/make_big_model.py, written into a temporary folder at test time: a
1.19 GB Hugging Face folder and its 1.19 GB GGUF, I2_S with an F16 embedding) loads
natively and through the page's "Model folder" and "Model file". Each load prints its
time and peak memory (natively Python's traced heap; in the page the worker's Python
heap, wasm memory and JS heap); docs/RELIABILITY.md has the figures.

Slow (about 10 minutes on a 2-core machine, 2.4 GB of disk, 3 GB of memory while
converting), so it runs only when asked for:

    .venv/bin/python -m pytest -m slow tests/test_big_model.py
"""
import array
import json
import sys
import time
import tracemalloc

import pytest

from bitlora import gpu
from bitlora.bitnet import CONFIG_2B4T
from bitlora.model import load_model

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent.parent / "scripts"))
from make_big_model import TOKENIZER, make_big_model  # noqa: E402

pytestmark = pytest.mark.slow

L, C, F, V = (CONFIG_2B4T[k] for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size"))
KV = C // CONFIG_2B4T["num_attention_heads"] * CONFIG_2B4T["num_key_value_heads"]
PARAMS = L * (2 * C * C + 2 * KV * C + 3 * C * F) + V * C      # 2.41 G, the tied embedding once
MiB = 2 ** 20


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    if not (TOKENIZER / "tokenizer.json").exists():
        pytest.skip("the LLaMA-3 tokenizer.json is missing: run `npm ci` in the repository")
    t0 = time.perf_counter()
    paths = make_big_model(tmp_path_factory.mktemp("big"), gguf=True)
    sizes = {k: sum(f.stat().st_size for f in p.iterdir()) if p.is_dir() else p.stat().st_size
             for k, p in paths.items()}
    print(f"\nwritten in {time.perf_counter() - t0:.0f} s: "
          + ", ".join(f"{k} {v / 1e9:.2f} GB" for k, v in sizes.items()))
    return paths


def first_bytes(model):
    """Layer 0's q_proj as packed on the GPU, and the embedding's first row as f32."""
    dev = model.dev
    q = model.layers[0].proj["q_proj"].buf          # a view of the buffer q, k and v share
    packed = gpu.run(dev.read(q.buffer, q.offset, q.size))
    v0, rows, buf = model.embed[0]
    row = gpu.run(dev.read(buf, 0, (2 if model.embed.dtype == "bf16" else 4) * C))
    if model.embed.dtype == "bf16":
        wide = bytearray(4 * C)
        wide[2::4], wide[3::4] = row[0::2], row[1::2]
        row = bytes(wide)
    return bytes(packed), array.array("f", row).tolist()


def test_2b4t_layout_loads_natively(big):
    """Both files load with the 2B-4T shapes; Python's heap never holds the file (the
    embedding streams to the GPU); the folder and the GGUF give the same ternary codes
    and the same embedding values."""
    seen = {}
    for what in ("folder", "gguf"):
        tracemalloc.start()
        t0 = time.perf_counter()
        model = load_model(str(big[what]))
        dt = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"\nnatively, {what}: {dt:.0f} s (traced), Python heap peak {peak / MiB:.0f} MiB, "
              f"GPU {model.weight_bytes / MiB:.0f} MiB ({model.embed.dtype} embedding)")
        c = model.config
        assert (c["num_hidden_layers"], c["hidden_size"], c["vocab_size"]) == (L, C, V)
        assert model.param_count() == PARAMS and model.tokenizer.vocab_size == V
        assert peak < 256 * MiB                  # the files are 1.19 GB: streamed, not read whole
        seen[what] = first_bytes(model)
        model.close()
    assert seen["folder"][0] == seen["gguf"][0]                        # the same ternary codes
    assert seen["folder"][1] == seen["gguf"][1]                        # bf16 -> f16 -> f32 is exact here


WORKER_FIGURES = """
import json, tracemalloc, pyodide_js
from bitlora import webapp
m = webapp.S.model
out = json.dumps({"heap_peak": tracemalloc.get_traced_memory()[1], "wasm": pyodide_js._module.HEAP8.length,
                  "gpu": m.dev.allocated, "weights": m.weight_bytes})
tracemalloc.stop()
out
"""


@pytest.mark.browser
def test_2b4t_layout_loads_in_the_page(big, browser_session):
    """The folder through "Model folder", then the GGUF through "Model file", in one
    page: each shows the 2B-4T shapes; the worker's Python heap and wasm memory stay
    far below the file's size; after the GGUF only its weights are on the GPU (the
    folder's model was freed)."""
    from bitlora.bench.soak import JsHeaps
    from test_app_faults import open_app
    from test_app_models import model_rows
    page = open_app(browser_session)
    heaps = JsHeaps(page, timeout_s=900)
    size = {k: sum(f.stat().st_size for f in p.iterdir()) if p.is_dir() else p.stat().st_size for k, p in big.items()}
    try:
        for what, label, name in (("folder", "Model folder", big["folder"].name), ("gguf", "Model file", big["gguf"].name)):
            res = page.evaluate("(c) => bitloraTest.run(c, 60000)", "import tracemalloc\ntracemalloc.start()\n''")
            assert res["ok"], res
            js_peak = heaps._worker("Runtime.getHeapUsage")
            t0 = time.perf_counter()
            page.get_by_label(label).set_input_files(str(big[what]))
            status = page.get_by_role("status")
            while not any(s in status.text_content() for s in ("Model loaded", "model:")):
                usage = heaps._worker("Runtime.getHeapUsage")       # answered between the worker's reads
                js_peak = {k: max(v, usage[k]) for k, v in js_peak.items()}
                page.wait_for_timeout(500)
            dt = time.perf_counter() - t0
            assert f"Model loaded: {name}" in status.text_content(), status.text_content()
            res = page.evaluate("(c) => bitloraTest.run(c, 60000)", WORKER_FIGURES)
            assert res["ok"], res
            got = json.loads(res["value"])
            print(f"\nin the page, {what}: {dt:.0f} s, worker Python heap peak {got['heap_peak'] / MiB:.0f} MiB, "
                  f"wasm memory {got['wasm'] / MiB:.0f} MiB, JS heap peak {js_peak['usedSize'] / MiB:.1f} MiB "
                  f"(+ {js_peak['backingStorageSize'] / MiB:.0f} MiB of ArrayBuffers), "
                  f"GPU {got['gpu'] / MiB:.0f} MiB")
            rows = model_rows(page)
            assert rows["Layers"] == str(L) and rows["Vocabulary"] == str(V) and rows["Hidden / FFN"] == f"{C} / {F}"
            assert got["wasm"] < size[what] / 2 and got["heap_peak"] < 256 * MiB
            assert got["gpu"] - got["weights"] < MiB, got    # only the model just loaded holds GPU memory
    finally:
        heaps.close()
        page.close()
