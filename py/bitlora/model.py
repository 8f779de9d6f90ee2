"""The BitNet b1.58 model on the GPU: weights, forward over whole sequences, a KV
cache for incremental decoding, and sampling. Browser-safe: standard library + bitlora.

Shape legend (used everywhere in bitlora):
  B batch, T tokens per sequence, N = B*T rows, C width (hidden_size), H heads,
  Hkv KV heads, D head dim, F FFN width (intermediate_size), V vocab, L layers,
  S KV-cache capacity (positions per sequence), P RoPE table positions.

One decoder layer, as HF's BitNetForCausalLM computes it (REFERENCE.md section 2):
  n1 = input_layernorm(x);  q, k, v = BitLinear(n1);  q, k = rope(q), rope(k)
  x += o_proj(attn_sub_norm(attention(q, k, v)))
  n2 = post_attention_layernorm(x)
  x += down_proj(ffn_sub_norm(relu(gate_proj(n2))^2 * up_proj(n2)))
and logits = lm_head(norm(x)), lm_head a plain float linear (tied: the embedding).
Every BitLinear is actquant (per-token int8) + packed ternary matmul.

What the GPU holds: ternary weights packed 2 bits per weight exactly as
`formats.tensors.TernaryTensor` lays them out (never expanded); norms, embedding
and lm_head as f32, the embedding / lm_head in row chunks of at most
`max_binding` bytes each (a 2B-4T embedding is larger than one binding may be).
Scratch activations are sized for the largest N seen; the KV cache holds
k, v[B, S, Hkv*D] per layer. Saved for a backward: each norm's rstd and the
attention lse are computed (into scratch; the trainer owns what it keeps).
"""
from __future__ import annotations

import array
import random
import struct
from dataclasses import dataclass, field

from . import demo, gpu
from .bitnet import NORMS, PROJ
from .formats import open_checkpoint, source_name
from .formats.tensors import FloatTensor, TernaryTensor
from .ops.attention import attention_forward, kv_store
from .ops.bitlinear import actquant_forward, bitlinear_forward
from .ops.embedding import embedding_forward
from .ops.ffn import relu2_gating_forward
from .ops.lm_head import linear_forward
from .ops.rmsnorm import rmsnorm_forward
from .ops.rope import rope_forward, rope_tables


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
    out = array.array("f")   # f16: widened 64 Ki values at a time (a tuple of them all would
    for a in range(0, count, 1 << 16):   # take ~30 bytes of heap per value)
        k = min(1 << 16, count - a)
        out.extend(struct.unpack(f"<{k}e", raw[2 * a:2 * (a + k)]))
    return out


class RowTable(list):
    """An embedding / lm_head table as row chunks [(v0, rows, buffer), ...]; `dtype` is
    "f32", or "bf16" when the checkpoint stores bf16 (kept as is: exact, half the GPU
    memory; the kernels widen each value to f32 as they read it)."""

    def __init__(self, chunks=(), dtype: str = "f32"):
        super().__init__(chunks)
        self.dtype = dtype


@dataclass
class Proj:
    """A BitLinear weight on the GPU: w_packed[O, ceil(I/16)] u32, dequantised t * scale."""
    buf: object
    scale: float
    O: int
    I: int


@dataclass
class Layer:
    norms: dict          # NORMS name -> w[C] (ffn_sub_norm: w[F]) buffer
    proj: dict           # PROJ name -> Proj


@dataclass
class Generation:
    """What generate() returns; str() of it is the text."""
    text: str
    ids: list            # new token ids (the EOS that stopped it included)
    prompt_ids: list
    stopped_at_eos: bool = False

    def __str__(self):
        return self.text


@dataclass
class _Scratch:
    N: int
    bufs: dict = field(default_factory=dict)


class Model:
    """A BitNet b1.58 model on a bitlora Device. Build with `await Model.load(src)` (a
    checkpoint; `bitlora.load_model` as a plain call) or `await Model.create(...)`. `config` uses HF BitNetConfig keys plus head_dim."""

    UPLOAD_PIECE = 16 << 20   # bytes of f32 made on the host at a time when uploading tables

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
        lim = min(int(dev.limits.get("maxStorageBufferBindingSize", 1 << 27)),
                  int(dev.limits.get("maxBufferSize", 1 << 30)))
        self.max_binding = min(lim, max_binding or lim)
        self.layers: list[Layer] = []
        self.embed: list = []      # [(v0, Vc, e[Vc, C] buffer)]
        self.head: list = []       # same for lm_head (the embedding's chunks when tied)
        self.norm = None
        self.P = 0
        self.cos = self.sin = None
        self._scratch = _Scratch(0)
        self.cache = None          # (B, S, [(k_cache, v_cache)] per layer)
        self._logits = None        # logits[rows, V], sized for the most rows asked
        self._last_n = 0           # N of the last forward

    # -- construction ---------------------------------------------------------
    @classmethod
    async def create(cls, dev, config: dict, load, tokenizer=None, max_binding: int | None = None,
                     name: str = "bitnet") -> "Model":
        """`load(hf_name) -> TernaryTensor | FloatTensor` (e.g. a checkpoint's `load`)."""
        m = cls(dev, config, tokenizer, max_binding, name)
        m.embed = m._upload_rows("model.embed_tokens.weight", load("model.embed_tokens.weight"))
        for i in range(m.L):
            p = f"model.layers.{i}."
            norms = {n: m._upload_vec(p + n + ".weight", load(p + n + ".weight")) for n in NORMS}
            proj = {n: m._upload_proj(p + n + ".weight", load(p + n + ".weight")) for n in PROJ}
            m.layers.append(Layer(norms, proj))
        m.norm = m._upload_vec("model.norm.weight", load("model.norm.weight"))
        tied = m.config.get("tie_word_embeddings", False)
        m.head = m.embed if tied else m._upload_rows("lm_head.weight", load("lm_head.weight"))
        m._rope(int(m.config.get("max_position_embeddings", 2048)))
        return m

    @classmethod
    async def load(cls, src="demo", progress=None, device=None, max_binding: int | None = None) -> "Model":
        """Open a checkpoint (HF folder, GGUF file, URL, bytes, {file name: bytes/Blob},
        or "demo" for the built-in demo model), upload its weights to `device` (default:
        the process-wide one) and return the Model with the checkpoint's tokenizer (None
        if it has none). `max_binding` caps the bytes of one embedding / lm_head chunk
        (default: the device's binding limit). progress(done_bytes, total_bytes)."""
        name = source_name(src)
        if isinstance(src, str) and src == "demo":
            src, name = await demo.model_source(), "demo"   # the same adapter metadata in both backends
        dev = device or await gpu.get_device()
        with open_checkpoint(src, progress=progress) as ck:
            return await cls.create(dev, ck.config, ck.load, ck.tokenizer(), max_binding, name)

    def _upload_vec(self, name, t):
        if not isinstance(t, FloatTensor):
            raise ValueError(f"{name}: expected a float tensor, got {type(t).__name__}")
        return self.dev.buffer(4 * t.numel, name, data=f32_bytes(t))

    def _upload_proj(self, name, t):
        if not isinstance(t, TernaryTensor):
            raise ValueError(f"{name}: expected a ternary tensor, got {type(t).__name__}")
        return Proj(self.dev.buffer(len(t.packed), name, data=t.packed), float(t.scale), *t.shape)

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
        if P <= self.P:
            return
        cos, sin = rope_tables(P, self.D, float(self.config.get("rope_theta", 10000.0)))
        self.cos, self.sin = self.dev.buffer(4 * len(cos), "rope_cos", cos), self.dev.buffer(4 * len(sin), "rope_sin", sin)
        self.P = P

    def _bufs(self, N: int) -> dict:
        """Scratch activations for N rows (reallocated only when N grows)."""
        if N > self._scratch.N:
            C, F, V, H = self.C, self.F, self.V, self.H
            kv = self.Hkv * self.D
            shapes = dict(ids=N, x=N * C, nrm=N * C, rstd=N, xq=N * max(C, F), s=N, q=N * C, k=N * kv, v=N * kv,
                          att=N * C, lse=N * H, g=N * F, u=N * F, hf=N * F, hn=N * F)
            self._scratch = _Scratch(N, {k: self.dev.buffer(4 * n, k) for k, n in shapes.items()})
        return self._scratch.bufs

    def reset_cache(self, B: int, S: int) -> None:
        """An empty KV cache for B sequences of up to S positions (reused if big enough)."""
        if self.cache is None or self.cache[0] != B or self.cache[1] < S:
            size = 4 * B * S * self.Hkv * self.D
            self.cache = (B, S, [(self.dev.buffer(size, f"k_cache{i}"), self.dev.buffer(size, f"v_cache{i}"))
                                 for i in range(self.L)])
        self._rope(S)

    # -- forward ----------------------------------------------------------------
    async def forward(self, ids, pos0: int = 0, last_only: bool = False, head: bool = True, adapter=None):
        """Run ids[B, T] (a list of B equal-length lists, or one flat list: B = 1) at
        positions pos0..pos0+T-1 through the model, writing their k, v into the cache
        (pos0 = 0 starts a fresh cache sized T unless reset_cache made a larger one).
        Returns (logits buffer, rows): logits[rows, V] for all N = B*T rows, or only each
        sequence's last row (rows = B) when last_only; with head=False, (None, 0) and
        the normed final hidden states stay in scratch for `head()`. Records; does not
        submit. `adapter` (e.g. a lora.LoraModel) has `await adapter.add(layer, name, x,
        y, N)`, called after each projection y = BitLinear(x) to add its branch into y."""
        seqs = [list(ids)] if ids and isinstance(ids[0], int) else [list(s) for s in ids]
        B, T = len(seqs), len(seqs[0]) if seqs else 0
        if T == 0 or any(len(s) != T for s in seqs):
            raise ValueError("forward: ids must be B >= 1 non-empty sequences of equal length")
        flat = [int(t) for s in seqs for t in s]
        bad = [t for t in flat if not 0 <= t < self.V]
        if bad:
            raise ValueError(f"forward: token id {bad[0]} outside the vocabulary (V={self.V})")
        if pos0 == 0 and (self.cache is None or self.cache[0] != B or self.cache[1] < T):
            self.reset_cache(B, T)
        cB, S, cache = self.cache
        if cB != B or pos0 + T > S:
            raise ValueError(f"forward: cache holds B={cB}, S={S}; asked B={B}, positions {pos0}..{pos0 + T - 1}")
        dev, C, F, H, Hkv, D, eps = self.dev, self.C, self.F, self.H, self.Hkv, self.D, self.eps
        N, KV = B * T, Hkv * D
        self._last_n = N
        b = self._bufs(N)
        ids_buf = b["ids"]
        dev.write(ids_buf, array.array("I", flat))   # lands before this forward's submit
        x, nrm, rstd, xq, s = b["x"], b["nrm"], b["rstd"], b["xq"], b["s"]

        async def bitlin(li, inp, width, outs, accumulate=False):
            await actquant_forward(dev, inp, xq, s, N, width)
            for name, y in outs:
                p = self.layers[li].proj[name]
                await bitlinear_forward(dev, xq, s, p.buf, p.scale, y, N, p.I, p.O, accumulate)
                if adapter is not None:
                    await adapter.add(li, name, inp, y, N)

        await embedding_forward(dev, ids_buf, self.embed, x, N, C)
        for li, lay in enumerate(self.layers):
            W = lay.norms
            kc, vc = cache[li]
            await rmsnorm_forward(dev, x, W["input_layernorm"], nrm, rstd, N, C, eps)
            await bitlin(li, nrm, C, [("self_attn.q_proj", b["q"]), ("self_attn.k_proj", b["k"]),
                                      ("self_attn.v_proj", b["v"])])
            await rope_forward(dev, b["q"], self.cos, self.sin, N, T, H, D, pos0)
            await rope_forward(dev, b["k"], self.cos, self.sin, N, T, Hkv, D, pos0)
            await kv_store(dev, b["k"], b["v"], kc, vc, B, T, S, KV, pos0)
            await attention_forward(dev, b["q"], kc, vc, b["att"], b["lse"], B, T, H, Hkv, D, S, pos0)
            await rmsnorm_forward(dev, b["att"], W["self_attn.attn_sub_norm"], nrm, rstd, N, C, eps)
            await bitlin(li, nrm, C, [("self_attn.o_proj", x)], accumulate=True)
            await rmsnorm_forward(dev, x, W["post_attention_layernorm"], nrm, rstd, N, C, eps)
            await bitlin(li, nrm, C, [("mlp.gate_proj", b["g"]), ("mlp.up_proj", b["u"])])
            await relu2_gating_forward(dev, b["g"], b["u"], b["hf"], N * F)
            await rmsnorm_forward(dev, b["hf"], W["mlp.ffn_sub_norm"], b["hn"], rstd, N, F, eps)
            await bitlin(li, b["hn"], F, [("mlp.down_proj", x)], accumulate=True)
        await rmsnorm_forward(dev, x, self.norm, nrm, rstd, N, C, eps)
        if not head:
            return None, 0
        if last_only:   # rows T-1, 2T-1, ... of the final hidden states
            return await self.head_rows(B, T - 1, T), B
        return await self.head_rows(N), N

    async def head_rows(self, rows: int, row0: int = 0, step: int = 1):
        """logits[rows, V] of final hidden-state rows row0 + r*step of the last forward
        (lm_head over every vocabulary chunk). Returns the logits buffer."""
        need = 4 * rows * self.V
        if need > self.max_binding:
            raise ValueError(f"{rows} logits rows need {need} bytes, over one binding's {self.max_binding}: "
                             f"ask for fewer rows at a time (alogits does)")
        if self._logits is None or self._logits.size < need:
            self._logits = self.dev.buffer(need, "logits")
        await linear_forward(self.dev, self._scratch.bufs["nrm"], self.head, self._logits, rows, self.C,
                             self.V, row0, step)
        return self._logits

    async def alogits(self, ids) -> list:
        """logits of every position of ids[T] (or ids[B, T]: rows b*T + t): a list of
        N rows, each an array('f') of V floats."""
        await self.forward(ids, head=False)
        N = self._last_n
        per = max(1, min(N, self.max_binding // (4 * self.V)))   # rows per lm_head pass
        out = []
        for r0 in range(0, N, per):
            rows = min(per, N - r0)
            buf = await self.head_rows(rows, r0)
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

    async def agenerate(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                        seed: int = 0, adapter=None) -> Generation:
        """Continue `prompt` (text, encoded with the tokenizer's BOS template; or a list
        of ids) by up to max_new_tokens tokens, stopping after an EOS. temperature 0 is
        greedy; otherwise nucleus sampling (top_p) with random.Random(seed) on the host.
        With `adapter` (see forward), the adapted model: the prompt once, then one token
        per step over the KV cache."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("generate: this model has no tokenizer; pass token ids")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("generate: empty prompt")
        S = len(ids) + max_new_tokens
        self.reset_cache(1, S)
        rng, eos, new = random.Random(seed), self.eos_ids(), []
        step_ids, pos, stopped = ids, 0, False
        for _ in range(max_new_tokens):
            buf, _rows = await self.forward(step_ids, pos, last_only=True, adapter=adapter)
            row = array.array("f")
            row.frombytes(await self.dev.read(buf, 0, 4 * self.V))
            tok = sample(row, temperature, top_p, rng)
            new.append(tok)
            pos += len(step_ids)
            step_ids = [tok]
            if tok in eos:
                stopped = True
                break
        text = self.tokenizer.decode(new, skip_special_tokens=True) if self.tokenizer is not None else ""
        return Generation(text, new, ids, stopped)

    # -- plain calls natively, awaitables in the browser ------------------------------
    def logits(self, ids):
        """`alogits` as a plain call natively; in Pyodide an awaitable."""
        return gpu.maybe_run(self.alogits(ids))

    def generate(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0):
        """`agenerate` as a plain call natively; in Pyodide an awaitable."""
        return gpu.maybe_run(self.agenerate(prompt, max_new_tokens, temperature, top_p, seed))


def load_model(src="demo", progress=None, device=None, max_binding: int | None = None):
    """`bitlora.load_model`: `Model.load` as a plain call natively (a Model); in Pyodide
    an awaitable."""
    return gpu.maybe_run(Model.load(src, progress, device, max_binding))


def sample(row, temperature: float, top_p: float, rng: random.Random) -> int:
    """A token from one logits row: argmax at temperature 0 (first maximum), else
    softmax(row / temperature) cut to the smallest set of top tokens whose
    probability reaches top_p (as HF's TopPLogitsWarper keeps), sampled with rng."""
    if temperature <= 0:
        return max(range(len(row)), key=row.__getitem__)
    import math
    m = max(row)
    p = [math.exp((v - m) / temperature) for v in row]
    z = sum(p)
    order = sorted(range(len(p)), key=p.__getitem__, reverse=True)
    keep, acc = [], 0.0
    for i in order:
        keep.append(i)
        acc += p[i] / z
        if acc >= top_p:
            break
    r = rng.random() * sum(p[i] for i in keep)
    for i in keep:
        r -= p[i]
        if r <= 0:
            return i
    return keep[-1]
