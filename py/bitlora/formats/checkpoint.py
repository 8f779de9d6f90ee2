"""The checkpoint base class and what every reader shares: `Checkpoint` (one API over
GGUF files and Hugging Face BitNet folders; `formats.open_checkpoint` picks the
reader), the config check, a HF folder's file access, and big tensors read on demand.

    ck = bitlora.formats.open_checkpoint("model.gguf")
    ck.config                                  # HF BitNetConfig keys + head_dim
    ck.tensor_names()                          # HF names, lm_head only if untied
    w = ck.load("model.layers.0.self_attn.q_proj.weight")   # TernaryTensor
    tok = ck.tokenizer()                       # a bitlora Tokenizer, or None
    ck.warnings                                # lines about defaults that differ between implementations
    ck.close()

Projections always come out as `TernaryTensor` (packed 2-bit codes + one scale),
everything else as `FloatTensor` in the file's dtype; Q/K rows are in HF order.
Opening parses only headers and checks every tensor's shape and size against the
config and the file, so corrupt or inconsistent files fail at once with a
`FormatError` naming the file, the tensor and the problem.
"""
from __future__ import annotations

import os

from ..bitnet import HF_DEFAULTS, NORMS, PROJ
from .errors import FormatError
from .source import Source, as_source

CHUNK = 16 << 20
ACTIVATIONS = ("relu2", "silu")   # the FFN gating activations model.py implements
LAZY_OVER = 4 * CHUNK   # float tensors bigger than this are read slice by slice while uploading
MAX_DIM = 1 << 24          # no BitNet dimension comes near this; larger means corrupt


def normalize_config(raw: dict, where: str) -> dict:
    """HF BitNetConfig keys with defaults filled in and head_dim derived; sanity-checked."""
    cfg = {k: raw.get(k, v) for k, v in HF_DEFAULTS.items()}
    if raw.get("rope_theta") is None:
        rp = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
        cfg["rope_theta"] = rp.get("rope_theta", HF_DEFAULTS["rope_theta"]) if isinstance(rp, dict) else HF_DEFAULTS["rope_theta"]
    for key in ("rope_scaling", "rope_parameters"):   # as the GGUF reader: unscaled RoPE only
        rp = raw.get(key)
        if rp is None:
            continue
        kind = rp.get("rope_type", rp.get("type")) if isinstance(rp, dict) else rp
        factor = rp.get("factor") if isinstance(rp, dict) else None
        if kind not in (None, "default") or factor not in (None, 1, 1.0):
            raise FormatError(f"{where}: {key} = {rp!r}: RoPE scaling is not implemented (only unscaled RoPE)")
    if cfg["num_key_value_heads"] is None:
        cfg["num_key_value_heads"] = cfg["num_attention_heads"]
    for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
              "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
        v = cfg[k]
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= MAX_DIM:
            raise FormatError(f"{where}: config {k} = {v!r} is not a sane positive integer")
    h, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = raw.get("head_dim") or cfg["hidden_size"] // h
    if not isinstance(head_dim, int) or head_dim <= 0 or head_dim > MAX_DIM:
        raise FormatError(f"{where}: config head_dim = {head_dim!r} is not a sane positive integer")
    if head_dim % 2:
        raise FormatError(f"{where}: config head_dim = {head_dim} is odd: RoPE rotates dimensions in pairs")
    if h % hkv:
        raise FormatError(f"{where}: config num_attention_heads {h} is not a multiple of num_key_value_heads {hkv}")
    cfg["head_dim"] = head_dim
    if cfg["hidden_act"] not in ACTIVATIONS:
        raise FormatError(f"{where}: config hidden_act = {cfg['hidden_act']!r} is not implemented "
                          f"(bitlora: {', '.join(ACTIVATIONS)})")
    cfg["tie_word_embeddings"] = bool(cfg["tie_word_embeddings"])
    for k in ("rms_norm_eps", "rope_theta"):
        v = cfg[k]
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not -1e38 < v < 1e38:
            raise FormatError(f"{where}: config {k} = {v!r} is not a sane number")
        cfg[k] = float(v)
    return cfg


def check_layer_count(cfg: dict, n_tensors: int, where: str) -> None:
    """Refuse a layer count the file cannot hold before bitnet.tensor_shapes builds a
    table that large (a corrupt count is a huge allocation)."""
    per_layer = len(PROJ) + len(NORMS)
    if cfg["num_hidden_layers"] * per_layer > n_tensors:
        raise FormatError(f"{where}: config num_hidden_layers = {cfg['num_hidden_layers']} needs "
                          f"{cfg['num_hidden_layers'] * per_layer} tensors, the file holds {n_tensors}")


class Checkpoint:
    """Base: subclasses fill config, _shapes (name -> shape) and implement _load
    (and tokenizer, where the file carries one)."""
    config: dict
    tokenizer_json: str | None = None
    gguf_metadata: dict | None = None

    def __init__(self, progress=None):
        self._progress = progress
        self._done = 0
        self._total = 0
        self._shapes: dict[str, tuple] = {}
        self._sources: list[Source] = []
        self.warnings: list[str] = []

    def tensor_names(self) -> list[str]:
        return list(self._shapes)

    def shape(self, name: str) -> tuple:
        return self._shapes[name]

    def load(self, name: str):
        if name not in self._shapes:
            raise KeyError(f"no tensor {name!r} in this checkpoint")
        return self._load(name)

    def _load(self, name):
        raise NotImplementedError

    def tokenizer(self):
        """The checkpoint's tokenizer as a bitlora.tokenizer.Tokenizer, or None."""
        return None

    def _read(self, src: Source, offset: int, n: int, what: str):
        """Read n bytes, in 16 MB chunks into one bytearray (no second copy of a big
        tensor), reporting progress(done_bytes, total_bytes) after each chunk."""
        if n <= CHUNK:
            data = src.read_exact(offset, n, what)
            self._tick(n)
            return data
        src.read_exact(offset + n - 1, 1, what)          # fail before allocating
        buf = bytearray(n)
        for a in range(0, n, CHUNK):
            b = min(n, a + CHUNK)
            buf[a:b] = src.read_exact(offset + a, b - a, what)
            self._tick(b - a)
        return buf

    def _lazy(self, src: Source, offset: int, n: int, what: str):
        """The bytes of a float tensor: read now if small, else a TensorBytes that reads
        a slice from the source when the uploader asks for it (so a 656 MB embedding
        never sits whole in Python's heap, e.g. in Pyodide's 4 GB)."""
        if n <= LAZY_OVER:
            return self._read(src, offset, n, what)
        src.read_exact(offset + n - 1, 1, what)          # a truncated file fails now, not later
        return TensorBytes(self, src, offset, n, what)

    def _tick(self, n):
        self._done += n
        if self._progress is not None:
            self._progress(min(self._done, self._total), self._total)

    def close(self):
        for s in self._sources:
            s.close()
        self._sources = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Folder:
    """A HF folder: file name -> Source, from a directory, a dict or a base URL."""

    def __init__(self, where, files=None):
        self.where = where
        self.files = files

    def open(self, name: str) -> Source | None:
        if "/" in name or "\\" in name or name.startswith("."):
            raise FormatError(f"{self.where}: refusing file name {name!r}")
        if self.files is not None:
            if name not in self.files:
                return None
            return as_source(self.files[name], name)
        if isinstance(self.where, str) and self.where.startswith(("http://", "https://")):
            try:
                return as_source(self.where.rstrip("/") + "/" + name)
            except FormatError:
                return None
        path = os.path.join(self.where, name)
        return as_source(path) if os.path.isfile(path) else None



class TensorBytes:
    """Bytes of one big tensor in a checkpoint, read on slicing: `tb[a:b]` reads bytes
    a..b from the source (and reports them as progress). len() is the byte count. Only
    contiguous slices; valid until the checkpoint is closed."""

    def __init__(self, ck, src: Source, offset: int, n: int, what: str):
        self._ck, self._src, self._offset, self._n, self._what = ck, src, offset, n, what

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, key) -> bytes:
        if not isinstance(key, slice):
            raise TypeError("TensorBytes supports slices only")
        a, b, step = key.indices(self._n)
        if step != 1:
            raise ValueError("TensorBytes supports contiguous slices only")
        if b <= a:
            return b""
        data = self._src.read_exact(self._offset + a, b - a, self._what)
        self._ck._tick(b - a)
        return data
