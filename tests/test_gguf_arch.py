"""GGUF architecture names read as docs/FORMATS.md's table says, or refused.

Files are written by app/convert.py (the reference converters' packing: I2_S, TQ1_0,
TQ2_0, F16 token embedding), with keys left out the way the reference converters
leave them out and with tensors bitlora does not implement added. The graphs are
checked against transformers' BitNetForCausalLM configured to match (hidden_act) in
float64: `bitnet` as llama.cpp's converter writes it (no hidden_activation key) is
SiLU-gated; `bitnet-b1.58` / `bitnet-25` relu^2-gated. I2_S keeps the f32 scale: within
1e-5 of the largest logit (measured ~5e-7, float32 vs float64 transformers ~7e-7)."""
from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from bitlora.formats import FormatError, open_checkpoint
from fixtures.make_tiny import make_gguf, make_hf
from test_model import IDS, check, hf_model

# TQ blocks need rows of 256 weights; D = 64
WIDE = dict(vocab_size=300, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, rms_norm_eps=1e-5, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("arch")
    return {"silu": make_hf(root / "silu", "online_f32", dims=dict(WIDE, hidden_act="silu"), seed=3),
            "relu2": make_hf(root / "relu2", "online_f32", dims=WIDE, seed=4)}


def hf_logits64(folder, ids):
    """transformers' logits in float64, with the token embedding (tied: the head too)
    rounded to f16 as the converters write token_embd."""
    with torch.no_grad():
        m = hf_model(folder)
        e = m.model.embed_tokens.weight
        e.data = e.data.half().float()
        return m.double()(torch.tensor([ids])).logits[0].numpy()


def gguf_logits(run_case, path):
    r = run_case("model_cases", "case_logits", files={"m.gguf": base64.b64encode(path.read_bytes()).decode()}, ids=IDS)
    return r["logits"]


@pytest.mark.parametrize("ttype", ["i2_s", "tq2_0", "tq1_0"])
def test_bitnet_arch_is_silu_gated(run_case, folders, tmp_path, ttype):
    """arch `bitnet` without hidden_activation (llama.cpp's convert_hf_to_gguf.py): SiLU,
    with a warning; logits as transformers' BitNet with hidden_act="silu" in float64.
    TQ's f16 block scale flips a few int8 roundings: test_model's looser TQ bound."""
    g = make_gguf(folders["silu"], tmp_path / "m.gguf", ttype, "bitnet", kv={"hidden_activation": None})
    with open_checkpoint(g) as ck:
        assert ck.config["hidden_act"] == "silu"
        assert any("hidden_activation missing" in w and "SiLU" in w for w in ck.warnings), ck.warnings
    loose = ttype.startswith("tq")
    want = hf_logits64(folders["silu"], IDS)
    check(gguf_logits(run_case, g), want, f"bitnet {ttype}", rel=5e-2 if loose else 1e-5, agree=0.9 if loose else 1.0)
    relu = hf_logits64(folders["relu2"], IDS)                 # the other graph is far off
    assert np.abs(want - relu).max() > 0.1 * np.abs(want).max()


@pytest.mark.parametrize("arch", ["bitnet-b1.58", "bitnet-25"])
def test_b158_arch_relu2_and_missing_freq_base(run_case, folders, tmp_path, arch):
    """`bitnet-b1.58` / `bitnet-25` without rope.freq_base (a transformers-5 folder keeps
    rope_theta under rope_parameters, so the reference converters write no key): 500000
    (the 2B-4T's, HF's default) with a warning naming llama.cpp's 10000; relu^2 logits."""
    g = make_gguf(folders["relu2"], tmp_path / "m.gguf", "i2_s", arch,
                  kv={"rope.freq_base": None, "hidden_activation": None})
    with open_checkpoint(g) as ck:
        assert ck.config["hidden_act"] == "relu2" and ck.config["rope_theta"] == 500000.0
        assert any("rope.freq_base missing: using 500000" in w and "10000" in w for w in ck.warnings), ck.warnings
    check(gguf_logits(run_case, g), hf_logits64(folders["relu2"], IDS), arch, rel=1e-5, agree=1.0)


def test_defaults_per_arch_and_model_warnings(folders, tmp_path):
    """`bitnet` without rope.freq_base: 10000 (1bitLLM's, llama.cpp's), warned; an explicit
    hidden_activation "relu2" makes `bitnet` relu^2-gated, no warning about it; a file
    with every key: no warnings. Model.load carries the checkpoint's warnings."""
    from bitlora.model import load_model
    g = make_gguf(folders["relu2"], tmp_path / "a.gguf", "i2_s", "bitnet", kv={"rope.freq_base": None})
    with open_checkpoint(g) as ck:
        assert ck.config["rope_theta"] == 10000.0 and ck.config["hidden_act"] == "relu2"
        assert len(ck.warnings) == 1 and "using 10000" in ck.warnings[0]
    assert load_model(str(g)).warnings == [ck.warnings[0]]
    g = make_gguf(folders["relu2"], tmp_path / "b.gguf", "i2_s", "bitnet-b1.58")
    with open_checkpoint(g) as ck:
        assert ck.warnings == []


def _refused(folder, path, match, arch="bitnet-b1.58", **kw):
    g = make_gguf(folder, path, "i2_s", arch, **kw)
    with pytest.raises(FormatError, match=match):
        open_checkpoint(g)


@pytest.mark.parametrize("arch,kw,match", [
    ("llama", {}, r"general.architecture 'llama' is not a BitNet arch"),
    ("bitnet-2", {}, r"'bitnet-2'"),
    ("bitnet", {"kv": {"hidden_activation": "gelu"}}, r"bitnet.hidden_activation = 'gelu'"),
    ("bitnet-b1.58", {"kv": {"hidden_activation": "silu"}}, r"bitnet-b1.58.hidden_activation = 'silu'"),
    ("bitnet-25", {"kv": {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0}}, r"RoPE scaling .*'yarn'"),
    ("bitnet-b1.58", {"kv": {"rope.dimension_count": 32}}, r"rope.dimension_count 32 != head dim 64"),
    ("bitnet-b1.58", {"kv": {"expert_count": 8}}, r"expert_count = 8"),
    ("bitnet-b1.58", {"extra": {"blk.0.attn_q.bias": np.zeros(256)}}, r"'blk.0.attn_q.bias' is not part"),
    ("bitnet-25", {"extra": {"rope_freqs.weight": np.linspace(1, 4, 32)}}, r"frequency factors"),
    ("bitnet-b1.58", {"extra": {"blk.0.attn_q.scale": np.ones(1)}}, r"'blk.0.attn_q.scale' is not part"),
])
def test_unimplemented_is_refused(folders, tmp_path, arch, kw, match):
    _refused(folders["relu2"], tmp_path / "m.gguf", match, arch, **kw)


def test_tolerated_tensors(folders, tmp_path):
    """rope_freqs of all ones changes nothing; a `bitnet` file's blk.N.<proj>.scale [1]
    multiplies the projection (llama.cpp's build_bitnet), so it scales our scale; linear
    RoPE scaling of factor 1 (what llama.cpp's converter writes for `bitnet`) is no scaling."""
    f = folders["relu2"]
    base = make_gguf(f, tmp_path / "a.gguf", "i2_s", "bitnet")
    extra = {"rope_freqs.weight": np.ones(32), "blk.1.ffn_down.scale": np.full(1, 2.5)}
    g = make_gguf(f, tmp_path / "b.gguf", "i2_s", "bitnet", extra=extra,
                  kv={"rope.scaling.type": "linear", "rope.scaling.factor": 1.0})
    name = "model.layers.1.mlp.down_proj.weight"
    with open_checkpoint(base) as a, open_checkpoint(g) as b:
        assert a.config == b.config
        ta, tb = a.load(name), b.load(name)
        assert bytes(ta.packed) == bytes(tb.packed) and tb.scale == pytest.approx(2.5 * ta.scale, rel=1e-7)


def test_same_greedy_generation_hf_folder_and_each_gguf(run_case, tmp_path):
    """One model as a HF folder and as I2_S, TQ2_0 and TQ1_0 GGUFs (bf16 embedding; its
    bf16 weight scales are exact in TQ's f16 `d`, so no format rounds anything here):
    from the same prompt ids (the GGUF tokenizer adds BOS, tokenizer.json does not) the
    same greedy continuation from each, and transformers' own."""
    from test_model import files_of
    f = make_hf(tmp_path / "hf", "offline_autobitlinear", dims=WIDE, seed=5)
    kw = dict(prompt="The quick brown", max_new_tokens=10)
    want = run_case("model_cases", "case_generate", files=files_of(f), **kw)
    m = hf_model(f)
    ids = torch.tensor([want["prompt_ids"]])
    with torch.no_grad():
        g = m.generate(ids, max_new_tokens=10, do_sample=False, eos_token_id=m.config.eos_token_id,
                       pad_token_id=m.config.eos_token_id)
    assert want["ids"] == g[0, ids.shape[1]:].tolist()
    for ttype in ("i2_s", "tq2_0", "tq1_0"):
        p = make_gguf(f, tmp_path / f"{ttype}.gguf", ttype, "bitnet-b1.58", embed_type="bf16")
        r = run_case("model_cases", "case_generate", files={"m.gguf": base64.b64encode(p.read_bytes()).decode()},
                     prompt=want["prompt_ids"], max_new_tokens=10)
        assert r["ids"] == want["ids"], ttype


def test_cli_prints_the_default_it_used(folders, tmp_path):
    """`bitlora train` on a GGUF missing a key whose default differs between
    implementations says which value it used, and trains (the tiny model's 64 positions
    hold no Alpaca preamble plus a response: the prompt tokens are targets here)."""
    import json
    import subprocess
    import sys
    g = make_gguf(folders["relu2"], tmp_path / "w.gguf", "i2_s", "bitnet", kv={"rope.freq_base": None})
    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"instruction": "Say yes.", "input": "", "output": "yes"}] * 4))
    r = subprocess.run([sys.executable, "-m", "bitlora.app.cli", "train", "--model", str(g), "--data", str(data),
                        "--max-steps", "1", "--micro-batch-size", "2", "--grad-accum", "1", "--train-on-inputs",
                        "--out",
                        str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "warning: bitnet.rope.freq_base missing: using 10000" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("ttype,block", [("i2_s", 128), ("tq2_0", 256), ("tq1_0", 256)])
def test_converter_refuses_shapes_its_type_cannot_pack(tmp_path, ttype, block):
    """A projection whose weights (I2_S) or rows (TQ1_0, TQ2_0) are not whole blocks is a
    message naming the tensor and the way out, with exit status 1, and no file."""
    import subprocess
    import sys
    from fixtures.make_tiny import ODD
    folder = make_hf(tmp_path / "odd", "online_f32", dims=ODD, seed=3)
    out = tmp_path / "x.gguf"
    r = subprocess.run([sys.executable, "-m", "bitlora.app.convert", str(folder), str(out), "--type", ttype],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and f"blocks of {block} weights" in r.stderr and "--type f16" in r.stderr
    assert "Traceback" not in r.stderr and not out.exists()
