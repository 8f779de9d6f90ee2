"""The built-in demo assets (py/bitlora/demo): dataset well formed, original and
up to date with its script; HF folder small and loadable by transformers as a
trained BitNet; GGUF loads to the same tensors as the HF folder."""
from __future__ import annotations

import importlib.util
import json
import pathlib

import pytest

from bitlora import demo

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED_ALPACA = ROOT.parent / "shared" / "data" / "alpaca_tiny.json"
MODEL_DIR = pathlib.Path(str(demo.MODEL_DIR))
MODEL_GGUF = pathlib.Path(str(demo.MODEL_GGUF))


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def records():
    return json.loads(demo.DATASET.read_text())


def test_dataset_shape(records):
    assert 200 <= len(records) <= 1000
    for r in records:
        assert set(r) == {"instruction", "input", "output"}
        assert all(isinstance(v, str) for v in r.values())
        assert r["instruction"] and r["output"]
    with_input = sum(1 for r in records if r["input"])
    assert 0.2 * len(records) < with_input < 0.8 * len(records)
    assert len({(r["instruction"], r["input"]) for r in records}) == len(records)


def test_dataset_is_what_the_script_makes(records):
    assert load_script("make_demo_data").make_records(seed=0, per_task=40) == records


def test_dataset_shares_nothing_with_stanford_alpaca(records):
    if not SHARED_ALPACA.exists():
        pytest.skip("shared Alpaca sample not present")
    theirs = json.loads(SHARED_ALPACA.read_text())
    norm = lambda s: " ".join(s.lower().split())  # noqa: E731
    assert not {norm(r["instruction"]) for r in records} & {norm(r["instruction"]) for r in theirs}
    long_theirs = {norm(r["output"]) for r in theirs if len(r["output"]) >= 20}
    assert not {norm(r["output"]) for r in records} & long_theirs


def test_assets_are_small():
    files = {p.name: p.stat().st_size for p in MODEL_DIR.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "generation_config.json"} <= set(files)
    assert sum(files.values()) < 8_000_000
    assert MODEL_GGUF.stat().st_size < 2_000_000
    assert MODEL_GGUF.read_bytes()[:4] == b"GGUF"


def test_config_is_a_tiny_online_bitnet():
    cfg = json.loads((MODEL_DIR / "config.json").read_text())
    assert cfg["model_type"] == "bitnet" and cfg["tie_word_embeddings"] is True
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"]) == (128, 4, 4, 2)
    assert cfg["quantization_config"]["quantization_mode"] == "online"
    assert cfg["quantization_config"]["linear_class"] == "autobitlinear"
    assert cfg["hidden_size"] % 128 == 0 and cfg["intermediate_size"] % 128 == 0  # whole I2_S blocks


def test_bitnet_demo_config_is_the_demo_models():
    """bitnet.DEMO_CONFIG (the benchmarks' `--shape demo`) is the shipped model's config."""
    from bitlora.bitnet import DEMO_CONFIG
    from bitlora.formats import open_checkpoint
    with open_checkpoint(str(MODEL_DIR)) as ck:
        assert {k: ck.config[k] for k in DEMO_CONFIG} == DEMO_CONFIG


def test_hf_folder_loads_and_generates(monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import torch._dynamo
    monkeypatch.setattr(torch._dynamo.config, "disable", True)  # HF's quantisers are @torch.compile'd
    from transformers.integrations.bitnet import AutoBitLinear
    tok = transformers.AutoTokenizer.from_pretrained(MODEL_DIR)
    model = transformers.AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    q = model.model.layers[0].self_attn.q_proj
    assert isinstance(q, AutoBitLinear) and q.online_quant       # ternarised on every forward
    ids = tok("the opposite of hot is", return_tensors="pt")["input_ids"]
    assert ids[0, 0].item() == tok.bos_token_id == 0 and (ids == tok.bos_token_id).sum() == 1
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=tok.eos_token_id)
    text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert text.startswith(" cold"), text                        # it learned the pretraining facts


def test_gguf_matches_hf_folder():
    pytest.importorskip("numpy")
    from bitlora.formats import open_checkpoint
    from bitlora.formats.tensors import TernaryTensor
    with open_checkpoint(MODEL_DIR) as hf, open_checkpoint(MODEL_GGUF) as gg:
        assert hf.config == gg.config
        assert sorted(hf.tensor_names()) == sorted(gg.tensor_names())
        for name in hf.tensor_names():
            a, b = hf.load(name), gg.load(name)
            if isinstance(a, TernaryTensor):
                assert a.packed == b.packed and abs(a.scale - b.scale) <= 1e-7 * abs(a.scale), name
            else:
                assert (a.dtype, bytes(a.data)) == (b.dtype, bytes(b.data)), name


def test_bitlora_tokenizer_matches_hf_on_the_demo(records):
    hf_tokenizers = pytest.importorskip("tokenizers")
    from bitlora.formats import open_checkpoint
    from bitlora.tokenizer import Tokenizer
    hf = hf_tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))
    ours = Tokenizer.from_json((MODEL_DIR / "tokenizer.json").read_text(),
                               json.loads((MODEL_DIR / "tokenizer_config.json").read_text()))
    with open_checkpoint(MODEL_GGUF) as gg:
        ours_gguf = Tokenizer.from_gguf_metadata(gg.gguf_metadata)
    texts = [f"### Instruction:\n{r['instruction']}\n\n### Input:\n{r['input']}\n\n### Response:\n{r['output']}"
             for r in records[:100]] + ["Héllo wörld! it's   x\n\n\ty 123456"]
    for t in texts:
        want = hf.encode(t, add_special_tokens=True).ids
        assert want[0] == 0 and ours.encode(t, add_special_tokens=True) == want, t
        assert ours_gguf.encode(t, add_special_tokens=True) == want, t
