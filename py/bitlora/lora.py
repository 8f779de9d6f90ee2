"""LoRA on a BitNet model: the adapter parameters in one flat arena, the training
forward (all positions at once, activations kept) and the exact backward from the
masked cross-entropy to every LoRA parameter through the frozen network.

    lm = await LoraModel.create(model, cfg)            # PEFT init, or init=tensors
    lm.begin_step()
    await lm.accumulate(micro_batch, seed, step, micro)   # forward + loss + backward
    ... AdamW(dev, lm.arena).step(n_targets) ...

Shape legend as in model.py: B, T, N = B*T, C, H, Hkv, D, F, V, L, R.

Per adapted projection W[O, I] with input x[N, I] (the layer input *before*
activation quantisation, as PEFT wraps the BitLinear module):
    y = BitLinear(x) + (alpha / R) * B (A dropout(x)),  A[R, I], B[O, R]
Gradients: the frozen BitLinear passes dx = dy Wq (straight-through at both
quantisers, HF's AutoBitLinear); ops/lora.py gives dA, dB (accumulated into the
arena's gradients as raw sums over target tokens) and the LoRA branch's dx.

The backward, per layer in reverse (dh: gradient of the layer's output):
    FFN:  d_fn = down^T dh (+LoRA down);  d_hf = ffn_sub_norm^T;  dg, du = relu2^T
          dn2 = gate^T dg + up^T du (+LoRA gate, up);  dh += post_attention_layernorm^T dn2
    attn: d_an = o^T dh (+LoRA o);  d_att = attn_sub_norm^T;  dq, dk, dv = attention^T
          dq, dk = rope^T;  dn1 = q^T dq + k^T dk + v^T dv (+LoRA q, k, v)
          dh += input_layernorm^T dn1
and before the layers, the head: dlogits = softmax - onehot on target rows (masked
rows 0); dxf = lm_head^T dlogits; dh = norm^T dxf.

Dropout masks come from a counter-based hash of (seed, layer, module, step,
micro-batch, element): forward and backward agree, and a resumed run repeats them.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import array

from .bitnet import FULL, MODULES
from .formats import peft as adapter_io
from .gpu import BufferView
from .ops import backward as bw
from .ops import cross_entropy as ce
from .ops.attention import attention_forward
from .ops.bitlinear import actquant_forward, bitlinear_forward
from .ops.embedding import embedding_forward
from .ops.ffn import relu2_gating_forward
from .ops.lm_head import linear_forward
from .ops.lora import LoraShape, lora_backward, lora_forward
from .ops.rmsnorm import rmsnorm_forward
from .ops.rope import rope_forward
from .optim import ParamArena


class _Acts:
    """One layer's saved activations for N rows."""
    NAMES = ("h_in", "n1", "rstd1", "q", "k", "v", "att", "lse", "an", "rstd_a", "h_mid",
             "n2", "rstd2", "g", "u", "hf", "fn", "rstd_f")

    def __init__(self, dev, m, N: int, li: int, lora_u: dict):
        C, F, H, KV = m.C, m.F, m.H, m.Hkv * m.D
        sizes = dict(h_in=N * C, n1=N * C, rstd1=N, q=N * C, k=N * KV, v=N * KV, att=N * C, lse=N * H,
                     an=N * C, rstd_a=N, h_mid=N * C, n2=N * C, rstd2=N, g=N * F, u=N * F, hf=N * F,
                     fn=N * F, rstd_f=N)
        for name, n in sizes.items():
            setattr(self, name, dev.buffer(4 * n, f"L{li}.{name}"))
        self.lora_u = {mod: dev.buffer(4 * N * r, f"L{li}.{mod}.u") for mod, r in lora_u.items()}


class _Workspace:
    """Activations of every layer plus head and gradient scratch, for up to N rows."""

    def __init__(self, dev, m, N: int, R: int, modules):
        C, F, V, H, KV = m.C, m.F, m.V, m.H, m.Hkv * m.D
        self.N = N
        self.layers = [_Acts(dev, m, N, li, {mod: R for mod in modules}) for li in range(m.L)]
        b = lambda n, name: dev.buffer(4 * n, name)  # noqa: E731
        self._dev = dev
        self._io: dict = {}      # micro-batch index -> (ids[N], targets[N])
        self.h_out, self.xf, self.rstd_out = b(N * C, "h_out"), b(N * C, "xf"), b(N, "rstd_out")
        self.logits, self.losses = b(N * V, "logits"), b(N, "losses")
        self.xq, self.s = b(N * max(C, F), "xq"), b(N, "s")
        # gradient scratch
        self.dh, self.dxf = b(N * C, "dh"), b(N * C, "dxf")
        self.d_fn, self.d_hf, self.dg, self.du = b(N * F, "d_fn"), b(N * F, "d_hf"), b(N * F, "dg"), b(N * F, "du")
        self.dn, self.d_an, self.d_att = b(N * C, "dn"), b(N * C, "d_an"), b(N * C, "d_att")
        self.dq, self.dk, self.dv = b(N * C, "dq"), b(N * KV, "dk"), b(N * KV, "dv")
        self.stats, self.du_lora = b(N * H * 2, "stats"), b(N * R, "du_lora")

    def io(self, micro: int) -> tuple:
        """ids[N] and targets[N] for micro-batch `micro` of a step. Every micro-batch of a
        step is recorded into one submit, and queued writes all land before it runs, so
        each micro-batch needs buffers of its own."""
        if micro not in self._io:
            self._io[micro] = (self._dev.buffer(4 * self.N, f"ids{micro}"),
                               self._dev.buffer(4 * self.N, f"targets{micro}"))
        return self._io[micro]


class LoraModel:
    """LoRA adapters on `model` (a bitlora.model.Model) with forward/backward for training."""

    def __init__(self, model, cfg, arena: ParamArena, shapes: list):
        self.model, self.cfg, self.arena, self.shapes = model, cfg, arena, shapes
        self.dev = model.dev
        self.modules = [m for m in MODULES if m in cfg.target_modules]
        self.R = cfg.lora_r
        self.scale = cfg.lora_alpha / cfg.lora_r
        self.loss_sum = self.dev.buffer(4, "loss_sum")
        self._ws: _Workspace | None = None
        self._u_infer = None      # u[N, R] scratch of `add` (generation)

    @classmethod
    async def create(cls, model, cfg, init: dict | None = None) -> "LoraModel":
        """Adapters for cfg.target_modules with rank cfg.lora_r: PEFT's init from cfg.seed,
        or `init` ({peft key: (shape, values)}, e.g. a loaded adapter)."""
        shapes = adapter_io.lora_shapes(model.config, cfg.target_modules, cfg.lora_r)
        if init is not None:
            adapter_io.check_tensors(init, shapes, "init adapter")
        tensors = init if init is not None else adapter_io.init_lora(shapes, cfg.seed)
        arena = ParamArena(model.dev, shapes, label="lora")
        for key, _ in shapes:
            arena.write(arena.params, key, tensors[key][1])
        return cls(model, cfg, arena, shapes)

    # -- arena access ----------------------------------------------------------------
    def _ab(self, li: int, mod: str, buf) -> tuple:
        return (self.arena.view(buf, adapter_io.peft_key(li, mod, "A")),
                self.arena.view(buf, adapter_io.peft_key(li, mod, "B")))

    async def read_adapter(self) -> dict:
        """{peft key: (shape, array('f'))} of the current parameters."""
        vals = await self.arena.read(self.arena.params)
        return {key: (tuple(shape), vals[key]) for key, shape in self.shapes}

    async def load_state(self, params: dict, exp_avg: dict, exp_avg_sq: dict) -> None:
        """Restore parameters and AdamW moments ({peft key: (shape, values)})."""
        a = self.arena
        for key, _ in self.shapes:
            a.write(a.params, key, params[key][1])
            a.write(a.m, key, exp_avg[key][1])
            a.write(a.v, key, exp_avg_sq[key][1])

    # -- one micro-batch ---------------------------------------------------------------
    def begin_step(self) -> None:
        """Zero the step's loss accumulator (gradients are zeroed by AdamW after use)."""
        self.dev.clear(self.loss_sum)

    def _workspace(self, N: int) -> _Workspace:
        if self._ws is None or self._ws.N < N:
            self._ws = _Workspace(self.dev, self.model, N, self.R, self.modules)
        return self._ws

    def _shape(self, li: int, mod: str, N: int, I: int, O: int, step: int, micro: int, train: bool) -> LoraShape:
        seed = (self.cfg.seed * 1000003 + li * 64 + MODULES.index(mod)) & 0xFFFFFFFF
        return LoraShape(N, I, O, self.R, self.scale, self.cfg.lora_dropout if train else 0.0,
                         seed, (step * 4096 + micro) & 0xFFFFFFFF)

    async def forward(self, ids: list, B: int, T: int, step: int = 0, micro: int = 0,
                      train: bool = True) -> _Workspace:
        """Record the forward of ids[B*T] with the adapters; logits land in ws.logits[N, V]."""
        m, dev = self.model, self.dev
        N = B * T
        ws = self._workspace(N)
        C, F, H, Hkv, D, eps = m.C, m.F, m.H, m.Hkv, m.D, m.eps
        ids_buf = ws.io(micro)[0]
        dev.write(ids_buf, array.array("I", ids))
        await embedding_forward(dev, ids_buf, m.embed, ws.layers[0].h_in, N, C)
        for li, lay in enumerate(m.layers):
            a = ws.layers[li]
            out = ws.layers[li + 1].h_in if li + 1 < m.L else ws.h_out
            P, W = lay.proj, lay.norms

            async def proj(mod, x, width, y, accumulate=False):
                p = P[FULL[mod]]
                await bitlinear_forward(dev, ws.xq, ws.s, p.buf, p.scale, y, N, p.I, p.O, accumulate)
                if mod in self.modules:
                    A, Bm = self._ab(li, mod, self.arena.params)
                    await lora_forward(dev, self._shape(li, mod, N, p.I, p.O, step, micro, train),
                                       x, A, Bm, a.lora_u[mod], y)

            await rmsnorm_forward(dev, a.h_in, W["input_layernorm"], a.n1, a.rstd1, N, C, eps)
            await actquant_forward(dev, a.n1, ws.xq, ws.s, N, C)
            await proj("q_proj", a.n1, C, a.q)
            await proj("k_proj", a.n1, C, a.k)
            await proj("v_proj", a.n1, C, a.v)
            await rope_forward(dev, a.q, m.cos, m.sin, N, T, H, D)
            await rope_forward(dev, a.k, m.cos, m.sin, N, T, Hkv, D)
            await attention_forward(dev, a.q, a.k, a.v, a.att, a.lse, B, T, H, Hkv, D, T, 0)
            await rmsnorm_forward(dev, a.att, W["self_attn.attn_sub_norm"], a.an, a.rstd_a, N, C, eps)
            await actquant_forward(dev, a.an, ws.xq, ws.s, N, C)
            dev.copy(a.h_in, a.h_mid, 4 * N * C)
            await proj("o_proj", a.an, C, a.h_mid, accumulate=True)
            await rmsnorm_forward(dev, a.h_mid, W["post_attention_layernorm"], a.n2, a.rstd2, N, C, eps)
            await actquant_forward(dev, a.n2, ws.xq, ws.s, N, C)
            await proj("gate_proj", a.n2, C, a.g)
            await proj("up_proj", a.n2, C, a.u)
            await relu2_gating_forward(dev, a.g, a.u, a.hf, N * F)
            await rmsnorm_forward(dev, a.hf, W["mlp.ffn_sub_norm"], a.fn, a.rstd_f, N, F, eps)
            await actquant_forward(dev, a.fn, ws.xq, ws.s, N, F)
            dev.copy(a.h_mid, out, 4 * N * C)
            await proj("down_proj", a.fn, F, out, accumulate=True)
        await rmsnorm_forward(dev, ws.h_out, m.norm, ws.xf, ws.rstd_out, N, C, eps)
        await linear_forward(dev, ws.xf, m.head, ws.logits, N, C, m.V)
        return ws

    async def accumulate(self, mb, seed: int = 0, step: int = 0, micro: int = 0) -> None:
        """Forward + masked cross-entropy + backward of one micro-batch: adds the summed
        loss into loss_sum and the raw gradient sums into arena.grads (no submit)."""
        m, dev = self.model, self.dev
        B, T = mb.B, mb.T
        N = B * T
        ws = await self.forward(mb.ids, B, T, step, micro, train=True)
        targets = ws.io(micro)[1]
        dev.write(targets, array.array("i", mb.targets))
        await ce.cross_entropy_forward_backward(dev, ws.logits, targets, ws.losses, N, m.V, 1.0)
        await ce.cross_entropy_sum(dev, ws.losses, self.loss_sum, N)
        await self.backward(ws, B, T, step, micro)

    async def backward(self, ws: _Workspace, B: int, T: int, step: int, micro: int) -> None:
        """Record the backward from ws.logits (holding dlogits) to every LoRA gradient."""
        m, dev = self.model, self.dev
        N = B * T
        C, F, H, Hkv, D = m.C, m.F, m.H, m.Hkv, m.D
        # head: dxf = dlogits E (vocabulary chunks), dh = norm^T dxf
        for ci, (v0, rows, w) in enumerate(m.head):
            dy = ws.logits if v0 == 0 else BufferView(ws.logits, 4 * v0, ws.logits.size - 4 * v0)
            await bw.linear_backward_input(dev, dy, w, ws.dxf, N, C, rows, accumulate=ci > 0, ld_dy=m.V,
                                           w_dtype=m.head.dtype)
        await bw.rmsnorm_backward(dev, ws.dxf, ws.h_out, m.norm, ws.rstd_out, ws.dh, N, C)
        grads = self.arena.grads
        for li in range(m.L - 1, -1, -1):
            a, lay = ws.layers[li], m.layers[li]
            P, W = lay.proj, lay.norms

            async def proj_back(mod, dy, x, dx, accumulate):
                p = P[FULL[mod]]
                await bw.bitlinear_backward_input(dev, dy, p.buf, p.scale, dx, N, p.I, p.O, accumulate)
                if mod in self.modules:
                    A, Bm = self._ab(li, mod, self.arena.params)
                    dA, dB = self._ab(li, mod, grads)
                    await lora_backward(dev, self._shape(li, mod, N, p.I, p.O, step, micro, True),
                                        dy, x, A, Bm, a.lora_u[mod], dA, dB, ws.du_lora, dx)

            # FFN
            await proj_back("down_proj", ws.dh, a.fn, ws.d_fn, False)
            await bw.rmsnorm_backward(dev, ws.d_fn, a.hf, W["mlp.ffn_sub_norm"], a.rstd_f, ws.d_hf, N, F)
            await bw.relu2_gating_backward(dev, ws.d_hf, a.g, a.u, ws.dg, ws.du, N * F)
            await proj_back("gate_proj", ws.dg, a.n2, ws.dn, False)
            await proj_back("up_proj", ws.du, a.n2, ws.dn, True)
            await bw.rmsnorm_backward(dev, ws.dn, a.h_mid, W["post_attention_layernorm"], a.rstd2, ws.dh, N, C,
                                      accumulate=True)
            # attention
            await proj_back("o_proj", ws.dh, a.an, ws.d_an, False)
            await bw.rmsnorm_backward(dev, ws.d_an, a.att, W["self_attn.attn_sub_norm"], a.rstd_a, ws.d_att, N, C)
            await bw.attention_backward(dev, ws.d_att, a.q, a.k, a.v, ws.dq, ws.dk, ws.dv, ws.stats, B, T, H, Hkv, D)
            await bw.rope_backward(dev, ws.dq, m.cos, m.sin, N, T, H, D)
            await bw.rope_backward(dev, ws.dk, m.cos, m.sin, N, T, Hkv, D)
            await proj_back("q_proj", ws.dq, a.n1, ws.dn, False)
            await proj_back("k_proj", ws.dk, a.n1, ws.dn, True)
            await proj_back("v_proj", ws.dv, a.n1, ws.dn, True)
            await bw.rmsnorm_backward(dev, ws.dn, a.h_in, W["input_layernorm"], a.rstd1, ws.dh, N, C,
                                      accumulate=True)

    # -- inference with the adapter ------------------------------------------------------
    async def alogits(self, ids: list) -> list:
        """Logits[T][V] of one sequence with the adapter applied (no dropout)."""
        V = self.model.V
        ws = await self.forward(list(ids), 1, len(ids), train=False)
        flat = array.array("f")
        flat.frombytes(await self.dev.read(ws.logits, 0, 4 * len(ids) * V))
        return [flat[t * V:(t + 1) * V] for t in range(len(ids))]

    async def add(self, li: int, name: str, x, y, N: int) -> None:
        """Model.forward's adapter hook (inference): y[N, O] += scale * B (A x) when the
        projection `name` of layer li is adapted; no dropout."""
        mod = name.rsplit(".", 1)[-1]
        if mod not in self.modules:
            return
        p = self.model.layers[li].proj[name]
        if self._u_infer is None or self._u_infer.size < 4 * N * self.R:
            self._u_infer = self.dev.buffer(4 * N * self.R, "lora.u_infer")
        A, Bm = self._ab(li, mod, self.arena.params)
        await lora_forward(self.dev, LoraShape(N, p.I, p.O, self.R, self.scale), x, A, Bm, self._u_infer, y)

    async def agenerate(self, prompt, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                        seed: int = 0):
        """Generation with the adapter: the model's own KV-cached loop, the LoRA branches
        added by `add` (one token per step after the prompt)."""
        return await self.model.agenerate(prompt, max_new_tokens, temperature, top_p, seed, adapter=self)

