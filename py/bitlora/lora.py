"""LoRA adapters of a BitNet model: every adapter tensor in one flat parameter arena,
and the branch of one adapted projection, forward and backward. The layer loop is
the model's (model.Model.forward / backward call `apply` / `apply_backward`).

    lora = await Lora.create(model, cfg)        # PEFT's init from cfg.seed, or init=tensors
    lora.apply(li, "q_proj", x, y, u, N, stream)   # y += scale * B (A dropout(x))
    lora.apply_backward(li, "q_proj", dy, x, u, dx, du, N, stream)

Shape legend as in model.py. Per adapted projection W[O, I] with input x[N, I] (the
layer input *before* activation quantisation, as PEFT wraps the BitLinear module):
    y = BitLinear(x) + (alpha / R) * B (A dropout(x)),  A[R, I], B[O, R], u[N, R] = A dropout(x)
Backward: dB += scale dy^T u; du = scale dy B; dA += du^T dropout(x); dx += mask du A
(the A, B gradients are raw sums over the step's target tokens, in arena.grads).

Dropout masks come from a counter-based hash of (seed, layer, module, step,
micro-batch, element): forward and backward agree, and a resumed run repeats them.
(step, micro-batch) reach the GPU in a buffer, `stream` (`dropout_stream` gives its
value), so the recorded dispatches do not change from step to step.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

from .bitnet import MODULES
from .formats import peft as adapter_io
from .ops.lora import LoraShape, lora_backward, lora_forward
from .optim import ParamArena


class Lora:
    """The adapters of cfg.target_modules with rank cfg.lora_r on `model`: parameters,
    gradients and AdamW moments in `arena` (keys are PEFT's names)."""

    def __init__(self, model, cfg, arena: ParamArena, shapes: list):
        self.model, self.cfg, self.arena, self.shapes = model, cfg, arena, shapes
        self.dev = model.dev
        self.modules = tuple(m for m in MODULES if m in cfg.target_modules)
        self.R = cfg.lora_r
        self.scale = cfg.lora_alpha / cfg.lora_r
        self._parts = {}    # decode_parts' answers

    @classmethod
    async def create(cls, model, cfg, init: dict | None = None) -> "Lora":
        """Adapters for cfg.target_modules with rank cfg.lora_r: PEFT's init from cfg.seed,
        or `init` ({peft key: (shape, values)}, e.g. a loaded adapter)."""
        shapes = adapter_io.lora_shapes(model.config, cfg.target_modules, cfg.lora_r)
        if init is not None:
            adapter_io.check_tensors(init, shapes, "init adapter")
        tensors = init if init is not None else adapter_io.init_lora(shapes, cfg.seed)
        arena = ParamArena(model.dev, shapes, label="lora")
        for key, _ in shapes:
            arena.write(arena.params, key, tensors[key][1])
        await model.prepare(training=True, lora_r=cfg.lora_r)
        return cls(model, cfg, arena, shapes)

    def adapts(self, mod: str) -> bool:
        return mod in self.modules

    # -- one projection -------------------------------------------------------------
    def _ab(self, li: int, mod: str, buf) -> tuple:
        return (self.arena.view(buf, adapter_io.peft_key(li, mod, "A")),
                self.arena.view(buf, adapter_io.peft_key(li, mod, "B")))

    def _shape(self, li: int, mod: str, N: int, train: bool) -> LoraShape:
        p = self.model.layers[li].proj[mod]
        seed = (self.cfg.seed * 1000003 + li * 64 + MODULES.index(mod)) & 0xFFFFFFFF
        return LoraShape(N, p.I, p.O, self.R, self.scale, self.cfg.lora_dropout if train else 0.0, seed)

    @staticmethod
    def dropout_stream(step: int, micro: int) -> int:
        """The u32 a micro-batch's stream buffer holds: its masks' (step, micro) pair."""
        return (step * 4096 + micro) & 0xFFFFFFFF

    def apply(self, li: int, mod: str, x, y, u, N: int, train: bool, stream):
        """Record y[N, O] += scale * B (A dropout(x)) for projection `mod` of layer li,
        keeping u[N, R] = A dropout(x) for the backward. Dropout only when `train`, its
        mask drawn from stream[0] (a u32 buffer holding `dropout_stream(step, micro)`)."""
        A, B = self._ab(li, mod, self.arena.params)
        lora_forward(self.dev, self._shape(li, mod, N, train), x, A, B, u, y, stream)

    def apply_backward(self, li: int, mod: str, dy, x, u, dx, du, N: int, stream, accumulate: bool = True):
        """Record the branch's backward: dA, dB += (into arena.grads; = with accumulate
        False), dx[N, I] += its input gradient; du[N, R] is scratch. `stream` must be the
        forward's."""
        A, B = self._ab(li, mod, self.arena.params)
        dA, dB = self._ab(li, mod, self.arena.grads)
        lora_backward(self.dev, self._shape(li, mod, N, True), dy, x, A, B, u, dA, dB, du, stream, dx, accumulate)

    def decode_parts(self, li: int, mods) -> tuple:
        """For a one-token forward's fused branches (ops.lora.lora_down_parts and
        ops.matvec.ternary_matvec): the arena's params buffer and, per projection of
        `mods` of layer li, the float offsets (A, B) of its tensors there, or None where
        it is not adapted (worked out once per layer and group: a decoding step asks again)."""
        key = (li, tuple(mods))
        offs = self._parts.get(key)
        if offs is None:
            offs = self._parts[key] = []
            for mod in mods:
                if self.adapts(mod):
                    A, B = self._ab(li, mod, self.arena.params)
                    offs.append((A.offset // 4, B.offset // 4))
                else:
                    offs.append(None)
        return self.arena.params, offs

    # -- the whole adapter ------------------------------------------------------------
    async def read_adapter(self) -> dict:
        """{peft key: (shape, array('f'))} of the current parameters."""
        return self.adapter_from(await self.dev.read(self.arena.params))

    def adapter_from(self, raw: bytes) -> dict:
        """read_adapter's dict from the arena's params as raw f32 bytes (a snapshot)."""
        vals = self.arena.unpack(raw)
        return {key: (tuple(shape), vals[key]) for key, shape in self.shapes}

    async def load_state(self, params: dict, exp_avg: dict, exp_avg_sq: dict) -> None:
        """Restore parameters and AdamW moments ({peft key: (shape, values)})."""
        a = self.arena
        for key, _ in self.shapes:
            a.write(a.params, key, params[key][1])
            a.write(a.m, key, exp_avg[key][1])
            a.write(a.v, key, exp_avg_sq[key][1])
