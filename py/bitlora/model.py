"""The BitNet b1.58 model on the GPU: weights, the one forward (training, logits,
KV-cached decoding, with or without LoRA) and its backward, side by side.
Browser-safe: standard library + bitlora.

Shape legend (used everywhere in bitlora):
  B batch, T tokens per sequence, N = B*T rows, C width (hidden_size), H heads,
  Hkv KV heads, D head dim, KV = Hkv*D, F FFN width (intermediate_size), V vocab,
  L layers, R LoRA rank, S KV-cache capacity (positions per sequence), P RoPE table positions.

One decoder layer, as HF's BitNetForCausalLM computes it:
  n1 = input_layernorm(x);  q, k, v = BitLinear(n1);  q, k = rope(q), rope(k)
  x_mid = x + o_proj(attn_sub_norm(attention(q, k, v)))
  n2 = post_attention_layernorm(x_mid)
  x_out = x_mid + down_proj(ffn_sub_norm(act(gate_proj(n2)) * up_proj(n2)))
with act = relu^2 (hidden_act "relu2", BitNet b1.58 2B-4T) or SiLU ("silu", 1bitLLM's;
docs/FORMATS.md says which a GGUF architecture name means)
and logits = lm_head(norm(x)), lm_head a plain float linear (tied: the embedding).
Every BitLinear is actquant (per-token int8) + packed ternary matmul; an adapted
projection adds its LoRA branch (lora.Lora.apply) computed from the same input. Every
BitLinear input is an RMSNorm's output, so the norm and the quantiser are one call
(_norm; one dispatch on a GPU).

    model = await Model.create(dev, config, load)     # or bitlora.load_model(...)
    acts = model.activations(B, T, lora)             # training: kept per layer
    model.forward(ids, acts, lora, targets=targets)  # records; loss into acts.loss_sum
    model.backward(acts, lora)                       # records; LoRA grads into lora.arena.grads
    rows = await model.alogits(ids)                  # logits (decoding scratch, no cache)
    out = await model.agenerate("Hello", lora=lora)  # KV-cached decoding

Activations come from one table, ACTS, (name, shape, dtype, scope): training
allocates its "layer" rows once per layer (the backward reads them) plus the
"grad" scratch; decoding allocates the "layer" rows once, shared by every layer,
with the residual stream updated in place. The same table gives the memory
estimate (`memory_estimate`), so it is what a step allocates, not a guess.

What the GPU holds: ternary weights packed 2 bits per weight exactly as
`formats.tensors.TernaryTensor` lays them out (never expanded); norms as f32; the
embedding / lm_head as f32 or bf16 in row chunks of at most `max_binding` bytes
each (a 2B-4T embedding is larger than one binding may be).
"""
from __future__ import annotations

import array
import collections
import inspect
import math
import os
import struct
import time
import warnings
from dataclasses import dataclass

from .formats.tensors import FloatTensor, TernaryTensor, f16_to_f32
from . import demo, gpu, ops
from .bitnet import FULL, MODULES, NORMS
from .data import text_problem
from .formats import open_checkpoint, peft, source_name
from .ops import bitlinear, linear, matvec
from .ops import lora as lora_ops
from .ops import attention as attention_ops
from .ops.attention import attention_backward, attention_forward, kv_advance
from .ops.bitlinear import bitlinear_backward_input, bitlinear_forward_parts
from .ops.cross_entropy import cross_entropy_forward_backward, cross_entropy_sum
from .ops.embedding import embedding_forward
from .ops.linear import linear_backward_input, linear_forward
from .ops.matvec import dense_matvec, rmsnorm_quant, ternary_matvec
from .ops.relu2 import ACTS as GATINGS, gating_backward, gating_forward
from .ops.rmsnorm import rmsnorm_backward, rmsnorm_forward, rmsnorm_quant_forward
from .ops.rope import rope_backward, rope_forward, rope_kv_store, rope_tables
from .ops.sample import sample_token, sampler_state
from .lora import Lora
from .optim import AdamW, ParamArena

# The activation table. scope: "layer" (one set per layer in training, one shared set
# when decoding), "top" (once: around the layers), "lora" (per adapted projection, per
# layer in training), "grad" (backward scratch, training only), "decode" (decoding
# only: a one-token forward's packed activations), "io" (token ids and
# targets: one pair per micro-batch of a step, since every micro-batch of a step is
# recorded into one submit and a write lands before the whole submit runs).
ACTS = (
    # name      shape     dtype  scope
    ("x",       "N C",    "f32", "layer"),   # the layer's input: the residual stream
    ("n1",      "N C",    "f32", "layer"),   # input_layernorm(x)
    ("rstd1",   "N",      "f32", "layer"),
    ("q",       "N C",    "f32", "layer"),   # post-RoPE
    ("k",       "N KV",   "f32", "layer"),   # post-RoPE
    ("v",       "N KV",   "f32", "layer"),
    ("att",     "N C",    "f32", "layer"),   # attention output
    ("lse",     "N H",    "f32", "layer"),   # its log-sum-exp per head
    ("an",      "N C",    "f32", "layer"),   # attn_sub_norm(att)
    ("rstd_a",  "N",      "f32", "layer"),
    ("x_mid",   "N C",    "f32", "layer"),   # x + o_proj(an)
    ("n2",      "N C",    "f32", "layer"),   # post_attention_layernorm(x_mid)
    ("rstd2",   "N",      "f32", "layer"),
    ("g",       "N F",    "f32", "layer"),   # gate_proj(n2)
    ("u",       "N F",    "f32", "layer"),   # up_proj(n2)
    ("hf",      "N F",    "f32", "layer"),   # act(g) * u
    ("fn",      "N F",    "f32", "layer"),   # ffn_sub_norm(hf)
    ("rstd_f",  "N",      "f32", "layer"),
    ("lora_u",  "N R",    "f32", "lora"),    # A dropout(x) of one adapted projection
    ("x_out",   "N C",    "f32", "top"),     # the last layer's output
    ("xf",      "N C",    "f32", "top"),     # norm(x_out): the head's input
    ("rstd_out", "N",     "f32", "top"),
    ("xq",      "N XQ",   "f32", "top"),     # int8 activations: f32 or packed (XQ: the larger, for CF = max(C, F))
    ("s",       "N",      "f32", "top"),     # their per-row scales
    ("logits",  "N V",    "f32", "train"),   # training: logits, then dlogits in place
    ("losses",  "N",      "f32", "train"),
    ("loss_sum", "1",     "f32", "train"),
    ("xq4",     "XQ4",    "u32", "decode"),  # one token's int8 activations, packed (ops.matvec)
    ("qs",      "2",      "f32", "decode"),  # their scale and sum
    ("lora_ups", "3 R",   "f32", "decode"),  # the LoRA u of up to three projections of one input
    ("ids",     "N",      "u32", "io"),
    ("targets", "N",      "i32", "io"),
    ("stream",  "1",      "u32", "io"),      # the LoRA dropout stream (Lora.dropout_stream(step, micro))
    ("dh",      "N C",    "f32", "grad"),    # gradient of the residual stream
    ("dxf",     "N C",    "f32", "grad"),
    ("d_fn",    "N F",    "f32", "grad"),
    ("d_hf",    "N F",    "f32", "grad"),
    ("dg",      "N F",    "f32", "grad"),
    ("du",      "N F",    "f32", "grad"),
    ("dn",      "N C",    "f32", "grad"),    # gradient of a norm's output (n1, n2)
    ("d_an",    "N C",    "f32", "grad"),
    ("d_att",   "N C",    "f32", "grad"),
    ("dq",      "N C",    "f32", "grad"),
    ("dk",      "N KV",   "f32", "grad"),
    ("dv",      "N KV",   "f32", "grad"),
    ("stats",   "N H 2",  "f32", "grad"),    # attention backward's per-row statistics
    ("du_lora", "N R",    "f32", "grad"),
)


def buffer_bytes(nbytes: int) -> int:
    """What Device.buffer allocates for `nbytes` (rounded up to 4, at least 4)."""
    return max(4, (int(nbytes) + 3) & ~3)


def f32_bytes(t: FloatTensor, start: int = 0, count: int | None = None) -> bytes:
    """Elements [start, start + count) of a FloatTensor as little-endian f32 (a bytes-like
    object: bytes, bytearray or array('f'), so no extra copy is made of a big piece)."""
    count = t.numel - start if count is None else count
    size = FloatTensor.ITEMSIZE[t.dtype]
    raw = t.data[start * size:(start + count) * size]
    if t.dtype == "f32":
        return bytes(raw)
    if t.dtype == "bf16":   # bf16 is the high half of an f32: place it, zeros below
        out = bytearray(4 * count)
        out[2::4] = raw[0::2]
        out[3::4] = raw[1::2]
        return out
    return f16_to_f32(raw)   # byte tables, no Python float per value (3x faster than struct)


class RowTable(list):
    """An embedding / lm_head table as row chunks [(v0, rows, buffer), ...]; `dtype` is
    "f32", or "bf16" when the checkpoint stores bf16 (kept as is: exact, half the GPU
    memory; the kernels widen each value to f32 as they read it)."""

    def __init__(self, chunks=(), dtype: str = "f32"):
        super().__init__(chunks)
        self.dtype = dtype


@dataclass
class Proj:
    """A BitLinear weight on the GPU: w_packed[O, ceil(I/16)] u32, dequantised t * scale;
    `buf` is a view of the buffer its input group shares (Model._upload_projs). On a CPU
    adapter `t` holds the same weights transposed, wt[I, ceil(O/16)] u32, for the training
    forward's CPU kernel (ops.bitlinear.transpose_weights; None where the model is too big)."""
    buf: object
    scale: float
    O: int
    I: int
    t: object = None


# The projections that read one input, in layer order: each group's packed weights share
# a buffer, and a one-token forward multiplies a group in one dispatch.
INPUTS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))


@dataclass
class Layer:
    norms: dict          # NORMS name -> w[C] (ffn_sub_norm: w[F]) buffer
    proj: dict           # MODULES name ("q_proj", ...) -> Proj


@dataclass
class Generation:
    """What generate() returns; str() of it is the text."""
    text: str
    ids: list            # new token ids (the EOS that stopped it included)
    prompt_ids: list
    stopped_at_eos: bool = False
    stopped: bool = False        # ended by should_stop()
    first_token_s: float = 0.0   # from the call to the first new id (the prompt's forward and a step)
    total_s: float = 0.0         # from the call to the last id
    host_s: float = 0.0          # of which recording and submitting (not waiting for the GPU)
    dispatches: int = 0          # kernels recorded (dropped steps included)
    warning: str = ""            # why fewer new tokens than asked could come (the model's context)

    def tokens_per_s(self) -> float:
        """Decoding speed: the ids after the first, over the time after the first."""
        n, t = len(self.ids) - 1, self.total_s - self.first_token_s
        return n / t if n > 0 and t > 0 else 0.0

    def __str__(self):
        return self.text


@dataclass
class KVCache:
    """k, v[B, S, KV] per layer; `pos` positions of each sequence are filled (forward
    with this cache writes the next T and advances it). The GPU keeps the same count in
    pos_buf[1] u32, which the kernels read and a forward advances (ops.attention.kv_advance):
    a decoding step's dispatches are the same at every position, so one recording serves all."""
    B: int
    S: int
    k: list
    v: list
    pos_buf: object
    pos: int = 0


class _Set:
    """A namespace of buffers (one layer's activations, the gradient scratch, ...)."""


class Activations:
    """Buffers of the ACTS table for up to N = B*T rows, in one of three modes:
    "train": the "layer" and "lora" rows once per layer (kept for the backward), the
      "top", "train" and "grad" rows once, an ids/targets pair per micro-batch.
    "checkpoint" (gradient checkpointing): only each layer's input x is kept per layer;
      the other "layer" and "lora" rows are one set that the forward overwrites layer by
      layer and the backward refills by recomputing each layer (Model.backward).
    "decode": the "layer" rows once, used by every layer, with x, x_mid and x_out one
      buffer (the residual stream updated in place); one "lora" row shared by every
      adapted projection; the "top" rows; one ids/targets pair."""

    MODES = ("train", "checkpoint", "decode")

    def __init__(self, model, B: int, T: int, modules=(), R: int = 0, mode: str = "train",
                 micro_batches: int = 1):
        if mode not in self.MODES:
            raise ValueError(f"Activations: mode {mode!r} is not one of {self.MODES}")
        self.B, self.T, self.N, self.R = B, T, B * T, R
        self.mode, self.training, self.modules = mode, mode != "decode", tuple(modules)
        self.micro = 0                    # micro-batch of the last training forward (its io buffers)
        self.layers = [_Set() for _ in range(1 if mode == "decode" else model.L)]
        self.top, self.grad, self._io, self._u = _Set(), _Set(), [], {}
        shared = _Set()
        for key, nbytes in self.plan(model, self.N, modules, R, mode, micro_batches):
            buf = model.dev.buffer(nbytes, ".".join(map(str, key)))
            scope, name = key[0], key[-1]
            if scope == "layer":
                setattr(self.layers[key[1]], name, buf)
            elif scope == "shared":
                setattr(shared, name, buf)
            elif scope == "lora":
                self._u[key[1:]] = buf
            elif scope == "io":
                if key[1] == len(self._io):
                    self._io.append([])
                self._io[key[1]].append(buf)
            else:
                setattr(self.grad if scope == "grad" else self.top, name, buf)
        for a in self.layers:      # checkpoint: every layer sees the shared set beside its own x
            for name, buf in vars(shared).items():
                setattr(a, name, buf)
        if mode == "decode":
            a = self.layers[0]
            a.x_mid = self.top.x_out = a.x

    def buffers(self) -> list:
        """Every buffer of the set, each once."""
        sets = [*self.layers, self.top, self.grad]
        found = [b for s in sets for b in vars(s).values()] + [b for io in self._io for b in io] + list(self._u.values())
        return list({id(b): b for b in found if isinstance(b, gpu.Buffer)}.values())

    @staticmethod
    def plan(model, N: int, modules=(), R: int = 0, mode: str = "train", micro_batches: int = 1) -> list:
        """[(key, bytes)] of every buffer an Activations allocates, in order: the one
        place that turns the ACTS table into buffers (and the memory estimate)."""
        dims = model.dims(N, R)
        out = []
        per_layer = range(model.L) if mode == "train" else range(1)
        for name, shape, _, scope in ACTS:
            b = buffer_bytes(4 * _numel(shape, dims))
            if scope == "layer":
                if mode == "checkpoint":
                    out += [(("layer", li, name), b) for li in range(model.L)] if name == "x" \
                        else [(("shared", name), b)]
                elif mode == "train" or name != "x_mid":
                    out += [(("layer", li, name), b) for li in per_layer]
            elif scope == "lora":
                if mode == "decode":
                    out += [(("lora", 0, "shared"), b)] if modules else []
                else:
                    out += [(("lora", li, m), b) for li in per_layer for m in modules]
            elif scope == "top":
                if mode != "decode" or name != "x_out":
                    out.append((("top", name), b))
            elif scope in ("train", "grad"):
                if mode != "decode":
                    out.append(((scope, name), b))
            elif scope == "decode":
                if mode == "decode":
                    out.append((("top", name), b))
        io = [(name, shape) for name, shape, _, scope in ACTS if scope == "io"]
        for j in range(1 if mode == "decode" else micro_batches):
            out += [(("io", j, name), buffer_bytes(4 * _numel(shape, dims))) for name, shape in io]
        return out

    def io(self, micro: int) -> tuple:
        """(ids[N], targets[N], stream[1]) buffers of micro-batch `micro`."""
        if micro >= len(self._io):
            raise ValueError(f"micro-batch {micro}: activations were made for {len(self._io)} per step")
        return tuple(self._io[micro])

    def layer(self, li: int) -> _Set:
        return self.layers[0 if self.mode == "decode" else li]

    def out(self, li: int):
        """The buffer layer li writes its output into (the next layer's x)."""
        if self.mode != "decode" and li + 1 < len(self.layers):
            return self.layers[li + 1].x
        return self.top.x_out

    def lora_u(self, li: int, mod: str):
        """u[N, R] = A dropout(x) of projection `mod` of layer li."""
        if self.mode == "decode":
            return self._u[(0, "shared")]
        return self._u[(li if self.mode == "train" else 0, mod)]


def _numel(shape: str, dims: dict) -> int:
    return math.prod(dims[s] if not s.isdigit() else int(s) for s in shape.split())


class Model:
    """A BitNet b1.58 model on a bitlora Device. Build with `await Model.load(src)` (a
    checkpoint; `bitlora.load_model` as a plain call) or `await Model.create(...)`.
    `config` uses HF BitNetConfig keys plus head_dim."""

    UPLOAD_PIECE = 16 << 20   # bytes of f32 made on the host at a time when uploading tables
    # The split-K reduces of o_proj's, up_proj's and down_proj's input gradients done by the
    # norm backward's dispatch after each, where nothing adapts the projection (ops.rmsnorm's sums;
    # the same bits). False: each its own dispatch.
    FOLD_REDUCES = True

    def __init__(self, dev, config: dict, tokenizer=None, max_binding: int | None = None, name: str = "bitnet"):
        self.dev, self.config, self.tokenizer = dev, dict(config), tokenizer
        self.name = name           # where it came from (adapter_config's base_model_name_or_path)
        c = self.config
        self.C, self.F, self.V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
        self.H, self.Hkv = c["num_attention_heads"], c["num_key_value_heads"]
        self.D = c.get("head_dim") or self.C // self.H
        self.L, self.eps = c["num_hidden_layers"], float(c["rms_norm_eps"])
        if self.H * self.D != self.C:
            raise ValueError(f"H*D = {self.H * self.D} must equal hidden_size {self.C} (attn_sub_norm)")
        self.act = c.get("hidden_act", "relu2")      # the FFN gating: "relu2" or "silu" (ops.relu2.ACTS)
        if self.act not in GATINGS:
            raise ValueError(f"hidden_act {self.act!r} is not implemented (bitlora: {', '.join(GATINGS)})")
        self.warnings: list[str] = []   # the checkpoint's (defaults that differ between implementations)
        lim = min(int(dev.limits.get("maxStorageBufferBindingSize", 1 << 27)),
                  int(dev.limits.get("maxBufferSize", 1 << 30)))
        self.max_binding = min(lim, max_binding or lim)
        self.layers: list[Layer] = []
        self.embed: list = []      # [(v0, Vc, e[Vc, C] buffer)]
        self.head: list = []       # same for lm_head (the embedding's chunks when tied)
        self.norm = None
        self.P = 0
        self.cos = self.sin = None
        self.weight_bytes = 0      # bytes of the GPU buffers the weights and RoPE tables take
        self._scratch: Activations | None = None   # decoding activations
        self._cache: KVCache | None = None
        self._logits = None        # decoding logits[rows, V], sized for the most rows asked
        self._gen = None           # the sampler's buffers (_sampler)
        self._steps = gpu.Programs(dev, limit=32)   # recorded generation steps and prompt parts (_decode_step)
        self._prompts_seen: set = set()            # their keys for prompts run once, not recorded

    def dims(self, N: int, R: int = 0) -> dict:
        """The legend's sizes for N rows (and LoRA rank R)."""
        return {"N": N, "C": self.C, "F": self.F, "V": self.V, "H": self.H, "KV": self.Hkv * self.D,
                "CF": max(self.C, self.F), "XQ": max(self.C, self.F, bitlinear.xq_floats(max(self.C, self.F), True)),
                "XQ4": matvec.xq_words(max(self.C, self.F)), "R": R}

    # -- construction ---------------------------------------------------------
    @classmethod
    async def create(cls, dev, config: dict, load, tokenizer=None, max_binding: int | None = None,
                     name: str = "bitnet") -> "Model":
        """`load(hf_name) -> TernaryTensor | FloatTensor` (e.g. a checkpoint's `load`)."""
        m = cls(dev, config, tokenizer, max_binding, name)
        before = dev.allocated
        m.embed = m._upload_rows("model.embed_tokens.weight", load("model.embed_tokens.weight"))
        for i in range(m.L):
            p = f"model.layers.{i}."
            norms = {n: m._upload_vec(p + n + ".weight", load(p + n + ".weight")) for n in NORMS}
            proj = {}
            for group in INPUTS:
                proj.update(m._upload_projs(p, group, load))
            m.layers.append(Layer(norms, proj))
        m.norm = m._upload_vec("model.norm.weight", load("model.norm.weight"))
        tied = m.config.get("tie_word_embeddings", False)
        m.head = m.embed if tied else m._upload_rows("lm_head.weight", load("lm_head.weight"))
        m._rope(int(m.config.get("max_position_embeddings", 2048)))
        await m._transpose_projs()
        m.weight_bytes = dev.allocated - before
        await m.prepare(training=False)
        return m

    @classmethod
    async def load(cls, src="demo", progress=None, device=None, max_binding: int | None = None) -> "Model":
        """Open a checkpoint (HF folder, GGUF file, URL, bytes, {file name: bytes/Blob},
        or "demo" for the built-in demo model), upload its weights to `device` (default:
        the process-wide one) and return the Model with the checkpoint's tokenizer (None
        if it has none). `max_binding` caps the bytes of one embedding / lm_head chunk
        (default: the device's binding limit). progress(done_bytes, total_bytes)."""
        name = source_name(src)
        if isinstance(src, str) and not gpu.IN_BROWSER and not src.startswith(("/", ".")) and src != "demo" \
                and not os.path.exists(src):
            from . import hub      # a repo id or hub URL: downloaded once into the cache folder
            got = hub.download(src, progress)
            if got is not None:
                src, name = got
        if isinstance(src, str) and src == "demo":
            src, name = await demo.model_source(), "demo"   # the same adapter metadata in both backends
        dev = device or await gpu.get_device()
        with open_checkpoint(src, progress=progress) as ck:
            m = await cls.create(dev, ck.config, ck.load, ck.tokenizer(), max_binding, name)
            m.warnings = list(ck.warnings)
            return m

    def close(self) -> None:
        """Free the GPU buffers the model holds (weights, RoPE tables, the decoding
        scratch, KV cache and logits); it cannot run afterwards. The page calls it when
        another model replaces this one: dropped instead, the buffers would live on in
        the device's bind-group cache (and in Device.allocated)."""
        bufs = [b for lay in self.layers for b in lay.norms.values()] + \
               [b for lay in self.layers for p in lay.proj.values() for b in (p.buf, p.t) if b is not None] + \
               [b for _, _, b in self.embed] + ([b for _, _, b in self.head] if self.head is not self.embed else [])
        bufs += [b for b in (self.norm, self.cos, self.sin, self._logits) if b is not None]
        if self._cache is not None:
            bufs += self._cache.k + self._cache.v + [self._cache.pos_buf]
        if self._scratch is not None:
            bufs += self._scratch.buffers()
        if self._gen is not None:
            bufs += [b for b in (self._gen.state, self._gen.tok, self._gen.out) if b is not None]
        bufs = [b.buffer if isinstance(b, gpu.BufferView) else b for b in bufs]   # a group's shared weights
        self.dev.destroy(*{id(b): b for b in bufs}.values())
        self.layers, self.embed, self.head, self.norm, self.cos, self.sin, self.P = [], RowTable(), RowTable(), None, None, None, 0
        self._scratch = self._cache = self._logits = self._gen = None
        self._steps.clear()
        self._prompts_seen.clear()

    async def prepare(self, training: bool, lora_r: int | None = None) -> None:
        """Compile every kernel the forward (and with `training`, the loss and backward)
        records, so that recording is plain synchronous code: on a CPU adapter only the
        variants this model's shapes pick (kernel_shapes; `lora_r` the LoRA rank, None:
        the kernels for any rank)."""
        dtypes = {self.embed.dtype, self.head.dtype}
        shapes = self.kernel_shapes(lora_r)
        await self.dev.prepare([s for t in dtypes for s in ops.kernel_specs(t, training, self.dev.kind,
                                                                             self.dev.int8_dot, shapes)])
        matvec.spare(self.dev, 0)   # the device's 16-byte stand-ins for absent bindings, made once, now

    def kernel_shapes(self, lora_r: int | None = None) -> dict:
        """What decides which kernel variants this model runs (ops.kernel_specs' `shapes`)."""
        projs = [p for lay in self.layers for p in lay.proj.values()]
        return {"C": self.C, "F": self.F, "D": self.D, "V": self.V, "KV": self.Hkv * self.D, "act": self.act,
                "R": lora_r, "adapter": self.dev.adapter_info, "transposed": bool(projs) and all(p.t is not None for p in projs)}

    def _upload_vec(self, name, t):
        if not isinstance(t, FloatTensor):
            raise ValueError(f"{name}: expected a float tensor, got {type(t).__name__}")
        return self.dev.buffer(4 * t.numel, name, data=f32_bytes(t))

    def _upload_projs(self, prefix, group, load) -> dict:
        """The projections of `group` (those sharing an input: INPUTS) in one buffer, each
        a view of it starting at a multiple of the storage offset alignment, so a
        one-token forward multiplies them all in one dispatch (ops.matvec.ternary_matvec)."""
        align = int(self.dev.limits.get("minStorageBufferOffsetAlignment", 256))
        ts = {}
        for mod in group:
            name = prefix + FULL[mod] + ".weight"
            t = ts[mod] = load(name)
            if not isinstance(t, TernaryTensor):
                raise ValueError(f"{name}: expected a ternary tensor, got {type(t).__name__}")
        offs, end = {}, 0
        for mod, t in ts.items():
            offs[mod] = end
            end += -(-buffer_bytes(len(t.packed)) // align) * align
        buf = self.dev.buffer(end, prefix + "+".join(group))
        out = {}
        for mod, t in ts.items():
            self.dev.write(buf, t.packed, offs[mod])
            out[mod] = Proj(buf.view(offs[mod], buffer_bytes(len(t.packed))), float(t.scale), *t.shape)
        return out

    async def _transpose_projs(self) -> None:
        """On a CPU adapter, every projection's weights transposed as well (Proj.t), where
        all of them take at most ops.bitlinear.CPU_TRANSPOSE_MAX_BYTES."""
        projs = [p for lay in self.layers for p in lay.proj.values()]
        if self.dev.kind != "cpu" or sum(p.buf.size for p in projs) > bitlinear.CPU_TRANSPOSE_MAX_BYTES:
            return
        await self.dev.prepare([(bitlinear.SHADER, "ternary_transpose")])
        for li, lay in enumerate(self.layers):
            for mod, p in lay.proj.items():
                p.t = bitlinear.transpose_weights(self.dev, p.buf, p.O, p.I, f"model.layers.{li}.{mod}.t")
        self.dev.submit()

    def _upload_rows(self, name, t):
        """A float [rows, C] table as row chunks of at most max_binding bytes (multiples of
        64 rows), each its own buffer: a RowTable, bf16 if the tensor is bf16, else f32."""
        rows, C = t.shape
        dtype = "bf16" if t.dtype == "bf16" else "f32"
        size = 2 if dtype == "bf16" else 4
        per = max(1, self.max_binding // (size * C))
        if per < rows:
            per = max(64, per // 64 * 64) if per >= 64 else per
        piece = max(2, self.UPLOAD_PIECE // (4 * C) // 2 * 2)   # rows converted at a time (even)
        out = RowTable(dtype=dtype)
        for v0 in range(0, rows, per):
            n = min(per, rows - v0)
            buf = self.dev.buffer(size * n * C, f"{name}[{v0}:]")
            for r in range(0, n, piece):
                k = min(piece, n - r)
                if dtype == "bf16":
                    data = t.data[2 * (v0 + r) * C:2 * (v0 + r + k) * C]
                    self.dev.write(buf, data, 2 * r * C)   # write() pads an odd tail to 4 bytes
                else:
                    self.dev.write(buf, f32_bytes(t, (v0 + r) * C, k * C), 4 * r * C)
            out.append((v0, n, buf))
        return out

    def _rope(self, P: int) -> None:
        """cos, sin[P, D/2] covering positions 0..P-1 (grown, never shrunk)."""
        if P <= self.P:
            return
        cos, sin = rope_tables(P, self.D, float(self.config.get("rope_theta", 10000.0)))
        self.cos, self.sin = self.dev.buffer(4 * len(cos), "rope_cos", cos), self.dev.buffer(4 * len(sin), "rope_sin", sin)
        self.P = P

    # -- sizes ------------------------------------------------------------------
    def param_count(self) -> int:
        """Weights of the projections and the embedding (the figure the page shows)."""
        return sum(p.O * p.I for lay in self.layers for p in lay.proj.values()) + self.V * self.C

    def activations(self, B: int, T: int, lora=None, micro_batches: int = 1,
                    checkpointing: bool = False) -> Activations:
        """Training activations for micro-batches of up to B sequences of T tokens (with
        `checkpointing`, only each layer's input is kept: backward recomputes the rest)."""
        modules = lora.modules if lora is not None else ()
        return Activations(self, B, T, modules, lora.R if lora is not None else 0,
                           "checkpoint" if checkpointing else "train", micro_batches)

    # Host (Python) memory a checkpoint needs at its peak, in copies of the adapter's f32
    # parameters: the parameters and AdamW's two moments read out of the GPU and unpacked,
    # the file's one buffer they are copied into (safetensors.dumps), the step's adapter
    # snapshot. Measured with tracemalloc (tests/test_memory_estimate.py): 7.2-8.2 copies
    # (13-14 while dumps joined per-tensor copies, then the header and the data).
    HOST_COPIES = 10

    def memory_estimate(self, cfg, seq_len: int | None = None, rows: int | None = None) -> dict:
        """GPU bytes a training run with TrainConfig `cfg` allocates: {"total", "largest",
        "parts": {what: bytes}, "host"}. The weights are this model's own buffers; the rest is
        what Activations, the LoRA arena, AdamW and split-K allocate for micro-batches
        of `rows` (default cfg.micro_batch_size) sequences of `seq_len` tokens (default:
        cfg.cutoff_len, capped at the model's context). "host": not GPU memory, but the
        Python memory its checkpoints need at their peak (HOST_COPIES; a bound, not exact)."""
        T = seq_len or min(cfg.cutoff_len, int(self.config.get("max_position_embeddings", cfg.cutoff_len)))
        N = (rows or cfg.micro_batch_size) * T
        modules = [m for m in MODULES if m in cfg.target_modules]
        plan = Activations.plan(self, N, modules, cfg.lora_r, "checkpoint" if cfg.gradient_checkpointing else "train",
                                cfg.grad_accum)
        shapes = peft.lora_shapes(self.config, modules, cfg.lora_r)
        arena = ParamArena.plan(shapes)
        parts = {"weights": self.weight_bytes,
                 "activations": sum(b for _, b in plan),
                 "lora + adamw": sum(arena.values()) + AdamW.state_bytes(len(shapes)),
                 "split-k": buffer_bytes(4 * self.splitk_floats(N, cfg.lora_r if modules else 0))}
        largest = max([b for _, b in plan] + [arena["params"]])
        return {"total": sum(parts.values()), "largest": largest, "parts": parts,
                "host": self.HOST_COPIES * arena["params"]}

    def splitk_floats(self, N: int, R: int = 0) -> int:
        """The split-K scratch a training step of N rows (LoRA rank R) grows to (floats)
        on this model's device (none on a CPU: its kernels split nothing)."""
        sizes = {(p.I, p.O) for lay in self.layers for p in lay.proj.values()}
        groups = {(lay.proj[g[0]].I, sum(lay.proj[m].O for m in g)) for lay in self.layers for g in INPUTS}
        kind = self.dev.kind
        return max([bitlinear.scratch_floats(N, I, O, kind) for I, O in sizes]
                   + [bitlinear.forward_scratch_floats(N, I, O, kind) for I, O in groups]
                   + [linear.scratch_floats(N, self.C, rows, kind) for _, rows, _ in self.head]
                   + ([lora_ops.scratch_floats(N, sizes, R)] if R and kind != "cpu" else [])
                   + [attention_ops.scratch_floats(N, self.H, self.Hkv, self.D, kind)])

    # -- caches and scratch ----------------------------------------------------------
    def kv_cache(self, B: int, S: int) -> KVCache:
        """An empty KV cache for B sequences of up to S positions (the model keeps one
        and reuses its buffers while they are big enough)."""
        c = self._cache
        if c is None or c.B != B or c.S < S:
            if c is not None:
                self._free_decoding(c.k + c.v + [c.pos_buf])
            size = 4 * B * S * self.Hkv * self.D
            k = [self.dev.buffer(size, f"k_cache{i}") for i in range(self.L)]
            v = [self.dev.buffer(size, f"v_cache{i}") for i in range(self.L)]
            c = self._cache = KVCache(B, S, k, v, self.dev.buffer(4, "kv_pos"))
        else:
            self.dev.write(c.pos_buf, bytes(4))   # lands before the next submit runs
        c.pos = 0
        self._rope(S)
        return c

    def _free_decoding(self, bufs) -> None:
        """Free decoding buffers that a bigger set replaces (a longer generation, more
        rows, another adapter): what is recorded so far is submitted first (it may still
        use them; submitted work keeps them alive), and the recorded steps that bind
        them are dropped with them."""
        self.dev.submit()
        self.dev.destroy(*{id(b): b for b in bufs}.values())
        self._steps.clear()
        self._prompts_seen.clear()

    def _decoding(self, B: int, T: int, lora) -> Activations:
        """The decoding scratch for N = B*T rows (reallocated only when N, the LoRA rank
        or the set of adapted projections grows)."""
        a = self._scratch
        modules, R = (lora.modules, lora.R) if lora is not None else ((), 0)
        if a is None or a.N < B * T or a.R < R or not set(modules) <= set(a.modules):
            N = max(B * T, a.N if a is not None else 0)
            if a is not None:
                self._free_decoding(a.buffers())
            a = self._scratch = Activations(self, 1, N, modules or (a.modules if a else ()),
                                            max(R, a.R if a else 0), "decode")
        a.B, a.T = B, T
        return a

    # -- forward ------------------------------------------------------------------
    def forward(self, ids, acts: Activations | None = None, lora=None, cache: KVCache | None = None,
                targets=None, micro: int = 0, step: int = 0, logits: str | None = "all"):
        """Record the forward of ids[B, T] (B equal-length lists, or one flat list: B = 1;
        or, decoding with a cache, a GPU buffer holding ids[B] u32: one token per
        sequence, T = 1, e.g. where ops.sample left the last step's choice).

        acts: training activations (model.activations): every layer's activations are
          kept for `backward`, the logits of all rows land in acts.top.logits and, with
          `targets[N]` (-1: not a target), the cross-entropy of each row's target is
          added into acts.top.loss_sum and the logits become dlogits (for backward).
          LoRA dropout is on, its masks drawn from (micro, step). (train_inputs, then
          train_forward; train_micro adds the backward and replays recorded steps.)
        Without acts (decoding): one shared scratch, no dropout; `cache` (model.kv_cache)
          puts k, v at positions cache.pos.. and attends over everything cached.
          logits: "all" -> logits[N, V], "last" -> each sequence's last row [B, V],
          None -> none (the final hidden states stay for `head_rows`).
        Returns the logits buffer (or None). Records; does not submit."""
        if acts is not None:
            if cache is not None:
                raise ValueError("forward: training activations take no KV cache")
            self.train_inputs(ids, acts, targets, micro, step)
            return self.train_forward(acts, lora, loss=targets is not None)
        on_gpu = isinstance(ids, (gpu.Buffer, gpu.BufferView))
        if on_gpu:
            if cache is None:
                raise ValueError("forward: token ids in a GPU buffer are for decoding with a KV cache")
            B, T, flat = cache.B, 1, None
        else:
            B, T, flat = self._check_ids(ids)
        acts = self._decoding(B, T, lora)
        pos0 = 0
        if cache is not None:
            if cache.B != B or cache.pos + T > cache.S:
                raise ValueError(f"forward: cache holds B={cache.B}, S={cache.S}; asked B={B}, "
                                 f"positions {cache.pos}..{cache.pos + T - 1}")
            pos0 = cache.pos
        self._rope(pos0 + T)
        if on_gpu:
            ids_buf = ids
        else:
            ids_buf = acts.io(0)[0]
            self.dev.write(ids_buf, array.array("I", flat))   # lands before this forward's submit
        self._forward(acts, lora, cache, B, T, 0 if cache is not None else pos0, ids_buf)
        if cache is not None:
            cache.pos += T
        if logits == "all":
            return self.head_rows(B * T)
        if logits == "last":
            return self.head_rows(B, T - 1, T)
        return None

    def _check_ids(self, ids) -> tuple:
        """(B, T, flat ids) of ids[B, T] (or one flat list), checked."""
        seqs = [list(ids)] if ids and isinstance(ids[0], int) else [list(s) for s in ids]
        B, T = len(seqs), len(seqs[0]) if seqs else 0
        if T == 0 or any(len(s) != T for s in seqs):
            raise ValueError("forward: ids must be B >= 1 non-empty sequences of equal length")
        flat = [int(t) for s in seqs for t in s]
        bad = [t for t in flat if not 0 <= t < self.V]
        if bad:
            raise ValueError(f"forward: token id {bad[0]} outside the vocabulary (V={self.V})")
        return B, T, flat

    def _forward(self, acts, lora, cache, B, T, pos0, ids_buf=None, layers: range | None = None) -> None:
        """Record embedding (of ids_buf, default the micro-batch's ids), every layer and
        the final norm (into acts.top.xf). With a cache, positions start at cache.pos_buf's
        count (on the GPU; pos0 is added) and the forward advances it by T. `layers`: record
        only these (a part of the forward: the embedding comes with layer 0, the final norm
        and the cache's advance with the last)."""
        N, top = B * T, acts.top
        layers = range(self.L) if layers is None else layers
        if layers.start == 0:
            ids_buf = acts.io(acts.micro)[0] if ids_buf is None else ids_buf
            embedding_forward(self.dev, ids_buf, self.embed, acts.layer(0).x, N, self.C)
        for li in layers:
            self._layer_forward(li, acts, lora, cache, B, T, pos0)
        if layers.stop < self.L:
            return
        if cache is not None:
            kv_advance(self.dev, cache.pos_buf, T)
        rmsnorm_forward(self.dev, top.x_out, self.norm, top.xf, top.rstd_out, N, self.C, self.eps)

    # -- a training micro-batch: host data, then recorded (or replayed) dispatches ----
    def train_inputs(self, ids, acts: Activations, targets=None, micro: int = 0, step: int = 0) -> tuple:
        """Check a training micro-batch ids[B, T] and write what changes from step to step
        into acts.io(micro): the token ids, `targets[N]` (when given) and the LoRA dropout
        stream of (step, micro). Writes land before the next submit runs. Returns (B, T);
        train_forward / backward then record dispatches that depend on (B, T, micro) only."""
        B, T, flat = self._check_ids(ids)
        if B * T > acts.N:
            raise ValueError(f"forward: {B} x {T} tokens exceed the activations' {acts.N} rows")
        if targets is not None and len(targets) != B * T:
            raise ValueError(f"forward: {len(targets)} targets for {B} x {T} tokens")
        ids_buf, tbuf, stream = acts.io(micro)
        acts.B, acts.T, acts.micro = B, T, micro
        self._rope(T)
        self.dev.write(ids_buf, array.array("I", flat))
        if targets is not None:
            self.dev.write(tbuf, array.array("i", targets))
        self.dev.write(stream, struct.pack("<I", Lora.dropout_stream(step, micro)))
        return B, T

    def train_forward(self, acts: Activations, lora=None, loss: bool = True):
        """Record the training forward of the micro-batch train_inputs wrote: logits into
        acts.top.logits and, with `loss`, each row's cross-entropy added into
        acts.top.loss_sum with dlogits left in the logits. Returns the logits buffer."""
        B, T, N, top = acts.B, acts.T, acts.B * acts.T, acts.top
        self._forward(acts, lora, None, B, T, 0)
        linear_forward(self.dev, top.xf, self.head, top.logits, N, self.C, self.V)
        if loss:
            cross_entropy_forward_backward(self.dev, top.logits, acts.io(acts.micro)[1], top.losses, N, self.V, 1.0)
            cross_entropy_sum(self.dev, top.losses, top.loss_sum, N)
        return top.logits

    def train_micro(self, ids, acts: Activations, lora, targets, micro: int = 0, step: int = 0,
                    programs=None, accumulate: bool = True) -> None:
        """One micro-batch of a training step: its inputs written (train_inputs), then
        forward, loss and backward recorded; the LoRA gradients added into the arena, or
        with accumulate=False written (a step's first micro-batch when the optimizer does
        not zero them: AdamW(zero_grads=False)). With `programs` (a gpu.Programs), the
        dispatches are recorded once per (B, T, micro, accumulate) and replayed after that
        in one backend call: only the writes cost the host anything per step. (The
        device's kernel choices, kind and int8_dot, are in the key too: tests switch them.)"""
        B, T = self.train_inputs(ids, acts, targets, micro, step)

        def record():
            self.train_forward(acts, lora)
            self.backward(acts, lora, accumulate)

        if programs is None:
            record()
        else:
            programs.run(("train", B, T, micro, accumulate, self.dev.kind, self.dev.int8_dot), record)

    def _norm_proj(self, li, norm, x, n, rstd, width, mods, outs, acts, lora, accumulate=False, gate=None,
                   defer=False, gate_out=None):
        """n = norm(x), then BitLinear(n) of projections `mods` of layer li into `outs` (=
        or +=; one activation quantisation for all of them), each plus its LoRA branch
        when adapted. gate = (g, u): x = act(g) * u first (the MLP's gating); gate_out = h:
        that gating of this group's two outputs right after the product instead (N > 1,
        no LoRA on them: in the split product's reduce, ops.bitlinear).
        defer: return this group's split sums (None if unsplit or adapted) undispatched,
        for a kernel that reduces them as it reads (rope_kv_store).
        A one-token forward (decoding, N = 1) fuses the gating, the norm and the
        quantisation in one dispatch and multiplies the group in one more (ops.matvec), the
        group's LoRA branches inside those two on a GPU (their down half beside the norm,
        their up half in the matvec): the same bits. On a GPU a group without LoRA is one
        dispatch in all (norm_matvec; n is not kept)."""
        dev, N, top = self.dev, acts.B * acts.T, acts.top
        w, projs = self.layers[li].norms[norm], [self.layers[li].proj[m] for m in mods]
        adapted = lora is not None and any(lora.adapts(m) for m in mods)
        if N == 1 and not acts.training:
            wp, parts = self._parts(projs, outs)
            if not adapted and matvec.fusable(dev, parts, width):   # norm and product: one dispatch
                matvec.norm_matvec(dev, x, w, self.eps, wp, parts, width, accumulate, gate and (self.act, *gate))
                return None
            fused = down = None
            if adapted:   # the branch: its down half with the norm, its up half in the matvec
                ab, offs = lora.decode_parts(li, mods)
                down = (ab, [None if o is None else o[0] for o in offs], top.lora_ups, lora.R)
                fused = (top.lora_ups, ab, lora.R, lora.scale, [None if o is None else o[1] for o in offs])
            rmsnorm_quant(dev, x, w, n, top.xq4, top.qs, width, self.eps, gate and (self.act, *gate), down)
            ternary_matvec(dev, top.xq4, top.qs, wp, parts, width, accumulate, fused)
            return None
        if gate is not None:
            gating_forward(dev, self.act, gate[0], gate[1], x, N * width)
        rmsnorm_quant_forward(dev, x, w, n, rstd, top.xq, top.s, N, width, self.eps)   # one dispatch on GPUs
        wp, parts = self._parts(projs, outs)
        mine = bitlinear_forward_parts(dev, top.xq, top.s, wp, parts, N, width, accumulate,
                                       w_ts=[p.t for p in projs], defer=defer and not adapted,
                                       gate=None if gate_out is None else (self.act, gate_out))
        for mod, y in zip(mods, outs):
            if lora is not None and lora.adapts(mod):
                lora.apply(li, mod, n, y, acts.lora_u(li, mod), N, acts.training, acts.io(acts.micro)[2])
        return mine

    @staticmethod
    def _parts(projs, outs) -> tuple:
        """A group's weights (a view of their shared buffer from the first) and its parts
        [(word offset there, O, scale, y), ...] for ops.matvec / bitlinear_forward_parts."""
        base = projs[0].buf.offset
        return projs[0].buf.buffer.view(base), [((p.buf.offset - base) // 4, p.O, p.scale, y)
                                                for p, y in zip(projs, outs)]

    def _layer_forward(self, li, acts, lora, cache, B, T, pos0, out=None):
        """Record layer li: acts.layer(li).x -> `out` (default: the next layer's x)."""
        dev, C, F, H, Hkv, D = self.dev, self.C, self.F, self.H, self.Hkv, self.D
        N = B * T
        a, out = acts.layer(li), out or acts.out(li)
        sums = self._norm_proj(li, "input_layernorm", a.x, a.n1, a.rstd1, C, ("q_proj", "k_proj", "v_proj"),
                               (a.q, a.k, a.v), acts, lora, defer=cache is not None)
        if cache is not None:     # rope on q, and on k on its way into the cache: one dispatch
            rope_kv_store(dev, a.q, a.k, a.v, cache.k[li], cache.v[li], self.cos, self.sin, B, T, H, Hkv, D,
                          cache.S, pos0, cache.pos_buf, sums=sums)   # (which reduces the split q, k, v)
            k, v, S, kv_pos = cache.k[li], cache.v[li], cache.S, cache.pos_buf
        else:
            rope_forward(dev, a.q, self.cos, self.sin, N, T, H, D, pos0)
            rope_forward(dev, a.k, self.cos, self.sin, N, T, Hkv, D, pos0)
            k, v, S, kv_pos = a.k, a.v, T, None
        attention_forward(dev, a.q, k, v, a.att, a.lse, B, T, H, Hkv, D, S, pos0, kv_pos=kv_pos)
        if a.x_mid is not a.x:
            dev.copy(a.x, a.x_mid, 4 * N * C)
        self._norm_proj(li, "self_attn.attn_sub_norm", a.att, a.an, a.rstd_a, C, ("o_proj",), (a.x_mid,),
                        acts, lora, accumulate=True)
        mlp = ("gate_proj", "up_proj")     # their gating right after them (in a split product's
        early = N > 1 and (lora is None or not any(lora.adapts(m) for m in mlp))   # reduce), or with the norm
        self._norm_proj(li, "post_attention_layernorm", a.x_mid, a.n2, a.rstd2, C, mlp, (a.g, a.u), acts, lora,
                        gate_out=a.hf if early else None)
        if out is not a.x_mid:
            dev.copy(a.x_mid, out, 4 * N * C)
        self._norm_proj(li, "mlp.ffn_sub_norm", a.hf, a.fn, a.rstd_f, F, ("down_proj",), (out,), acts, lora,
                        accumulate=True, gate=None if early else (a.g, a.u))

    def head_rows(self, rows: int, row0: int = 0, step: int = 1):
        """logits[rows, V] of final hidden-state rows row0 + r*step of the last decoding
        forward (lm_head over every vocabulary chunk). Returns the logits buffer."""
        self._logits_rows(rows)
        if rows == 1:
            dense_matvec(self.dev, self._scratch.top.xf, self.head, self._logits, self.C, self.V, row0)
        else:
            linear_forward(self.dev, self._scratch.top.xf, self.head, self._logits, rows, self.C, self.V, row0, step)
        return self._logits

    def _logits_rows(self, rows: int):
        """The decoding logits buffer, grown to hold logits[rows, V]."""
        need = 4 * rows * self.V
        if need > self.max_binding:
            raise ValueError(f"{rows} logits rows need {need} bytes, over one binding's {self.max_binding}: "
                             f"ask for fewer rows at a time (alogits does)")
        if self._logits is None or self._logits.size < need:
            if self._logits is not None:
                self._free_decoding([self._logits])
            self._logits = self.dev.buffer(need, "logits")
        return self._logits

    # -- backward -------------------------------------------------------------------
    def backward(self, acts: Activations, lora, accumulate: bool = True) -> None:
        """Record the backward of the last training forward on `acts` (whose logits hold
        dlogits) down to every LoRA gradient, added into lora.arena.grads (written, not
        added, with accumulate=False). The frozen weights get input gradients only: exact
        reverse of forward, one layer at a time."""
        dev, N, C = self.dev, acts.B * acts.T, self.C
        top, g = acts.top, acts.grad
        for ci, (v0, rows, w) in enumerate(self.head):   # dxf = dlogits E, per vocabulary chunk
            dy = top.logits if v0 == 0 else top.logits.view(4 * v0, top.logits.size - 4 * v0)
            linear_backward_input(dev, dy, w, g.dxf, N, C, rows, accumulate=ci > 0, ld_dy=self.V,
                                  w_dtype=self.head.dtype)
        rmsnorm_backward(dev, g.dxf, top.x_out, self.norm, top.rstd_out, g.dh, N, C)
        for li in range(self.L - 1, -1, -1):
            if acts.mode == "checkpoint":   # refill the shared set: the same kernels, inputs and
                self._layer_forward(li, acts, lora, None, acts.B, acts.T, 0, out=top.x_out)   # masks
            self._layer_backward(li, acts, lora, accumulate)

    def _proj_back(self, li, mod, dy, x, dx, accumulate, acts, lora, grads_accumulate=True, defer=False):
        """dx (= or +=) the input gradient of projection `mod` from dy, plus its LoRA
        branch's (whose A, B gradients go into the arena, += or = by grads_accumulate); dx
        None: the LoRA gradients only. defer (where FOLD_REDUCES): an unadapted projection's
        split reduce is returned undispatched, for the norm's backward after it."""
        p, N = self.layers[li].proj[mod], acts.B * acts.T
        adapted = lora is not None and lora.adapts(mod)
        sums = None
        if dx is not None:
            sums = bitlinear_backward_input(self.dev, dy, p.buf, p.scale, dx, N, p.I, p.O, accumulate,
                                            defer=defer and self.FOLD_REDUCES and not adapted)
        if adapted:
            lora.apply_backward(li, mod, dy, x, acts.lora_u(li, mod), dx, acts.grad.du_lora, N,
                                acts.io(acts.micro)[2], grads_accumulate)
        return sums

    def _layer_backward(self, li, acts, lora, grads_accumulate=True):
        """The backward of one layer; g.dh holds the gradient of its output on entry and of
        its input on return."""
        dev, C, F, H, Hkv, D = self.dev, self.C, self.F, self.H, self.Hkv, self.D
        B, T, N = acts.B, acts.T, acts.B * acts.T
        W, a, g = self.layers[li].norms, acts.layer(li), acts.grad
        back = lambda mod, dy, x, dx, acc, defer=False: self._proj_back(  # noqa: E731
            li, mod, dy, x, dx, acc, acts, lora, grads_accumulate, defer)
        # FFN: x_out = x_mid + down(ffn_sub_norm(act(gate(n2)) * up(n2)))
        sums = back("down_proj", g.dh, a.fn, g.d_fn, False, defer=True)
        rmsnorm_backward(dev, g.d_fn, a.hf, W["mlp.ffn_sub_norm"], a.rstd_f, g.d_hf, N, F, sums=sums)
        gating_backward(dev, self.act, g.d_hf, a.g, a.u, g.dg, g.du, N * F)
        back("gate_proj", g.dg, a.n2, g.dn, False)
        sums = back("up_proj", g.du, a.n2, g.dn, True, defer=True)
        rmsnorm_backward(dev, g.dn, a.x_mid, W["post_attention_layernorm"], a.rstd2, g.dh, N, C, accumulate=True,
                         sums=sums)
        # attention: x_mid = x + o(attn_sub_norm(attention(rope(q(n1)), rope(k(n1)), v(n1))))
        sums = back("o_proj", g.dh, a.an, g.d_an, False, defer=True)
        rmsnorm_backward(dev, g.d_an, a.att, W["self_attn.attn_sub_norm"], a.rstd_a, g.d_att, N, C, sums=sums)
        attention_backward(dev, g.d_att, a.q, a.k, a.v, g.dq, g.dk, g.dv, g.stats, B, T, H, Hkv, D,
                           out=a.att, lse=a.lse)
        rope_backward(dev, g.dq, self.cos, self.sin, N, T, H, D)
        rope_backward(dev, g.dk, self.cos, self.sin, N, T, Hkv, D)
        # the first layer's input is the frozen embedding's output: nothing needs its
        # gradient (nor does torch's autograd compute it), so q, k, v give LoRA gradients only
        dn = g.dn if li > 0 else None
        back("q_proj", g.dq, a.n1, dn, False)
        back("k_proj", g.dk, a.n1, dn, True)
        back("v_proj", g.dv, a.n1, dn, True)
        if li > 0:
            rmsnorm_backward(dev, g.dn, a.x, W["input_layernorm"], a.rstd1, g.dh, N, C, accumulate=True)

    # -- reading logits ---------------------------------------------------------------
    async def alogits(self, ids, lora=None) -> list:
        """logits of every position of ids[T] (or ids[B, T]: rows b*T + t), with the
        LoRA branches of `lora` when given (no dropout): a list of N rows, each an
        array('f') of V floats."""
        self.forward(ids, lora=lora, logits=None)
        N = self._scratch.B * self._scratch.T
        per = max(1, min(N, self.max_binding // (4 * self.V)))   # rows per lm_head pass
        out = []
        for r0 in range(0, N, per):
            rows = min(per, N - r0)
            buf = self.head_rows(rows, r0)
            flat = array.array("f")
            flat.frombytes(await self.dev.read(buf, 0, 4 * rows * self.V))
            out += [flat[r * self.V:(r + 1) * self.V] for r in range(rows)]
        return out

    # -- generation ---------------------------------------------------------------
    def eos_ids(self) -> set:
        e = self.config.get("eos_token_id")
        out = set(e if isinstance(e, (list, tuple)) else [] if e is None else [e])
        if self.tokenizer is not None and getattr(self.tokenizer, "eos_id", None) is not None:
            out.add(self.tokenizer.eos_id)
        return out

    AHEAD = 4   # decoding steps submitted beyond the one whose id is awaited

    def _sampler(self, max_new_tokens: int) -> _Set:
        """The sampler's buffers (ops.sample): state[4], tok[1] (the next step's input id)
        and out[max_new_tokens] (the chosen ids), kept and grown as needed."""
        g = self._gen
        if g is None:
            g = self._gen = _Set()
            g.state, g.tok, g.out = self.dev.buffer(16, "sampler_state"), self.dev.buffer(4, "sampler_tok"), None
        if g.out is None or g.out.size < 4 * max_new_tokens:
            if g.out is not None:
                self.dev.destroy(g.out)
            g.out = self.dev.buffer(4 * max(max_new_tokens, 64), "sampler_out")
        return g

    def _decode_step(self, cache: KVCache, lora, g: _Set, ids=None) -> None:
        """Put one generation step into the current submit: the forward of the ids in g.tok[B]
        (or of the prompt `ids`, a list, B = 1) at the cache's next positions, then the
        sampler (g, `_sampler`) choosing the next id from the last row. Nothing in it depends
        on the position (the GPU holds it: KVCache.pos_buf), so a step is recorded once per
        token count and set of buffers and replayed after that: one backend call a token
        (and a prompt of a length seen before costs the host a write and one call per part:
        prompt_parts, each submitted as soon as it is encoded).
        The key names every buffer the recording binds that the model may reallocate."""
        B, T = (cache.B, 1) if ids is None else (1, len(ids))
        if cache.B != B or cache.pos + T > cache.S:
            raise ValueError(f"decoding: the cache holds B={cache.B}, S={cache.S}; asked B={B}, "
                             f"positions {cache.pos}..{cache.pos + T - 1}")
        acts, logits = self._decoding(B, T, lora), self._logits_rows(B)
        src = g.tok
        if ids is not None:
            src = acts.io(0)[0]
            self.dev.write(src, array.array("I", self._check_ids(ids)[2]))   # lands before this submit
        lkey = None if lora is None else (lora.arena.params.uid, lora.R, lora.scale, tuple(lora.modules))
        key = (B, T, lkey, src.uid, cache.pos_buf.uid, cache.k[0].uid, self.cos.uid, acts.layers[0].x.uid,
               logits.uid, g.state.uid, g.tok.uid, g.out.uid, self.dev.kind, self.dev.int8_dot)

        def record(layers: range):
            self._forward(acts, lora, cache, B, T, 0, src, layers)
            if layers.stop == self.L:
                sample_token(self.dev, self.head_rows(B, T - 1, T), g.state, g.tok, g.out, self.V)

        if ids is None:
            self._steps.run(key, lambda: record(range(self.L)))
        else:   # a prompt: its parts submitted as they are encoded (the GPU starts on the first)
            plain = (key, 0) not in self._steps and key not in self._prompts_seen
            self._prompts_seen.add(key)   # a prompt length seen once runs plainly: recording costs
            for k, layers in enumerate(self.prompt_parts()):   # the host more than that, and pays
                if plain:                                     # only when it comes back
                    record(layers)
                else:
                    self._steps.run((key, k), lambda: record(layers))
                if layers.stop < self.L:
                    self.dev.submit()
        cache.pos += T

    def prompt_parts(self) -> list:
        """The layer ranges a prompt's forward is submitted in, each as soon as the host has
        encoded it, so the GPU runs the first while the host encodes the rest: 1, 2, 4, ...
        layers (a small first part starts the GPU early; later ones cost fewer submits)."""
        parts, start, size = [], 0, 1
        while start < self.L:
            parts.append(range(start, min(self.L, start + size)))
            start, size = start + size, 2 * size
        return parts

    def fit_context(self, prompt_tokens: int, max_new_tokens: int) -> tuple:
        """(new tokens that fit, warning) for a prompt of prompt_tokens: prompt + new tokens
        stay within the model's context (max_position_embeddings; past it the positions are
        ones the model never saw, RoPE extrapolates and the text is garbage). A prompt that
        fills the context is a ValueError; fewer new tokens come with a warning (also
        warnings.warn), "" when all fit or the model names no context."""
        ctx = self.config.get("max_position_embeddings")
        if not ctx or prompt_tokens + max_new_tokens <= int(ctx):
            return max_new_tokens, ""
        ctx = int(ctx)
        if prompt_tokens >= ctx:
            raise ValueError(f"generate: the prompt is {prompt_tokens} tokens and the model's context "
                             f"(max_position_embeddings) is {ctx}: shorten the prompt to at most {ctx - 1} "
                             "tokens")
        fit = ctx - prompt_tokens
        warning = (f"the prompt's {prompt_tokens} tokens + {max_new_tokens} new tokens go past the model's "
                   f"context of {ctx} tokens: generating at most {fit} new tokens")
        warnings.warn("generate: " + warning, stacklevel=2)
        return fit, warning

    async def agenerate(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                        seed: int = 0, lora=None, on_token=None, should_stop=None, eos=None) -> Generation:
        """Continue `prompt` (text, encoded with the tokenizer's BOS template; or a list
        of ids) by up to max_new_tokens tokens, stopping after an EOS. temperature 0 is
        greedy; otherwise nucleus sampling (top_p) from `seed` (ops.sample: on the GPU,
        reproducible). With `lora`, the adapted model.

        The prompt runs once, then one token per step over the KV cache, each step (and a
        prompt of a length seen before) recorded dispatches replayed (_decode_step: one
        backend call). Each step's token
        is chosen on the GPU and becomes the next step's input there, so steps are
        submitted AHEAD of the one whose id is read back (4 bytes); an EOS is seen a few
        steps late and the steps after it are dropped. on_token(id, ids so far) is called
        (and awaited if it returns an awaitable) as each id arrives; should_stop() -> True
        ends the generation there (Generation.stopped). eos: the ids that end it (default
        eos_ids(); benchmarks pass an empty set). Prompt + new tokens stay within the
        model's context (fit_context: fewer new tokens, with Generation.warning; a prompt
        that fills it is a ValueError)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("generate: this model has no tokenizer; pass token ids")
            bad = text_problem(prompt)
            if bad:
                raise ValueError(f"generate: the prompt {bad}")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("generate: empty prompt")
        max_new_tokens, warning = self.fit_context(len(ids), max_new_tokens)
        dev, eos = self.dev, self.eos_ids() if eos is None else set(eos)
        cache = self.kv_cache(1, len(ids) + max_new_tokens)
        g = self._sampler(max_new_tokens)
        dev.write(g.state, sampler_state(seed, temperature, top_p))
        out = Generation("", [], ids, warning=warning)
        t0, d0 = time.perf_counter(), dev.dispatches
        pending, recorded, done = collections.deque(), 0, False
        while True:
            h = time.perf_counter()
            while recorded < max_new_tokens and len(pending) <= self.AHEAD and not done:
                self._decode_step(cache, lora, g, ids if recorded == 0 else None)   # recorded, replayed
                pending.append(dev.read_later(g.out, 4 * recorded, 4))
                dev.submit()
                recorded += 1
            out.host_s += time.perf_counter() - h
            if not pending:
                break
            tok = struct.unpack("<I", await pending.popleft().get())[0]
            if done:              # steps submitted past the end: read (their staging buffers return), dropped
                continue
            if not out.ids:
                out.first_token_s = time.perf_counter() - t0
            out.ids.append(tok)
            if on_token is not None:
                res = on_token(tok, out.ids)
                if inspect.isawaitable(res):
                    await res
            out.stopped_at_eos = tok in eos
            out.stopped = not out.stopped_at_eos and should_stop is not None and bool(should_stop())
            done = out.stopped_at_eos or out.stopped
        out.total_s, out.dispatches = time.perf_counter() - t0, dev.dispatches - d0
        if self.tokenizer is not None:
            out.text = self.tokenizer.decode(out.ids, skip_special_tokens=True)
        return out

    # -- plain calls natively, awaitables in the browser ------------------------------
    def logits(self, ids, lora=None):
        """`alogits` as a plain call natively; in Pyodide an awaitable."""
        return gpu.maybe_run(self.alogits(ids, lora))

    def generate(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0, lora=None, on_token=None, should_stop=None):
        """`agenerate` as a plain call natively; in Pyodide an awaitable."""
        return gpu.maybe_run(self.agenerate(prompt, max_new_tokens, temperature, top_p, seed, lora, on_token,
                                            should_stop))


def load_model(src="demo", progress=None, device=None, max_binding: int | None = None):
    """`bitlora.load_model`: `Model.load` as a plain call natively (a Model); in Pyodide
    an awaitable."""
    return gpu.maybe_run(Model.load(src, progress, device, max_binding))
