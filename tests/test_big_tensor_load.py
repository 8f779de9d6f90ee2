"""Loading a model whose embedding is bigger than the loader's read-ahead bound
(formats.checkpoint.LAZY_OVER, 64 MB) streams it: the tensor is read slice by slice
while it is uploaded (Model.UPLOAD_PIECE at a time), so Python's heap never holds it
whole (the issue: a 1.2 GB GGUF must load without a second full copy in Python's
heap). Here both bounds are scaled down 64x so a 20 MB F16 embedding (vocabulary
40 000 x 256) shows the same thing quickly; the browser reads a File through the same
code (formats.source.BlobSource)."""
import tracemalloc

import pytest

from bitlora.model import load_model
from bitlora.formats import checkpoint
from bitlora.model import Model
from fixtures.make_tiny import TINY, make_gguf, make_hf

VOCAB = 40_000
EMBED_BYTES = VOCAB * TINY["hidden_size"] * 2    # F16 in the GGUF


@pytest.fixture(scope="module")
def big_gguf(tmp_path_factory):
    root = tmp_path_factory.mktemp("big")
    hf = make_hf(root / "hf", "online_f32", dims=dict(TINY, vocab_size=VOCAB))
    return make_gguf(hf, root / "big.gguf", "i2_s", embed_type="f16")


def traced_load(path):
    tracemalloc.start()
    try:
        model = load_model(str(path))
        return model, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_big_embedding_streams_into_the_gpu(big_gguf, monkeypatch):
    eager, eager_peak = traced_load(big_gguf)       # the bounds as shipped: read whole (20 MB < 64 MB)
    monkeypatch.setattr(checkpoint, "LAZY_OVER", checkpoint.LAZY_OVER // 64)
    monkeypatch.setattr(Model, "UPLOAD_PIECE", Model.UPLOAD_PIECE // 64)
    assert EMBED_BYTES > checkpoint.LAZY_OVER
    model, peak = traced_load(big_gguf)
    print(f"embedding {EMBED_BYTES / 2**20:.1f} MiB (F16); peak traced heap while loading: "
          f"{eager_peak / 2**20:.2f} MiB read whole, {peak / 2**20:.2f} MiB streamed")
    # streamed, the peak is what the rest of the load needs (the 40 000-token tokenizer)
    # plus one upload piece: at least the embedding's size below the eager load's
    assert peak < eager_peak - 0.9 * EMBED_BYTES
    ids = [1, 2, 3]
    assert model.logits(ids)[-1] == eager.logits(ids)[-1]
