"""Wrappers for shaders/grad_norm.wgsl: global gradient norm, clip factor, in-place
gradient scaling over the flat gradient arena. They check sizes, pack the uniform and
record a dispatch; the math is in the WGSL file (its header says what each entry does)
and the layout (blocks, tensors) comes from bitlora.optim.ParamArena.

Shapes: g[n] f32 (n a multiple of 64), blocks[nb] and tensors[nt] as u32 pairs,
partial[nb] f32, tsumsq[nt] f32, acc[1] f32, state: 16 words (shaders/prelude.wgsl).
"""
from __future__ import annotations

from ._check import need
from ._uniform import Uniform

SHADER = "grad_norm.wgsl"
STATE_BYTES = 64
BLOCKS = Uniform("SumsqBlocksParams", "scale:f32")
FINISH = Uniform("SumsqFinishParams", "nb:u32 scale:f32 max_norm:f32")
PER_TENSOR = Uniform("SumsqTensorParams", "nt:u32")
ACCUMULATE = Uniform("SumsqAccParams", "nb:u32")
CLIP = Uniform("ClipParams", "max_norm:f32")
SCALE = Uniform("ScaleParams", "factor:f32 n4:u32")
SCALE_CLIP = Uniform("ScaleClipParams", "n4:u32")


GC = 8  # blocks (invocations) per workgroup of sumsq_blocks_cpu (grad_norm.wgsl GC)


def kernel_specs(block4: int = 4096, kind: str | None = None) -> list:
    """Every kernel of this file; sumsq_blocks for blocks of `block4` vec4s (ParamArena.block4);
    the first two passes' CPU variants unless kind is "gpu"."""
    return [(SHADER, "sumsq_blocks", {"BLOCK4": block4})] + [
        (SHADER, e) for e in ("sumsq_finish", "sumsq_per_tensor", "sumsq_accumulate", "clip_from_acc",
                              "scale_const", "scale_by_clip")
        + (() if kind == "gpu" else ("sumsq_blocks_cpu", "sumsq_finish_cpu"))]


def sumsq_blocks(dev, g, blocks, partial, nb: int, scale: float, block4: int = 4096) -> None:
    """Record partial[b] = sum over block b of (scale * g)^2, one workgroup per block (on a
    CPU, dev.kind, one invocation per block: sumsq_blocks_cpu); full blocks are `block4`
    vec4s long (the arena's layout)."""
    need(blocks, 2 * nb, "blocks", "sumsq_blocks")
    need(partial, nb, "partial", "sumsq_blocks")
    cpu = dev.kind == "cpu"
    k = dev.prepared(SHADER, "sumsq_blocks_cpu") if cpu else dev.prepared(SHADER, "sumsq_blocks", {"BLOCK4": block4})
    dev.dispatch(k, [g, blocks.view(0, 8 * nb), partial], groups=-(-nb // GC) if cpu else nb,
                 params=BLOCKS.pack(scale))


def sumsq_finish(dev, partial, state, nb: int, scale: float, max_norm: float) -> None:
    """Record the final reduce: state.sumsq/norm/clip/gmul/skip (one workgroup; on a CPU
    one invocation, sumsq_finish_cpu)."""
    need(partial, nb, "partial", "sumsq_finish")
    need(state, STATE_BYTES // 4, "state", "sumsq_finish")
    entry = "sumsq_finish_cpu" if dev.kind == "cpu" else "sumsq_finish"
    dev.dispatch(dev.prepared(SHADER, entry), [partial, state.view(0, STATE_BYTES)], groups=1,
                 params=FINISH.pack(nb, scale, max_norm))


def sumsq_per_tensor(dev, partial, tensors, tsumsq, nt: int) -> None:
    """Record tsumsq[t] = sum of the block partials of tensor t (logging only)."""
    need(tensors, 2 * nt, "tensors", "sumsq_per_tensor")
    need(tsumsq, nt, "tsumsq", "sumsq_per_tensor")
    dev.dispatch(dev.prepared(SHADER, "sumsq_per_tensor"), [partial, tensors, tsumsq], groups=nt,
                 params=PER_TENSOR.pack(nt))


def sumsq_accumulate(dev, partial, acc, nb: int) -> None:
    """Record acc[0] += sum of partial[nb] (the seed's accumulator; one workgroup)."""
    need(partial, nb, "partial", "sumsq_accumulate")
    dev.dispatch(dev.prepared(SHADER, "sumsq_accumulate"), [partial, acc.view(0, 4)], groups=1,
                 params=ACCUMULATE.pack(nb))


def clip_from_acc(dev, acc, state, max_norm: float) -> None:
    """Record state.norm = sqrt(acc[0]), state.clip = min(1, max_norm / (norm + 1e-6))."""
    need(state, STATE_BYTES // 4, "state", "clip_from_acc")
    dev.dispatch(dev.prepared(SHADER, "clip_from_acc"), [acc.view(0, 4), state.view(0, STATE_BYTES)], groups=1,
                 params=CLIP.pack(max_norm))


def scale_const(dev, g, n: int, factor: float) -> None:
    """Record g[n] *= factor (n a multiple of 4)."""
    if n % 4:
        raise ValueError(f"scale_const: n = {n} is not a multiple of 4")
    need(g, n, "g", "scale_const")
    dev.dispatch(dev.prepared(SHADER, "scale_const"), [g.view(0, 4 * n)], groups=-(-n // 1024),
                 params=SCALE.pack(factor, n // 4))


def scale_by_clip(dev, g, state, n: int) -> None:
    """Record g[n] *= state.clip, the factor computed on the GPU."""
    if n % 4:
        raise ValueError(f"scale_by_clip: n = {n} is not a multiple of 4")
    need(g, n, "g", "scale_by_clip")
    dev.dispatch(dev.prepared(SHADER, "scale_by_clip"), [g.view(0, 4 * n), state.view(0, STATE_BYTES)],
                 groups=-(-n // 1024), params=SCALE_CLIP.pack(n // 4))
