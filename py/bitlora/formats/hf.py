"""Hugging Face BitNet folder: `config.json` + `model.safetensors` (or shards with
`model.safetensors.index.json`) + `tokenizer.json`.

Projection weights come in two forms (the two `quantization_mode`s of HF's BitNet):
- `quantization_mode: offline`: uint8 `[O/4, I]`, the 2-bit code at bits 2i of
  packed row p is output row i*(O/4) + p, t = code - 1; plus `weight_scale` (one
  value). `linear_class: autobitlinear` multiplies the output by weight_scale
  (scale = weight_scale); `bitlinear` divides by it (scale = 1 / weight_scale).
- `online` (or no quantization_config): float master weights, ternarised here
  once with HF's WeightQuant absmean rule (see ternary.ternarize_absmean).
"""
from __future__ import annotations

import json

from ..bitnet import is_projection, tensor_shapes
from ..tokenizer import Tokenizer
from . import ternary as T
from .checkpoint import Checkpoint, Folder, check_layer_count, normalize_config
from .errors import FormatError
from .safetensors import FLOAT_DTYPES, parse_safetensors, scalar_value
from .tensors import FloatTensor, TernaryTensor


def _read_text(folder: Folder, name: str, limit: int, required: bool):
    src = folder.open(name)
    if src is None:
        if required:
            raise FormatError(f"{folder.where}: {name} missing")
        return None
    try:
        if src.size > limit:
            raise FormatError(f"{src.name}: {src.size} bytes, more than the {limit}-byte limit for {name}")
        return src.read_exact(0, src.size, name).decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"{src.name}: not UTF-8 text") from e
    finally:
        src.close()


def _json(text: str, where: str):
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:   # RecursionError: absurd nesting
        raise FormatError(f"{where}: invalid JSON ({e})") from e


class HFCheckpoint(Checkpoint):
    def __init__(self, folder: Folder, progress=None):
        super().__init__(progress)
        w = folder.where
        raw = _json(_read_text(folder, "config.json", 16 << 20, True), f"{w}/config.json")
        if not isinstance(raw, dict):
            raise FormatError(f"{w}/config.json: not a JSON object")
        self.raw_config = raw
        self.config = normalize_config(raw, f"{w}/config.json")
        qc = raw.get("quantization_config") or None
        if qc is not None and not isinstance(qc, dict):
            raise FormatError(f"{w}/config.json: quantization_config is not a JSON object")
        if qc is not None:
            self.mode = qc.get("quantization_mode", "offline")
            self.linear_class = qc.get("linear_class", "bitlinear")
            if self.mode not in ("online", "offline") or self.linear_class not in ("bitlinear", "autobitlinear"):
                raise FormatError(f"{w}/config.json: quantization_config {qc} not understood")
        else:
            self.mode, self.linear_class = "online", None
        self.tokenizer_json = _read_text(folder, "tokenizer.json", 64 << 20, False)
        tc = _read_text(folder, "tokenizer_config.json", 16 << 20, False)
        tc = None if tc is None else _json(tc, f"{w}/tokenizer_config.json")
        self.tokenizer_config = tc if isinstance(tc, dict) else None   # its bos / eos / pad tokens

        idx = _read_text(folder, "model.safetensors.index.json", 64 << 20, False)
        if idx is not None:
            wm = _json(idx, f"{w}/model.safetensors.index.json")
            wm = wm.get("weight_map") if isinstance(wm, dict) else None
            if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
                raise FormatError(f"{w}/model.safetensors.index.json: no weight_map")
            shards = sorted(set(wm.values()))
        else:
            shards = ["model.safetensors"]
        entries = {}
        for sh in shards:
            src = folder.open(sh)
            if src is None:
                raise FormatError(f"{w}: weight file {sh} missing")
            self._sources.append(src)
            for name, t in parse_safetensors(src).items():
                if name in entries:
                    raise FormatError(f"{src.name}: tensor {name!r} also in {entries[name].source.name}")
                entries[name] = t
        self._entries = entries

        check_layer_count(self.config, len(entries), w)
        want = tensor_shapes(self.config)
        total = 0
        for name, shape in want.items():
            t = entries.get(name)
            if t is None:
                raise FormatError(f"{w}: tensor {name!r} missing from the safetensors files")
            where = f"{t.source.name}: tensor {name!r}"
            if is_projection(name):
                O, I = shape
                if t.dtype == "U8":
                    if self.mode != "offline":
                        raise FormatError(f"{where}: packed uint8 weights but quantization_mode is not offline")
                    if O % 4 or t.shape != (O // 4, I):
                        raise FormatError(f"{where}: packed shape {list(t.shape)}, the config says "
                                          f"[{O}/4, {I}] = [{O / 4:g}, {I}]")
                    s = entries.get(name + "_scale")
                    if s is None:
                        raise FormatError(f"{where}: packed weight without {name}_scale")
                    n = 1
                    for d in s.shape:
                        n *= d
                    if n != 1 or s.dtype not in FLOAT_DTYPES:
                        raise FormatError(f"{s.source.name}: tensor {name}_scale: expected one float, "
                                          f"got shape {list(s.shape)} {s.dtype}")
                    total += s.nbytes
                elif t.dtype in FLOAT_DTYPES:
                    if self.mode == "offline":
                        raise FormatError(f"{where}: float weight with quantization_mode offline "
                                          f"(expected packed uint8)")
                    if t.shape != shape:
                        raise FormatError(f"{where}: shape {list(t.shape)}, the config says {list(shape)}")
                else:
                    raise FormatError(f"{where}: dtype {t.dtype} is not a weight dtype")
            else:
                if t.dtype not in FLOAT_DTYPES:
                    raise FormatError(f"{where}: dtype {t.dtype}, expected F32, F16 or BF16")
                if t.shape != shape:
                    raise FormatError(f"{where}: shape {list(t.shape)}, the config says {list(shape)}")
            total += t.nbytes
        self._shapes = want
        self._total = total

    def tokenizer(self):
        """tokenizer.json with tokenizer_config.json's bos / eos / pad tokens, as HF's
        AutoTokenizer reads them; an EOS neither names: config.json's eos_token_id."""
        if not self.tokenizer_json:
            return None
        tok = Tokenizer.from_json(self.tokenizer_json, self.tokenizer_config)
        if tok.eos_id is None:
            e = self.raw_config.get("eos_token_id")
            e = next((v for v in e if isinstance(v, int)), None) if isinstance(e, list) else e
            if isinstance(e, int) and not isinstance(e, bool) and e >= 0:
                tok.eos_id = e
                tok.pad_id = e if tok.pad_id is None else tok.pad_id
        return tok

    def _load(self, name):
        t = self._entries[name]
        what = f"tensor {name!r}"
        shape = self._shapes[name]
        if not is_projection(name):
            return FloatTensor(shape, FLOAT_DTYPES[t.dtype], self._lazy(t.source, t.offset, t.nbytes, what))
        data = self._read(t.source, t.offset, t.nbytes, what)
        O, I = shape
        if t.dtype == "U8":
            if not T.check_codes_packed(data):
                raise FormatError(f"{t.source.name}: {what}: invalid 2-bit code 3 in packed weights")
            s = self._entries[name + "_scale"]
            ws = scalar_value(self._read(s.source, s.offset, s.nbytes, what + " scale"), s.dtype)
            if self.linear_class == "bitlinear":
                if ws == 0:
                    raise FormatError(f"{s.source.name}: {name}_scale is 0 (bitlinear divides by it)")
                scale = T.f32(1.0 / ws)
            else:
                scale = T.f32(ws)
            return TernaryTensor((O, I), T.packed_from_hf_packed(data, O, I), scale)
        codes, scale = T.ternarize_absmean(data, FLOAT_DTYPES[t.dtype], O * I)
        return TernaryTensor((O, I), T.pack_codes(codes, O, I), scale)
