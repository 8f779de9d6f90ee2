"""Hub references natively: repo ids and hub URLs parse to files and URLs; load_model
downloads a repo once into the cache folder from a local server laid out like the Hub
(/{repo}/resolve/{rev}/{file}, redirects, CORS) and loads it. No network."""
import pytest

from bitlora import gpu, hub
from bitlora.model import Model
from fixtures.make_tiny import TINY, make_gguf, make_hf
from test_app_ux import _mimic_hub


@pytest.mark.parametrize("text,want", [
    ("microsoft/bitnet-b1.58-2B-4T", ("microsoft/bitnet-b1.58-2B-4T", "main", list(hub.FILES))),
    ("org/name@v1.0", ("org/name", "v1.0", list(hub.FILES))),
    ("https://huggingface.co/org/name", ("org/name", "main", list(hub.FILES))),
    ("https://huggingface.co/org/name/tree/dev", ("org/name", "dev", list(hub.FILES))),
    ("https://huggingface.co/org/name/blob/main/m.gguf", ("org/name", "main", ["m.gguf"])),
    ("https://huggingface.co/org/name/resolve/r2/m.gguf", ("org/name", "r2", ["m.gguf"])),
    ("https://example.org/m.gguf", None), ("model.gguf", None), ("a/b/c", None), ("/abs/path", None),
])
def test_parse(text, want):
    ref = hub.parse(text)
    assert (ref and (ref["repo"], ref["revision"], ref["files"])) == want


def test_load_model_downloads_once_into_the_cache(tmp_path, monkeypatch):
    hf = make_hf(tmp_path / "tiny", "online_f32", dims=dict(TINY, max_position_embeddings=256), seed=1)
    make_gguf(hf, hf / "tiny.gguf", "tq2_0")
    httpd, base, got = _mimic_hub(hf)
    monkeypatch.setenv("BITLORA_HUB", base)
    monkeypatch.setenv("BITLORA_CACHE", str(tmp_path / "cache"))
    try:
        seen = []
        model = gpu.run(Model.load("org/tiny", progress=lambda d, t: seen.append((d, t))))
        assert model.name == "org/tiny" and model.config["hidden_size"] == TINY["hidden_size"]
        assert sorted(got) == ["config.json", "model.safetensors", "tokenizer.json"]
        assert (tmp_path / "cache/hub/org/tiny/main/model.safetensors").read_bytes() == \
            (hf / "model.safetensors").read_bytes()
        gpu.run(Model.load("org/tiny"))
        assert len(got) == 3                                       # the second load reads the cache
        gguf = gpu.run(Model.load(f"{base}/org/tiny/resolve/main/tiny.gguf"))
        assert got[-1] == "tiny.gguf" and gguf.name == "org/tiny"
        with pytest.raises(OSError, match="HTTP 404"):
            gpu.run(Model.load("org/missing"))
    finally:
        httpd.shutdown()
        httpd.server_close()
