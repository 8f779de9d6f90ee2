"""The optimizer on the GPU: one flat arena for every trainable tensor, the global
gradient norm, clipping, loss normalisation and AdamW, PyTorch-exact, no host round-trip.

    arena = ParamArena(dev, [("layers.0.q.lora_A", (R, C)), ...])   # p, g, m, v: f32[n]
    opt = AdamW(dev, arena, lr=3e-4, weight_decay=0.0, max_grad_norm=1.0)
    await opt.prepare()                        # compile its kernels (else the first step does)
    # ... the trainer adds raw per-token gradient sums into arena.grads ...
    res = await opt.step(num_target_tokens)    # one submit, returns at once
    ...                                        # record and submit the next step
    info = await res                           # {"norm", "clip", "step", "skipped", ...}

The fused step is sumsq_blocks -> sumsq_finish -> adamw_begin -> adamw:
1/num_target_tokens (the loss normalisation) and the clip factor are one multiplier
that AdamW reads from a GPU buffer; a NaN/Inf gradient skips the step on the GPU
(parameters and moments unchanged, `skipped` counts it), as AMP's GradScaler does.
The seed's separate operations (sum_squares into an accumulator, clip, scale,
adam_update) are methods too; the tests use them for the clipping gates.

Layout: tensor offsets are multiples of 64 floats (256 bytes, WebGPU's storage offset
alignment, so `arena.view(buf, name)` can bind one tensor), padding stays zero.
Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import array
import math
import struct
from dataclasses import dataclass

from .gpu import Buffer, BufferView, Device
from .ops import adamw as adamw_ops
from .ops import grad_norm as gn

ALIGN = 64          # floats: tensor offsets and the arena size are multiples of this

def auto_block4(n: int) -> int:
    """vec4s per sum-of-squares block: long blocks for big arenas (fewer partials, measured
    fastest for 2^27 floats on an H200), short ones for small arenas so that at least
    ~2048 workgroups share the pass."""
    for block4 in (16384, 4096, 1024):
        if n // 4 // block4 >= 2048:
            return block4
    return 256


@dataclass(frozen=True)
class Slot:
    """One tensor of the arena: elements [offset, offset + size) of each buffer."""
    name: str
    shape: tuple
    offset: int
    size: int


class ParamArena:
    """Flat f32 buffers params, grads, m, v [n] holding every trainable tensor,
    with the (name, shape, offset) table and the block layout grad_norm.wgsl needs."""

    def __init__(self, dev: Device, tensors: list, label: str = "arena", block4: int | None = None):
        self.dev = dev
        self.slots, self.n, self.block4, blocks, ranges = self.layout(tensors, block4)
        self.nb, self.nt = len(blocks) // 2, len(self.slots)
        self._by_name = {s.name: s for s in self.slots}
        limit = int(dev.limits.get("maxStorageBufferBindingSize", 1 << 27))
        if 4 * self.n > limit:
            raise ValueError(f"ParamArena: {self.n} floats need {4 * self.n} bytes per buffer; "
                             f"this device binds at most {limit} (maxStorageBufferBindingSize)")
        self.params = dev.buffer(4 * self.n, f"{label}.params")
        self.grads = dev.buffer(4 * self.n, f"{label}.grads")
        self.m = dev.buffer(4 * self.n, f"{label}.m")
        self.v = dev.buffer(4 * self.n, f"{label}.v")
        self.blocks = dev.buffer(4 * len(blocks), f"{label}.blocks", data=blocks)
        self.tensors = dev.buffer(max(8, 4 * len(ranges)), f"{label}.tensors", data=ranges or None)
        self.partial = dev.buffer(4 * self.nb, f"{label}.partial")

    @staticmethod
    def layout(tensors: list, block4: int | None = None) -> tuple:
        """(slots, n, block4, blocks, ranges) of an arena holding `tensors` [(name, shape)]:
        blocks are (start4, count4) u32 pairs of at most block4 vec4s, ranges each
        tensor's (first block, end block)."""
        slots, off = [], 0
        for name, shape in tensors:
            shape = tuple(int(d) for d in shape)
            size = math.prod(shape)
            slots.append(Slot(name, shape, off, size))
            off += -(-size // ALIGN) * ALIGN
        n = max(ALIGN, off)
        block4 = block4 or auto_block4(n)
        if block4 % 256:
            raise ValueError(f"block4 = {block4} must be a multiple of 256 (the workgroup size)")
        if len({s.name for s in slots}) != len(slots):
            raise ValueError("ParamArena: tensor names must be unique")
        blocks, ranges = array.array("I"), array.array("I")
        for s in slots:
            first = len(blocks) // 2
            start4, count4 = s.offset // 4, -(-s.size // 4)
            for b in range(0, count4, block4):
                blocks.extend((start4 + b, min(block4, count4 - b)))
            ranges.extend((first, len(blocks) // 2))
        if not blocks:   # no elements at all: one empty block keeps every binding valid
            blocks.extend((0, 0))
        return slots, n, block4, blocks, ranges

    @classmethod
    def plan(cls, tensors: list, block4: int | None = None) -> dict:
        """{buffer: bytes} an arena of `tensors` allocates (for memory estimates)."""
        _, n, _, blocks, ranges = cls.layout(tensors, block4)
        return {"params": 4 * n, "grads": 4 * n, "m": 4 * n, "v": 4 * n, "blocks": 4 * len(blocks),
                "tensors": max(8, 4 * len(ranges)), "partial": 4 * (len(blocks) // 2)}

    def slot(self, name: str) -> Slot:
        return self._by_name[name]

    def view(self, buf: Buffer, name: str) -> BufferView:
        """The bytes of tensor `name` in one of params/grads/m/v, for binding."""
        s = self._by_name[name]
        return buf.view(4 * s.offset, 4 * s.size)

    def write(self, buf: Buffer, name: str, values) -> None:
        """Upload tensor `name` (f32 bytes-like, or a sequence of floats)."""
        s = self._by_name[name]
        data = values if isinstance(values, (bytes, bytearray, memoryview, array.array)) else array.array("f", values)
        if memoryview(data).nbytes != 4 * s.size:
            raise ValueError(f"{name}: got {memoryview(data).nbytes} bytes, tensor {s.shape} needs {4 * s.size}")
        self.dev.write(buf, data, 4 * s.offset)

    async def read(self, buf: Buffer) -> dict:
        """{name: array('f')} for one of params/grads/m/v (a full round trip)."""
        return self.unpack(await self.dev.read(buf))

    def unpack(self, raw: bytes) -> dict:
        """{name: array('f')} from the bytes of one of params/grads/m/v."""
        flat = array.array("f")
        flat.frombytes(raw)
        return {s.name: flat[s.offset:s.offset + s.size] for s in self.slots}


class StepResult:
    """What `AdamW.step` reports, resolved after the GPU got there: `await res`."""

    def __init__(self, state_rb, tensor_rb=None, names=()):
        self._state_rb, self._tensor_rb, self._names = state_rb, tensor_rb, names
        self._value = None

    async def get(self) -> dict:
        if self._value is None:
            raw = await self._state_rb.get()
            sumsq, norm, clip, gmul, skip, skipped, step, step_size = struct.unpack_from("<4f3If", raw)
            self._value = {"norm": norm, "sumsq": sumsq, "clip": clip, "grad_multiplier": gmul,
                           "skipped_step": bool(skip), "skipped": skipped, "step": step}
            if self._tensor_rb is not None:
                t = array.array("f")
                t.frombytes(await self._tensor_rb.get())
                self._value["tensor_norms"] = {n: math.sqrt(max(x, 0.0)) if x == x else x
                                               for n, x in zip(self._names, t)}
        return self._value

    def __await__(self):
        return self.get().__await__()


class AdamW:
    """torch.optim.AdamW + clip_grad_norm_ over a ParamArena, on the GPU.
    Attributes (lr, betas, eps, weight_decay, max_grad_norm) may change between steps;
    `per_thread` (vec4s per invocation of the update kernel) changes speed only.
    `zero_grads` False: the fused step leaves the gradients as they are (a trainer whose
    first micro-batch of each step writes them, Model.train_micro(accumulate=False),
    saves 4 of AdamW's 32 bytes per parameter); the seed's adam_update zeroes them always."""

    def __init__(self, dev: Device, arena: ParamArena, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, max_grad_norm: float | None = 1.0,
                 per_thread: int = adamw_ops.PER_THREAD, zero_grads: bool = True):
        self.dev, self.arena, self.per_thread, self.zero_grads = dev, arena, per_thread, zero_grads
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay
        self.max_grad_norm = max_grad_norm
        self.state = dev.buffer(gn.STATE_BYTES, "optim.state")
        self.acc = dev.buffer(16, "optim.acc")
        self.tsumsq = dev.buffer(4 * max(1, arena.nt), "optim.tsumsq")
        self._prepared = False

    def kernel_specs(self) -> list:
        """The kernels this optimizer runs (sumsq_blocks for the arena's block length)."""
        return (gn.kernel_specs(self.arena.block4, self.dev.kind) + adamw_ops.kernel_specs(self.per_thread)
                + (adamw_ops.kernel_specs(self.per_thread, False)[1:] if not self.zero_grads else []))

    async def prepare(self) -> None:
        """Compile the optimizer's kernels (once per device; a no-op after that). The
        async methods below call it, so a step works without it; call it at setup to
        compile ahead with everything else."""
        if not self._prepared:
            await self.dev.prepare(self.kernel_specs())
            self._prepared = True

    @staticmethod
    def state_bytes(n_tensors: int) -> int:
        """Bytes of the buffers an AdamW allocates beside its arena."""
        return gn.STATE_BYTES + 16 + 4 * max(1, n_tensors)

    def _max_norm(self, max_norm) -> float:
        max_norm = self.max_grad_norm if max_norm is None else max_norm
        return 0.0 if max_norm is None or max_norm == math.inf else float(max_norm)

    # -- the fused step ---------------------------------------------------------
    async def record_step(self, num_target_tokens: int, per_tensor: bool = False) -> StepResult:
        """Record one whole optimizer step on the current encoder (no submit)."""
        if num_target_tokens <= 0:
            raise ValueError(f"num_target_tokens must be positive, got {num_target_tokens}")
        await self.prepare()
        a, dev = self.arena, self.dev
        scale = 1.0 / num_target_tokens
        gn.sumsq_blocks(dev, a.grads, a.blocks, a.partial, a.nb, scale, a.block4)
        gn.sumsq_finish(dev, a.partial, self.state, a.nb, scale, self._max_norm(None))
        tensor_rb = None
        if per_tensor:
            gn.sumsq_per_tensor(dev, a.partial, a.tensors, self.tsumsq, a.nt)
        adamw_ops.adamw_begin(dev, self.state, self.lr, self.betas, plain=False)
        adamw_ops.adamw(dev, a.params, a.grads, a.m, a.v, self.state, a.n, self.lr, self.betas,
                        self.eps, self.weight_decay, self.per_thread, self.zero_grads)
        if per_tensor:
            tensor_rb = dev.read_later(self.tsumsq, 0, 4 * a.nt)
        return StepResult(dev.read_later(self.state, 0, 32), tensor_rb, [s.name for s in a.slots])

    async def step(self, num_target_tokens: int, per_tensor: bool = False) -> StepResult:
        """Normalise by 1/num_target_tokens, clip the mean gradient's global norm, AdamW,
        zero the gradients (unless zero_grads is False): one submit. Returns at once;
        `await` the result for the pre-clip norm (of the mean gradient), the clip factor
        and the skip counter."""
        res = await self.record_step(num_target_tokens, per_tensor)
        self.dev.submit()
        return res

    def set_step(self, step: int, skipped: int = 0) -> None:
        """Set AdamW's step count t (and the skip counter), e.g. when resuming a run."""
        self.dev.write(self.state, struct.pack("<II", int(skipped), int(step)), 20)

    # -- the seed's separate operations (record only; tests compose them) -------
    def zero_accumulator(self) -> None:
        self.dev.write(self.acc, bytes(16))

    async def sum_squares(self, scale: float = 1.0) -> None:
        """acc += sum over the arena of (scale * g)^2."""
        await self.prepare()
        a = self.arena
        gn.sumsq_blocks(self.dev, a.grads, a.blocks, a.partial, a.nb, scale, a.block4)
        gn.sumsq_accumulate(self.dev, a.partial, self.acc, a.nb)

    async def clip(self, max_norm: float | None = None) -> None:
        """g *= min(1, max_norm / (sqrt(acc) + 1e-6)), the factor computed on the GPU."""
        await self.prepare()
        gn.clip_from_acc(self.dev, self.acc, self.state, self._max_norm(max_norm))
        gn.scale_by_clip(self.dev, self.arena.grads, self.state, self.arena.n)

    async def scale(self, factor: float) -> None:
        """g *= factor (e.g. 1/num_target_tokens)."""
        await self.prepare()
        gn.scale_const(self.dev, self.arena.grads, self.arena.n, factor)

    async def adam_update(self) -> None:
        """AdamW on the gradients as they are (multiplier 1), then zero them."""
        await self.prepare()
        a = self.arena
        adamw_ops.adamw_begin(self.dev, self.state, self.lr, self.betas, plain=True)
        adamw_ops.adamw(self.dev, a.params, a.grads, a.m, a.v, self.state, a.n, self.lr, self.betas,
                        self.eps, self.weight_decay, self.per_thread)

    async def read_state(self) -> dict:
        """The state buffer now (submits and waits): norm, clip, step, skipped..."""
        return await StepResult(self.dev.read_later(self.state, 0, 32)).get()
