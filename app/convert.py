"""Write a HF BitNet folder as GGUF. Native only (numpy + the `gguf` package), so it
lives with the command line, not in the library the browser gets.

    python -m bitlora.app.convert HF_DIR OUT.gguf --type tq2_0 --arch bitnet-b1.58

Ternary projections are written as TQ1_0, TQ2_0 (via gguf.quants), I2_S (written
here: codes 0/1/2 = -1/0/+1, 128-weight blocks of 32 bytes, byte j holding weights
j, 32+j, 64+j, 96+j in bits 7-6, 5-4, 3-2, 1-0, then one f32 scale padded to 32
bytes), or F16/F32 dequantised values t*scale. Norms are F32; the embedding (and an
untied lm_head) F16, F32 or BF16. Q/K rows stay in HF order (see formats/gguf.py).
Besides the reference converters' keys it writes `{arch}.hidden_activation` (the
folder's hidden_act), which bitlora's reader needs for arch `bitnet` to mean relu2.
The weights are read through bitlora.formats, so offline (packed) and online
(master) folders both work.
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

from bitlora.formats import FormatError, open_checkpoint
from bitlora.formats.gguf import BLK_TO_HF, GGUF_TO_HF, I2_S
from bitlora.formats.tensors import TernaryTensor
from bitlora.formats.ternary import unpack_codes

HF_TO_GGUF = {v: k for k, v in GGUF_TO_HF.items()}
BLK_FROM_HF = {v: k for k, v in BLK_TO_HF.items()}
TYPES = {"tq1_0": Q.TQ1_0, "tq2_0": Q.TQ2_0, "i2_s": I2_S, "f16": Q.F16, "f32": Q.F32}


def gguf_name(hf: str) -> str:
    if hf in HF_TO_GGUF:
        return HF_TO_GGUF[hf]
    _, _, i, rest = hf.split(".", 3)            # model.layers.N.<module>.weight
    return f"blk.{i}.{BLK_FROM_HF[rest[:-len('.weight')]]}.weight"


def i2s_bytes(t: np.ndarray, scale: float) -> np.ndarray:
    """t[n] in {-1,0,1} -> I2_S bytes (n/4 + 32)."""
    codes = (t.astype(np.int8) + 1).astype(np.uint8).reshape(-1, 4, 32)   # block, plane, j
    packed = (codes[:, 0] << 6) | (codes[:, 1] << 4) | (codes[:, 2] << 2) | codes[:, 3]
    tail = np.zeros(32, np.uint8)
    tail[:4] = np.frombuffer(np.float32(scale).tobytes(), np.uint8)
    return np.concatenate([packed.reshape(-1), tail])


def float_array(ft) -> np.ndarray:
    raw = np.frombuffer(ft.data[:], {"f32": "<f4", "f16": "<f2", "bf16": "<u2"}[ft.dtype])   # [:] reads a TensorBytes
    if ft.dtype == "bf16":
        raw = (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32).reshape(ft.shape)


def pre_tokenizer_name(tok: dict) -> str | None:
    """The GGUF `tokenizer.ggml.pre` name for a tokenizer.json's pre-tokenizer: LLaMA-3 split or GPT-2 byte level."""
    pre = json.dumps(tok.get("pre_tokenizer") or {})
    if "(?i:'s|'t|'re|'ve|'m|'ll|'d)" in pre:
        return "llama-bpe"
    if '"ByteLevel"' in pre and '"use_regex": false' not in pre:
        return "gpt-2"
    return None


def tokenizer_metadata(w: gguf.GGUFWriter, tok: dict, vocab_size: int):
    model = tok["model"]
    vocab = dict(model["vocab"])
    special = {}
    for a in tok.get("added_tokens", []):
        vocab[a["content"]] = a["id"]
        special[a["id"]] = a.get("special", False)
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if special.get(i) else
                         gguf.TokenType.USER_DEFINED if i in special else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    w.add_tokenizer_model("gpt2")
    if pre_tokenizer_name(tok):
        w.add_tokenizer_pre(pre_tokenizer_name(tok))
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)


def convert(hf_dir, out_path, ttype: str = "tq2_0", arch: str = "bitnet-b1.58",
            embed_type: str = "f16", kv: dict | None = None, extra: dict | None = None) -> str:
    """Write `hf_dir` as a GGUF of architecture `arch`. `kv` overrides `{arch}.<key>`
    metadata ({key: value}, None leaves the key out: e.g. {"rope.freq_base": None} is
    what the reference converters write for a folder without a top-level rope_theta,
    {"hidden_activation": None} what they write for any folder); `extra` adds tensors
    {gguf name: f32 array} (files with what bitlora refuses, for its tests)."""
    qt = TYPES[ttype]
    ck = open_checkpoint(hf_dir)
    cfg = ck.config
    w = gguf.GGUFWriter(os.fspath(out_path), arch)
    w.add_name(os.path.basename(os.path.normpath(os.fspath(hf_dir))))
    U32, F32, STR = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING
    meta = {"context_length": cfg["max_position_embeddings"], "embedding_length": cfg["hidden_size"],
            "feed_forward_length": cfg["intermediate_size"], "block_count": cfg["num_hidden_layers"],
            "attention.head_count": cfg["num_attention_heads"],
            "attention.head_count_kv": cfg["num_key_value_heads"],
            "attention.layer_norm_rms_epsilon": cfg["rms_norm_eps"], "rope.freq_base": cfg["rope_theta"],
            "rope.dimension_count": cfg["head_dim"], "vocab_size": cfg["vocab_size"],
            "hidden_activation": cfg["hidden_act"]}
    meta.update(kv or {})
    for key, val in meta.items():
        if val is not None:
            w.add_key_value(f"{arch}.{key}", val, STR if isinstance(val, str) else F32 if isinstance(val, float) else U32)
    if ck.tokenizer_json:
        tokenizer_metadata(w, json.loads(ck.tokenizer_json), cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_add_bos_token(True)
    for name in ck.tensor_names():
        t = ck.load(name)
        g = gguf_name(name)
        if isinstance(t, TernaryTensor):
            O, I = t.shape
            block = {I2_S: 128, Q.TQ1_0: 256, Q.TQ2_0: 256}.get(qt)   # I2_S: the tensor's weights; TQ: a row's
            if block is not None and (O * I if qt == I2_S else I) % block:
                raise ValueError(f"{name} [{O}, {I}]: {ttype} packs {'the tensor' if qt == I2_S else 'each row'} in "
                                 f"blocks of {block} weights, and {O * I if qt == I2_S else I} is not a multiple; "
                                 f"use --type f16 or f32 for this model")
            tv = np.frombuffer(unpack_codes(t.packed, O, I), np.uint8).astype(np.int8) - 1
            if qt == I2_S:
                w.add_tensor(g, i2s_bytes(tv, t.scale).view(np.int8), raw_shape=(O, I), raw_dtype=I2_S)
                continue
            vals = (tv.astype(np.float32) * np.float32(t.scale)).reshape(O, I)
            if qt in (Q.TQ1_0, Q.TQ2_0):
                w.add_tensor(g, gguf.quants.quantize(vals, qt), raw_dtype=qt)
            else:
                w.add_tensor(g, vals.astype(np.float16 if qt == Q.F16 else np.float32))
        else:
            a = float_array(t)
            if a.ndim == 1 or embed_type == "f32":
                w.add_tensor(g, a)
            elif embed_type == "f16":
                w.add_tensor(g, a.astype(np.float16))
            else:                                  # bf16, truncated from f32 (exact for bf16 input)
                u = (a.view(np.uint32) >> 16).astype(np.uint16)
                w.add_tensor(g, u, raw_shape=a.shape, raw_dtype=Q.BF16)
    for g, a in (extra or {}).items():
        w.add_tensor(g, np.asarray(a, np.float32))
    ck.close()
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return os.fspath(out_path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("hf_dir")
    p.add_argument("out")
    p.add_argument("--type", default="tq2_0", choices=sorted(TYPES))
    p.add_argument("--arch", default="bitnet-b1.58", choices=["bitnet", "bitnet-b1.58", "bitnet-25"])
    p.add_argument("--embed-type", default="f16", choices=["f16", "f32", "bf16"])
    a = p.parse_args(argv)
    try:
        print(convert(a.hf_dir, a.out, a.type, a.arch, a.embed_type))
    except (ValueError, OSError, FormatError) as e:   # FormatError: the folder; ValueError: a shape the type cannot pack
        raise SystemExit(f"bitlora convert: {e}") from None


if __name__ == "__main__":
    main()
