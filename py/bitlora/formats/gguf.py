"""GGUF v3 (v2 accepted) reader for BitNet: archs `bitnet`, `bitnet-b1.58` and
`bitnet-25`, tensor types F32, F16, BF16, TQ1_0, TQ2_0, I2_S.

File: magic "GGUF", u32 version, u64 tensor count, u64 metadata count, metadata
(key string, u32 type, value), tensor infos (name, u32 n_dims, u64 ne[n_dims],
u32 type, u64 offset), padding to `general.alignment` (32), tensor data. ne[0] is
the row length, so a HF weight [O, I] has ne = [I, O].

What each architecture name means as a graph is docs/FORMATS.md's table, from
llama.cpp's and bitnet.cpp's sources: `bitnet` (1bitLLM's models) gates the FFN with
SiLU unless `bitnet.hidden_activation` says "relu2"; `bitnet-b1.58` and `bitnet-25`
(BitNet b1.58 2B-4T) with relu^2; all three use rotate-half ("NEOX") RoPE over the
whole head, sub-norms before o_proj and down_proj. Anything else that would change
the graph (another arch name, biases, RoPE scaling or frequency factors, partial
rotary, experts, unknown tensors) is refused with a FormatError naming it. A missing
key whose default differs between implementations gets the value the table gives and
a line in `GGUFCheckpoint.warnings` (shown by the page and the CLI).

Q/K row order: BitNet GGUF files keep HF's row order (no LLaMA-style Q/K
permutation, since the graph uses NEOX RoPE), so no rows are reordered here.

Ternary types decode to our packed layout with one scale per tensor: I2_S holds
one f32 scale; TQ1_0/TQ2_0 hold an f16 `d` per 256-weight block, which must be
equal across blocks (all-zero blocks may have d = 0). F32/F16/BF16 projections are
taken as already ternary if every |w| is 0 or one value, else ternarised with the
absmean rule. A `bitnet` file's optional per-projection `blk.N.<proj>.scale` [1]
multiplies that projection's output, so it is folded into its scale.
"""
from __future__ import annotations

import struct

from ..bitnet import EMBED, FINAL_NORM, LM_HEAD, NORMS, PROJ, is_projection, layer_prefix, tensor_shapes
from ..tokenizer import Tokenizer
from . import ternary as T
from .checkpoint import Checkpoint, check_layer_count, normalize_config
from .errors import FormatError
from .source import Source
from .tensors import FloatTensor, TernaryTensor

ARCHS = ("bitnet", "bitnet-b1.58", "bitnet-25")
F32, F16, BF16, TQ1_0, TQ2_0, I2_S = 0, 1, 30, 34, 35, 36
FLOAT_TYPES = {F32: "f32", F16: "f16", BF16: "bf16"}
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1",
              10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS",
              17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S",
              23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M",
              30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 36: "I2_S"}
# (block weights, block bytes) for sizing; I2_S is n/4 + 32 bytes
BLOCKS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
          15: (256, 292), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8), 30: (1, 2),
          34: (256, 54), 35: (256, 66)}
SUPPORTED = (F32, F16, BF16, TQ1_0, TQ2_0, I2_S)

# metadata value types: 0 u8 1 i8 2 u16 3 i16 4 u32 5 i32 6 f32 7 bool 8 str 9 array 10 u64 11 i64 12 f64
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

GGUF_TO_HF = {"token_embd.weight": EMBED, "output_norm.weight": FINAL_NORM, "output.weight": LM_HEAD}
# blk.{i}.<GGUF name>.weight -> model.layers.{i}.<HF path>.weight
BLK_TO_HF = dict(zip(("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"), PROJ))
BLK_TO_HF.update(zip(("attn_norm", "attn_sub_norm", "ffn_norm", "ffn_sub_norm"), NORMS))


def hf_name(gname: str) -> str | None:
    if gname in GGUF_TO_HF:
        return GGUF_TO_HF[gname]
    parts = gname.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[3] == "weight" \
            and parts[2] in BLK_TO_HF:
        return f"{layer_prefix(int(parts[1]))}{BLK_TO_HF[parts[2]]}.weight"
    return None


def tensor_nbytes(ttype: int, n: int, ne0: int, fn: str, name: str) -> int:
    if ttype == I2_S:
        return n // 4 + 32
    if ttype not in BLOCKS:
        raise FormatError(f"{fn}: tensor {name!r}: unknown GGML type {ttype}")
    bw, bb = BLOCKS[ttype]
    if ne0 % bw:
        raise FormatError(f"{fn}: tensor {name!r}: row length {ne0} is not a multiple of the "
                          f"{TYPE_NAMES.get(ttype, ttype)} block size {bw}")
    return n // bw * bb


class _Cursor:
    """Bounded, buffered sequential reader over a Source."""

    _U64 = struct.Struct("<Q").unpack_from

    def __init__(self, src: Source, pos: int = 0):
        self.src = src
        self.base, self.buf, self.bpos = pos, b"", 0       # buf holds file bytes from base

    @property
    def pos(self) -> int:
        return self.base + self.bpos

    def remaining(self) -> int:
        return self.src.size - self.pos

    def _refill(self, n: int, what: str):
        if n > self.remaining():
            raise FormatError(f"{self.src.name}: {what} needs {n} bytes at offset {self.pos}, "
                              f"only {self.remaining()} left: truncated or corrupt")
        pos = self.pos
        want = min(max(n, 1 << 20), self.src.size - pos)
        self.base, self.buf, self.bpos = pos, self.src.read_exact(pos, want, what), 0

    def take(self, n: int, what: str) -> bytes:
        if self.bpos + n > len(self.buf):
            self._refill(n, what)
        out = self.buf[self.bpos:self.bpos + n]
        self.bpos += n
        return out

    def unpack(self, fmt: str, what: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size, what))

    def string(self, what: str) -> str:
        return self.strings(1, what)[0]

    def strings(self, count: int, what: str) -> list[str]:
        """count length-prefixed UTF-8 strings (the tokenizer arrays: ~400 k of them)."""
        out = []
        append, u64 = out.append, self._U64
        buf, bpos = self.buf, self.bpos
        try:
            for _ in range(count):
                if bpos + 8 > len(buf):
                    self.bpos = bpos
                    self._refill(8, what)
                    buf, bpos = self.buf, 0
                (n,) = u64(buf, bpos)
                end = bpos + 8 + n
                if end > len(buf):
                    self.bpos = bpos
                    if n > self.remaining() - 8:
                        raise FormatError(f"{self.src.name}: {what}: string length {n} exceeds the "
                                          f"{self.remaining() - 8} bytes left in the file: truncated or corrupt")
                    self._refill(8 + n, what)
                    buf, bpos = self.buf, 0
                    end = 8 + n
                append(buf[bpos + 8:end].decode("utf-8"))
                bpos = end
        except UnicodeDecodeError as e:
            raise FormatError(f"{self.src.name}: {what}: invalid UTF-8") from e
        self.bpos = bpos
        return out

    def value(self, vtype: int, what: str, depth: int = 0):
        if vtype in _SCALAR:
            return self.unpack("<" + _SCALAR[vtype], what)[0]
        if vtype == 8:
            return self.string(what)
        if vtype == 9 and depth == 0:
            etype, count = self.unpack("<IQ", what)
            if etype in _SCALAR:
                size = struct.calcsize(_SCALAR[etype])
                if count * size > self.remaining():
                    raise FormatError(f"{self.src.name}: {what}: array of {count} items needs "
                                      f"{count * size} bytes, only {self.remaining()} left: truncated or corrupt")
                return list(struct.unpack(f"<{count}{_SCALAR[etype]}", self.take(count * size, what)))
            if etype == 8 or etype == 9:
                if count * 8 > self.remaining():
                    raise FormatError(f"{self.src.name}: {what}: array of {count} items cannot fit in "
                                      f"the {self.remaining()} bytes left: truncated or corrupt")
                if etype == 8:
                    return self.strings(count, what)
                return [self.value(etype, what, depth + 1) for _ in range(count)]
            raise FormatError(f"{self.src.name}: {what}: unknown array element type {etype}")
        raise FormatError(f"{self.src.name}: {what}: unknown metadata value type {vtype}")


def parse_gguf(src: Source):
    """-> (version, metadata dict, tensors {gguf name: (type, ne, abs offset, nbytes)})."""
    fn = src.name
    cur = _Cursor(src)
    if src.size < 24:
        raise FormatError(f"{fn}: {src.size} bytes is too short for a GGUF header")
    magic = cur.take(4, "magic")
    if magic != b"GGUF":
        raise FormatError(f"{fn}: bad magic {magic!r} (expected b'GGUF'): not a GGUF file")
    version, n_tensors, n_kv = cur.unpack("<IQQ", "header")
    if version not in (2, 3):
        raise FormatError(f"{fn}: GGUF version {version} not supported (expected 3)")
    if n_kv * 13 > cur.remaining():
        raise FormatError(f"{fn}: metadata count {n_kv} cannot fit in the file ({src.size} bytes): truncated or corrupt")
    if n_tensors * 32 > cur.remaining():
        raise FormatError(f"{fn}: tensor count {n_tensors} cannot fit in the file ({src.size} bytes): truncated or corrupt")
    md = {}
    for _ in range(n_kv):
        key = cur.string("metadata key")
        (vtype,) = cur.unpack("<I", f"metadata {key!r} type")
        md[key] = cur.value(vtype, f"metadata {key!r}")
    infos = []
    for _ in range(n_tensors):
        name = cur.string("tensor name")
        (nd,) = cur.unpack("<I", f"tensor {name!r} n_dims")
        if not 1 <= nd <= 4:
            raise FormatError(f"{fn}: tensor {name!r}: {nd} dimensions (GGML allows 1..4)")
        ne = list(cur.unpack(f"<{nd}Q", f"tensor {name!r} shape"))
        ttype, off = cur.unpack("<IQ", f"tensor {name!r} type/offset")
        infos.append((name, ne, ttype, off))
    align = md.get("general.alignment", 32)
    if not isinstance(align, int) or align <= 0 or align & (align - 1) or align > 1 << 20:
        raise FormatError(f"{fn}: general.alignment {align!r} is not a power of two")
    data_start = -(-cur.pos // align) * align
    data_size = src.size - data_start
    tensors = {}
    for name, ne, ttype, off in infos:
        if name in tensors:
            raise FormatError(f"{fn}: tensor {name!r} appears twice")
        n = 1
        for d in ne:
            if d > 1 << 40:
                raise FormatError(f"{fn}: tensor {name!r}: absurd dimension {d}")
            n *= d
        nbytes = tensor_nbytes(ttype, n, ne[0], fn, name)
        if off % align or off + nbytes > data_size:
            raise FormatError(f"{fn}: tensor {name!r}: {nbytes} bytes at data offset {off} do not fit "
                              f"the {max(data_size, 0)}-byte data section (or are misaligned): truncated or corrupt")
        tensors[name] = (ttype, ne, data_start + off, nbytes)
    return version, md, tensors


def _short(x):
    """The shortest decimal that rounds to the same float32 (GGUF stores eps, theta as f32)."""
    if not isinstance(x, float):
        return x
    want = struct.pack("<f", x)
    for p in range(6, 10):
        y = float(f"{x:.{p}g}")
        if struct.pack("<f", y) == want:
            return y
    return x


# Per arch: the FFN activation when the file does not name one, and the RoPE base when
# `rope.freq_base` is missing (llama.cpp's loader: 10000; HF BitNetConfig and the
# 2B-4T: 500000), each with why (docs/FORMATS.md).
ARCH_DEFAULTS = {
    "bitnet": dict(hidden_act="silu", rope_theta=10000.0),
    "bitnet-b1.58": dict(hidden_act="relu2", rope_theta=500000.0),
    "bitnet-25": dict(hidden_act="relu2", rope_theta=500000.0),
}
ACTIVATIONS = {"silu": "silu", "swiglu": "silu", "swish": "silu", "relu2": "relu2"}


def gguf_config(md: dict, tensors: dict, fn: str, warnings: list | None = None) -> dict:
    """The HF-style config of a BitNet GGUF (hidden_act included); refuses what we do not
    implement; appends to `warnings` a line per missing key whose default differs."""
    warn = warnings.append if warnings is not None else (lambda _: None)
    arch = md.get("general.architecture")
    if arch not in ARCHS:
        raise FormatError(f"{fn}: general.architecture {arch!r} is not a BitNet arch bitlora implements {ARCHS}")

    def get(key, default=None):
        return md.get(f"{arch}.{key}", default)
    if "token_embd.weight" not in tensors:
        raise FormatError(f"{fn}: tensor 'token_embd.weight' missing")
    if get("expert_count") or get("attention.causal") is False:
        key = "expert_count" if get("expert_count") else "attention.causal"
        raise FormatError(f"{fn}: metadata {arch}.{key} = {get(key)!r}: not implemented for BitNet")
    scaling = get("rope.scaling.type")
    factor = get("rope.scaling.factor", get("rope.scale_linear"))
    if scaling not in (None, "none", "linear") or factor not in (None, 0, 0.0, 1, 1.0):
        raise FormatError(f"{fn}: RoPE scaling {arch}.rope.scaling.type = {scaling!r}, factor {factor!r}: "
                          f"not implemented (only unscaled RoPE)")
    dflt = ARCH_DEFAULTS[arch]
    act = get("hidden_activation")
    if act is None:
        act = dflt["hidden_act"]
        if arch == "bitnet":
            warn(f"{arch}.hidden_activation missing: FFN gated with SiLU, as llama.cpp's build_bitnet does "
                 f"(1bitLLM's models); a BitNet b1.58 2B-4T converted with arch 'bitnet' needs relu2")
    elif ACTIVATIONS.get(act) is None or (arch != "bitnet" and ACTIVATIONS[act] != dflt["hidden_act"]):
        raise FormatError(f"{fn}: metadata {arch}.hidden_activation = {act!r}: not implemented for "
                          f"arch {arch!r} (bitlora: {'silu or relu2' if arch == 'bitnet' else dflt['hidden_act']})")
    theta = get("rope.freq_base")
    if theta is None:
        theta = dflt["rope_theta"]
        warn(f"{arch}.rope.freq_base missing: using {theta:g} (the {arch} models' value); llama.cpp would use "
             f"10000, HF's BitNetConfig 500000")
    eps = get("attention.layer_norm_rms_epsilon")
    if eps is None:
        eps = 1e-5
        warn(f"{arch}.attention.layer_norm_rms_epsilon missing: using 1e-05 (HF's default); llama.cpp refuses such a file")
    emb_ne = tensors["token_embd.weight"][1]
    vocab = get("vocab_size") or len(md.get("tokenizer.ggml.tokens") or []) or emb_ne[-1]
    raw = {
        "vocab_size": vocab,
        "hidden_size": get("embedding_length"),
        "intermediate_size": get("feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": get("attention.head_count"),
        "num_key_value_heads": get("attention.head_count_kv") or get("attention.head_count"),
        "rms_norm_eps": _short(eps),
        "rope_theta": _short(theta),
        "max_position_embeddings": get("context_length", 2048),
        "tie_word_embeddings": "output.weight" not in tensors,
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id", 128000),
        "eos_token_id": md.get("tokenizer.ggml.eos_token_id", 128001),
        "hidden_act": ACTIVATIONS[act],
    }
    names = {"hidden_size": "embedding_length", "intermediate_size": "feed_forward_length",
             "num_hidden_layers": "block_count", "num_attention_heads": "attention.head_count"}
    for k, key in names.items():
        if raw[k] is None:
            raise FormatError(f"{fn}: metadata {arch}.{key} missing")
    kl, vl = get("attention.key_length"), get("attention.value_length")
    if kl and vl and kl != vl:
        raise FormatError(f"{fn}: {arch}.attention.key_length {kl} != value_length {vl}: not implemented")
    if kl or vl:
        raw["head_dim"] = kl or vl
    cfg = normalize_config(raw, fn)
    rot = get("rope.dimension_count")
    if rot is not None and rot != cfg["head_dim"]:
        raise FormatError(f"{fn}: {arch}.rope.dimension_count {rot} != head dim {cfg['head_dim']}: "
                          f"partial RoPE is not implemented")
    if not cfg["tie_word_embeddings"]:
        warn("output.weight present: used as the lm_head (HF's untied head); llama.cpp's BitNet graphs "
             "multiply by token_embd.weight instead")
    return cfg


class GGUFCheckpoint(Checkpoint):
    def __init__(self, src: Source, progress=None):
        super().__init__(progress)
        self._sources = [src]
        self.src = src
        fn = src.name
        self.version, md, tensors = parse_gguf(src)
        self.gguf_metadata = md
        self.warnings = []
        self.config = gguf_config(md, tensors, fn, self.warnings)
        check_layer_count(self.config, len(tensors), fn)
        want = tensor_shapes(self.config)
        arch = md["general.architecture"]
        self._where, self._out_scale = {}, {}
        for gname, info in tensors.items():
            name = hf_name(gname)
            ttype, ne, off, nbytes = info
            if name is None and gname == "rope_freqs.weight":
                self._check_ones(gname, info)         # frequency factors: only all-ones (none) is implemented
                continue
            if name is None and gname.endswith(".scale") and arch == "bitnet" \
                    and is_projection(hf_name(gname[:-len(".scale")] + ".weight") or ""):
                if ttype != F32 or ne != [1]:
                    raise FormatError(f"{fn}: tensor {gname!r}: expected one F32 value")
                self._out_scale[hf_name(gname[:-len(".scale")] + ".weight")] = \
                    struct.unpack("<f", src.read_exact(off, 4, gname))[0]
                continue
            if name is None or name not in want:
                raise FormatError(f"{fn}: tensor {gname!r} is not part of the BitNet graph bitlora implements "
                                  f"(arch {arch!r}: no biases, experts or extra tensors)")
            shape = tuple(reversed(ne))
            if shape != want[name]:
                raise FormatError(f"{fn}: tensor {gname!r} ({name}) has shape {shape}, the config "
                                  f"says {want[name]}")
            if ttype not in SUPPORTED or (ttype not in FLOAT_TYPES and not is_projection(name)):
                raise FormatError(f"{fn}: tensor {gname!r}: type {TYPE_NAMES.get(ttype, ttype)} is not "
                                  f"supported here (F32, F16, BF16; TQ1_0, TQ2_0, I2_S for projections)")
            if ttype == I2_S and (shape[0] * shape[1]) % 128:
                raise FormatError(f"{fn}: tensor {gname!r}: I2_S needs a multiple of 128 weights")
            self._where[name] = (gname, ttype, off, nbytes)
        missing = [n for n in want if n not in self._where]
        if missing:
            raise FormatError(f"{fn}: {len(missing)} tensors missing, e.g. {missing[0]!r}")
        self._shapes = want
        self._total = sum(v[3] for v in self._where.values())

    def _check_ones(self, gname, info):
        ttype, ne, off, nbytes = info
        data = self.src.read_exact(off, nbytes, gname) if ttype in (F32, F16) else None
        n = nbytes // (4 if ttype == F32 else 2)
        vals = struct.unpack(f"<{n}{'f' if ttype == F32 else 'e'}", data) if data is not None else (None,)
        if any(v != 1.0 for v in vals):
            raise FormatError(f"{self.src.name}: tensor {gname!r}: RoPE frequency factors are not implemented "
                              f"(only all ones)")

    def tokenizer(self):
        md = self.gguf_metadata
        return Tokenizer.from_gguf_metadata(md) if "tokenizer.ggml.tokens" in md else None

    def _load(self, name):
        gname, ttype, off, nbytes = self._where[name]
        fn = self.src.name
        shape = self._shapes[name]
        if not is_projection(name):
            return FloatTensor(shape, FLOAT_TYPES[ttype], self._lazy(self.src, off, nbytes, f"tensor {gname!r}"))
        data = self._read(self.src, off, nbytes, f"tensor {gname!r}")
        O, I = shape
        n = O * I
        fast = I % 16 == 0                 # rows need no padding: decode straight to our layout
        if ttype in (TQ1_0, TQ2_0):
            fmt = T.TQ1_0 if ttype == TQ1_0 else T.TQ2_0
            sc = T.tq_scale(data, fmt, n)
            if sc is None:
                raise FormatError(f"{fn}: tensor {gname!r}: {fmt.name} blocks carry different scales; "
                                  f"only one scale per tensor (BitNet ternary weights) is supported")
            scale, zero = sc
            if fast and not zero:
                packed = fmt.decode_packed(data, n)
            else:
                packed = T.pack_codes(T.zero_blocks(fmt.decode(data, n), fmt.W, zero), O, I)
        elif ttype == I2_S:
            scale = struct.unpack_from("<f", data, n // 4)[0]
            packed = T.I2_S.decode_packed(data, n) if fast else T.pack_codes(T.I2_S.decode(data, n), O, I)
        else:
            dt = FLOAT_TYPES[ttype]
            got = T.exact_ternary(data, dt, n)
            codes, scale = got if got is not None else T.ternarize_absmean(data, dt, n)
            packed = T.pack_codes(codes, O, I)
        if not T.check_codes_packed(packed):
            raise FormatError(f"{fn}: tensor {gname!r}: invalid 2-bit code 3 in ternary data")
        return TernaryTensor((O, I), packed, scale * self._out_scale.get(name, 1.0))
