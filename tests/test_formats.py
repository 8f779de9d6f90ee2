"""Checkpoint loaders against transformers (HF folders) and across GGUF types.

The tiny fixtures are written once per session (tests/fixtures/make_tiny.py). Every
projection must come out as the same ternary codes and scale whichever file it came
from, so the model sees the same weights (hence the same logits)."""
from __future__ import annotations

import http.server
import struct
import threading
import time

import numpy as np
import pytest

from bitlora.formats import FormatError, open_checkpoint
from bitlora.formats import ternary as T
from bitlora.formats.source import BytesSource
from bitlora.formats.tensors import FloatTensor, TernaryTensor
from fixtures.make_tiny import ODD, make_gguf, make_hf

KINDS = ["online_f32", "online_bf16", "offline_autobitlinear", "offline_bitlinear"]
GGUF_TYPES = ["tq1_0", "tq2_0", "i2_s", "f16", "f32"]


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    out = {k: make_hf(root / k, k) for k in KINDS}
    out["sharded"] = make_hf(root / "sharded", "online_f32", shards=3)
    out["odd_online"] = make_hf(root / "odd_online", "online_bf16", dims=ODD)
    out["odd_offline"] = make_hf(root / "odd_offline", "offline_bitlinear", dims=ODD)
    for t in GGUF_TYPES:
        out[t] = make_gguf(out["online_f32"], root / f"m-{t}.gguf", t,
                           arch="bitnet" if t == "tq1_0" else "bitnet-b1.58")
    out["i2_s_bf16emb"] = make_gguf(out["offline_autobitlinear"], root / "auto-i2s.gguf", "i2_s",
                                    embed_type="bf16")
    return out


def codes_of(t: TernaryTensor) -> np.ndarray:
    O, I = t.shape
    return np.frombuffer(T.unpack_codes(t.packed, O, I), np.uint8).reshape(O, I).astype(np.int8) - 1


def dequant(t: TernaryTensor) -> np.ndarray:
    return codes_of(t).astype(np.float32) * np.float32(t.scale)


def floats(t: FloatTensor) -> np.ndarray:
    raw = np.frombuffer(t.data, {"f32": "<f4", "f16": "<f2", "bf16": "<u2"}[t.dtype])
    if t.dtype == "bf16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32).reshape(t.shape)


def hf_effective_weights(folder):
    """name -> the weight transformers actually multiplies with, in float32."""
    import torch
    import torch._dynamo
    from transformers import BitNetForCausalLM
    from transformers.integrations import bitnet as hb
    torch._dynamo.config.disable = True            # HF's helpers are torch.compile'd
    model = BitNetForCausalLM.from_pretrained(folder, dtype=torch.float32)
    out = {}
    with torch.no_grad():
        for mname, m in model.named_modules():
            if isinstance(m, hb.AutoBitLinear):
                w = hb.WeightQuant.apply(m.weight) if m.online_quant else m.weight * m.weight_scale
            elif isinstance(m, hb.BitLinear):
                w = hb.unpack_weights(m.weight, torch.float32) / m.weight_scale
            else:
                continue
            out[mname + ".weight"] = w.float().numpy()
        for name, p in model.named_parameters():
            if p.dtype.is_floating_point and name not in out:
                out[name] = p.detach().float().numpy()
    return out, model.config


@pytest.mark.parametrize("kind", KINDS + ["odd_online", "odd_offline"])
def test_hf_folder_matches_transformers(tiny, kind):
    ref, hcfg = hf_effective_weights(tiny[kind])
    ck = open_checkpoint(tiny[kind])
    assert ck.config["hidden_size"] == hcfg.hidden_size and ck.config["tie_word_embeddings"] == hcfg.tie_word_embeddings
    assert ck.tokenizer_json and '"<|end_of_text|>"' in ck.tokenizer_json
    for name in ck.tensor_names():
        t = ck.load(name)
        r = ref[name]
        if isinstance(t, TernaryTensor):
            ours = dequant(t)
            assert ours.shape == r.shape, name
            np.testing.assert_array_equal(codes_of(t), np.sign(r).astype(np.int8), err_msg=name)
            if kind.startswith("offline"):
                np.testing.assert_array_equal(ours, r, err_msg=name)     # bit-exact
            else:   # torch's float32 mean sums in its own order: a few ulps at most
                np.testing.assert_allclose(ours, r, rtol=1e-6, atol=0, err_msg=name)
        else:
            np.testing.assert_array_equal(floats(t), r, err_msg=name)
    assert ("lm_head.weight" in ck.tensor_names()) == (not ck.config["tie_word_embeddings"])
    ck.close()


def test_sharded_folder_same_as_single(tiny):
    a, b = open_checkpoint(tiny["online_f32"]), open_checkpoint(tiny["sharded"])
    assert a.tensor_names() == b.tensor_names()
    for n in a.tensor_names():
        assert a.load(n) == b.load(n), n


@pytest.mark.parametrize("ttype", GGUF_TYPES)
def test_gguf_same_weights_as_hf(tiny, ttype):
    """TQ1_0, TQ2_0, I2_S (and F16/F32) GGUFs of one model give the same ternary codes and
    scales as the HF folder (scale rounded to f16 where the format stores f16)."""
    hf, gg = open_checkpoint(tiny["online_f32"]), open_checkpoint(tiny[ttype])
    assert gg.config == hf.config
    assert gg.tensor_names() == hf.tensor_names()
    md = gg.gguf_metadata
    assert md["tokenizer.ggml.model"] == "gpt2" and len(md["tokenizer.ggml.tokens"]) == 300
    for n in hf.tensor_names():
        a, b = hf.load(n), gg.load(n)
        if isinstance(a, TernaryTensor):
            assert b.shape == a.shape and b.packed == a.packed, n       # codes identical
            want = a.scale if ttype in ("i2_s", "f32") else struct.unpack("<e", struct.pack("<e", a.scale))[0]
            assert b.scale == want, (n, a.scale, b.scale)
        elif n.endswith("norm.weight"):
            np.testing.assert_array_equal(floats(b), floats(a), err_msg=n)
        else:
            np.testing.assert_array_equal(floats(b), floats(a).astype(np.float16).astype(np.float32), err_msg=n)


def test_gguf_bf16_embedding_and_offline_source(tiny):
    hf, gg = open_checkpoint(tiny["offline_autobitlinear"]), open_checkpoint(tiny["i2_s_bf16emb"])
    for n in hf.tensor_names():
        a, b = hf.load(n), gg.load(n)
        if isinstance(a, TernaryTensor):
            assert (a.packed, a.scale) == (b.packed, b.scale), n
        else:
            np.testing.assert_array_equal(floats(b), floats(a), err_msg=n)
    assert gg.load("model.embed_tokens.weight").dtype == "bf16"


def test_bytes_source_and_progress(tiny):
    data = open(tiny["tq2_0"], "rb").read()
    seen = []
    ck = open_checkpoint(BytesSource(data, "mem.gguf"), progress=lambda d, t: seen.append((d, t)))
    ref = open_checkpoint(tiny["tq2_0"])
    for n in ck.tensor_names():
        assert ck.load(n) == ref.load(n)
    assert seen and seen[-1][0] == seen[-1][1] > 0
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))
    assert open_checkpoint(data).config == ref.config          # plain bytes too


def test_dict_folder(tiny):
    files = {p.name: p.read_bytes() for p in tiny["offline_bitlinear"].iterdir()}
    a, b = open_checkpoint(files), open_checkpoint(tiny["offline_bitlinear"])
    n = "model.layers.1.mlp.down_proj.weight"
    assert a.load(n) == b.load(n)


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        path = self.translate_path(self.path)
        try:
            data = open(path, "rb").read()
        except OSError:
            self.send_error(404)
            return
        rng = self.headers.get("Range")
        if rng and self.server.ranges:
            a, b = rng.split("=")[1].split("-")
            a, b = int(a), min(int(b), len(data) - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {a}-{b}/{len(data)}")
            body = data[a:b + 1]
        else:
            self.send_response(200)
            body = data
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("ranges", [True, False])
def test_url_source(tiny, ranges):
    import functools
    root = tiny["tq2_0"].parent
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                          functools.partial(_RangeHandler, directory=str(root)))
    srv.ranges = ranges                     # without Range support: one download to a temp file
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        base = f"http://127.0.0.1:{srv.server_address[1]}/"
        ck = open_checkpoint(base + tiny["tq2_0"].name)
        ref = open_checkpoint(tiny["tq2_0"])
        n = "model.layers.0.self_attn.k_proj.weight"
        assert ck.load(n) == ref.load(n)
        hf = open_checkpoint(base + "offline_bitlinear/")
        assert hf.load(n) == open_checkpoint(tiny["offline_bitlinear"]).load(n)
    finally:
        srv.shutdown()


# -- pack / unpack round trips per format ----------------------------------------

@pytest.mark.parametrize("rows,cols", [(1, 1), (3, 16), (5, 33), (8, 256)])
def test_pack_unpack_roundtrip(rows, cols):
    rng = np.random.default_rng(rows * 1000 + cols)
    codes = rng.integers(0, 3, rows * cols, dtype=np.uint8)
    packed = T.pack_codes(codes.tobytes(), rows, cols)
    assert len(packed) == rows * -(-cols // 16) * 4
    words = np.frombuffer(packed, "<u4").reshape(rows, -1)
    i = np.arange(cols)
    got = (words[:, i // 16] >> (2 * (i % 16)).astype(np.uint32)) & 3          # the documented layout
    np.testing.assert_array_equal(got, codes.reshape(rows, cols))
    pad = (words[:, :, None] >> (2 * np.arange(16)).astype(np.uint32) & 3).reshape(rows, -1)[:, cols:]
    assert (pad == 1).all()
    assert T.unpack_codes(packed, rows, cols) == codes.tobytes()


def test_hf_packed_roundtrip_matches_transformers():
    import torch
    from transformers.integrations.bitnet import pack_weights
    rng = np.random.default_rng(1)
    t = rng.integers(-1, 2, (12, 7)).astype(np.int8)
    hp = pack_weights(torch.tensor(t, dtype=torch.int8)).numpy().tobytes()
    codes = T.codes_from_hf_packed(hp, 12, 7)
    np.testing.assert_array_equal(np.frombuffer(codes, np.uint8).reshape(12, 7).astype(np.int8) - 1, t)
    assert T.hf_packed_from_codes(codes, 12, 7) == hp
    t = rng.integers(-1, 2, (8, 32)).astype(np.int8)
    hp = pack_weights(torch.tensor(t, dtype=torch.int8)).numpy().tobytes()
    assert T.packed_from_hf_packed(hp, 8, 32) == T.pack_codes(T.codes_from_hf_packed(hp, 8, 32), 8, 32)


@pytest.mark.parametrize("fmt", ["TQ1_0", "TQ2_0", "I2_S"])
def test_block_format_roundtrip_and_reference(fmt):
    import gguf
    from bitlora.app.convert import i2s_bytes
    F = getattr(T, fmt)
    rng = np.random.default_rng(2)
    n = F.W * 9
    t = rng.integers(-1, 2, n).astype(np.int8)
    codes = (t + 1).astype(np.uint8).tobytes()
    enc = F.encode(codes, n)
    assert F.decode(bytes(enc), n) == codes
    assert F.decode_packed(bytes(enc), n) == T.pack_codes(codes, 9, F.W)      # direct path
    if fmt == "I2_S":
        ref = i2s_bytes(t, 0.5).tobytes()
        assert bytes(enc) == ref[:n // 4]
    else:                 # the gguf package's quantiser is the reference
        qt = getattr(gguf.GGMLQuantizationType, fmt)
        ref = gguf.quants.quantize((t.astype(np.float32) * 0.25).reshape(-1, 256), qt).tobytes()
        assert F.decode(ref, n) == codes
        enc[F.BS - 2::F.BS] = ref[F.BS - 2::F.BS]
        enc[F.BS - 1::F.BS] = ref[F.BS - 1::F.BS]
        assert bytes(enc) == ref
        assert T.tq_scale(ref, F, n) == (0.25, [])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_absmean_matches_torch(dtype):
    import torch
    torch.manual_seed(3)
    w = (torch.randn(64, 80) * 0.03).to(getattr(torch, dtype))
    wf = w.float()
    s = 1.0 / wf.abs().mean().clamp(min=1e-5)
    t = (wf * s).round().clamp(-1, 1)
    data = w.view(torch.uint8).numpy().tobytes() if dtype != "float32" else w.numpy().tobytes()
    codes, scale = T.ternarize_absmean(data, {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}[dtype], w.numel())
    np.testing.assert_array_equal(np.frombuffer(codes, np.uint8).astype(np.int8) - 1, t.flatten().numpy())
    assert abs(scale / (1 / s).item() - 1) < 1e-6


def test_throughput_report(run_case, backend, capsys):
    """Not a gate: prints million weights/s of the host-side codecs per backend
    (2B-4T has 2.1 G ternary weights)."""
    res = run_case("formats_cases", "case_ternary_throughput")
    assert set(res) == {"pack", "hf_packed", "i2_s", "tq2_0", "tq1_0", "absmean_bf16"}
    with capsys.disabled():
        print(f"\n{backend}: million weights/s: " + ", ".join(f"{k} {v:g}" for k, v in res.items()))


@pytest.mark.parametrize("which", ["tq1_0", "odd_offline"])
def test_portable_load(run_case, backend, tiny, which):
    """The loaders run unchanged in Pyodide (no numpy), reading JS Blobs there."""
    import base64
    import sys
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent / "portable"))
    from formats_cases import digest
    p = tiny[which]
    paths = [p] if p.is_file() else sorted(p.iterdir())
    files = {q.name: base64.b64encode(q.read_bytes()).decode() for q in paths}
    res = run_case("formats_cases", "case_load_checkpoint", files=files)
    ck = open_checkpoint(p)
    assert res["config"] == ck.config
    assert res["tensors"] == json_round(digest(ck))
    assert res["last_tick"][0] == res["last_tick"][1] > 0
    assert res["blob"] == ("BlobSource" if backend == "browser" else "BytesSource")


def json_round(x):
    import json
    return json.loads(json.dumps(x))


@pytest.mark.parametrize("which", ["online_bf16", "offline_autobitlinear", "tq1_0", "i2_s", "f16"])
def test_chunked_reads(tiny, which, monkeypatch):
    """Tensors above the chunk size are read piecewise into a bytearray: same result,
    progress after every chunk, ending at the total."""
    from bitlora.formats import checkpoint
    ref = open_checkpoint(tiny[which])
    want = {n: ref.load(n) for n in ref.tensor_names()}
    monkeypatch.setattr(checkpoint, "CHUNK", 4096)
    ticks = []
    ck = open_checkpoint(tiny[which], progress=lambda d, t: ticks.append((d, t)))
    for n in ck.tensor_names():
        t = ck.load(n)
        got = (t.shape, bytes(t.packed), t.scale) if isinstance(t, TernaryTensor) else (t.shape, bytes(t.data), t.dtype)
        w = want[n]
        assert got == ((w.shape, bytes(w.packed), w.scale) if isinstance(w, TernaryTensor) else (w.shape, bytes(w.data), w.dtype)), n
    assert len(ticks) > len(ck.tensor_names()) and ticks[-1][0] == ticks[-1][1]


def test_gguf_tokenizer_metadata(tiny):
    """The converter's tokenizer.ggml.* keys give the same token ids as tokenizer.json
    (through bitlora.tokenizer and through HF tokenizers)."""
    from tokenizers import Tokenizer as HFTokenizer
    from bitlora.tokenizer import Tokenizer
    gg = open_checkpoint(tiny["tq2_0"])
    hf = open_checkpoint(tiny["online_f32"])
    md = gg.gguf_metadata
    assert md["tokenizer.ggml.pre"] == "gpt-2"
    assert md["tokenizer.ggml.bos_token_id"] == hf.config["bos_token_id"]
    ours = Tokenizer.from_gguf_metadata(md)
    ref = HFTokenizer.from_str(hf.tokenizer_json)
    for text in ["The quick brown fox", "Hello, world!  I'm fine; 12345 tokens\n\nbye", "<|end_of_text|>x"]:
        assert ours.encode(text) == ref.encode(text, add_special_tokens=False).ids, text


def test_tq_block_scales():
    """One scale per tensor: all-zero blocks may carry d = 0; differing scales are refused."""
    n = 256 * 3
    codes = bytearray(np.random.default_rng(5).integers(0, 3, n, dtype=np.uint8).tobytes())
    codes[256:512] = b"\x01" * 256
    F = T.TQ2_0
    blocks = F.encode(bytes(codes), n)
    d = struct.pack("<e", 0.5)
    for b, dd in enumerate([d, b"\0\0", d]):
        blocks[b * F.BS + 64:b * F.BS + 66] = dd
    assert T.tq_scale(bytes(blocks), F, n) == (0.5, [1])
    blocks[1 * F.BS] = 0x00                        # garbage codes under d = 0 count as zeros
    scale, zero = T.tq_scale(bytes(blocks), F, n)
    assert T.zero_blocks(F.decode(bytes(blocks), n), F.W, zero) == bytes(codes)
    blocks[2 * F.BS + 64:2 * F.BS + 66] = struct.pack("<e", 0.25)
    assert T.tq_scale(bytes(blocks), F, n) is None


def test_f16_to_f32_matches_struct_for_every_bit_pattern():
    """formats.tensors.f16_to_f32 (byte tables, used to widen F16 embeddings) gives
    exactly what struct's "e" gives, for all 65 536 f16 values: normals, +-0,
    subnormals, Inf and NaN payloads."""
    import struct
    from bitlora.formats.tensors import f16_to_f32
    raw = struct.pack("<65536H", *range(65536))
    want = struct.pack("<65536f", *struct.unpack("<65536e", raw))
    got = f16_to_f32(raw)
    bad = [i for i in range(65536) if got[4 * i:4 * i + 4] != want[4 * i:4 * i + 4]]
    assert not bad, [hex(i) for i in bad[:10]]


def test_hf_tokenizer_takes_its_special_tokens_from_tokenizer_config(tmp_path):
    """bos / eos / pad come from tokenizer_config.json as HF's AutoTokenizer reads them
    (a tokenizer whose tokens have other names; an EOS other than the first well-known
    name); neither naming one, the EOS is config.json's eos_token_id; none at all: the
    Dataset says so instead of appending None."""
    import json
    import shutil

    from tokenizers import Tokenizer as HFTok
    from transformers import AutoTokenizer

    from bitlora.data import DataError, Dataset

    base = make_hf(tmp_path / "base", "online_f32", seed=1)
    renamed = tmp_path / "renamed"
    shutil.copytree(base, renamed)
    tj = renamed / "tokenizer.json"
    tj.write_text(tj.read_text().replace("<|begin_of_text|>", "<|bos|>").replace("<|end_of_text|>", "<|eos|>"))
    eot = tmp_path / "eot"
    shutil.copytree(base, eot)
    t = HFTok.from_file(str(eot / "tokenizer.json"))
    t.add_special_tokens(["<|eot_id|>"])
    t.save(str(eot / "tokenizer.json"))
    for folder, conf in ((renamed, {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|eos|>"}),
                         (eot, {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})):
        (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **conf}))
        with open_checkpoint(str(folder)) as ck:
            tok = ck.tokenizer()
        hf = AutoTokenizer.from_pretrained(str(folder))
        assert (tok.bos_id, tok.eos_id) == (hf.bos_token_id, hf.eos_token_id), folder.name
    assert tok.eos_id == t.token_to_id("<|eot_id|>")
    (renamed / "tokenizer_config.json").unlink()   # nothing names the tokens: config.json's ids
    with open_checkpoint(str(renamed)) as ck:
        tok = ck.tokenizer()
    assert tok.eos_id == json.loads((renamed / "config.json").read_text())["eos_token_id"]
    tok.eos_id = None
    with pytest.raises(DataError, match="end-of-sequence"):
        Dataset([{"instruction": "a", "output": "b"}], tok)


def test_config_refuses_rope_scaling_and_an_odd_head_dim():
    """Scaled RoPE (linear, dynamic, yarn, llama3: any rope_type but default, or a factor)
    and an odd head_dim are refused when the config is read, not at the first step (or
    never: scaling was ignored, the logits then far from HF's)."""
    from bitlora.bitnet import DEMO_CONFIG
    from bitlora.formats.checkpoint import normalize_config

    base = dict(DEMO_CONFIG)
    for key, rp in (("rope_parameters", {"rope_type": "default", "rope_theta": 1e4}),
                    ("rope_scaling", None), ("rope_scaling", {"type": "default"})):
        assert normalize_config({**base, key: rp}, "c")["head_dim"] == base["hidden_size"] // base["num_attention_heads"]
    for key, rp in (("rope_parameters", {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}),
                    ("rope_scaling", {"type": "dynamic", "factor": 2.0}),
                    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}), ("rope_parameters", {"factor": 2})):
        with pytest.raises(FormatError, match="RoPE scaling"):
            normalize_config({**base, key: rp}, "c")
    with pytest.raises(FormatError, match="head_dim = 9 is odd"):
        normalize_config({**base, "head_dim": 9}, "c")
