"""Wrappers for shaders/grad_norm.wgsl: global gradient norm, clip factor, in-place
gradient scaling over the flat gradient arena. They check sizes, fill the uniform and
record a dispatch; the math is in the WGSL file (its header says what each entry does)
and the layout (blocks, tensors) comes from bitlora.optim.ParamArena.

Shapes: g[n] f32 (n a multiple of 64), blocks[nb] and tensors[nt] as u32 pairs,
partial[nb] f32, tsumsq[nt] f32, acc[1] f32, state: 16 words (see the shader header).
"""
from __future__ import annotations

import struct

from ..gpu import Buffer, Device

SHADER = "grad_norm.wgsl"
STATE_BYTES = 64


def _need(buf: Buffer, nbytes: int, what: str) -> None:
    if buf.size < nbytes:
        raise ValueError(f"grad_norm: {what} holds {buf.size} bytes, needs {nbytes}")


async def sumsq_blocks(dev: Device, g: Buffer, blocks: Buffer, partial: Buffer, nb: int, scale: float,
                       block4: int = 4096) -> None:
    """Record partial[b] = sum over block b of (scale * g)^2, one workgroup per block;
    full blocks are `block4` vec4s long (the arena's layout)."""
    _need(blocks, 8 * nb, "blocks")
    _need(partial, 4 * nb, "partial")
    k = await dev.kernel(SHADER, "sumsq_blocks", constants={"BLOCK4": block4})
    dev.dispatch(k, [g, blocks.view(0, 8 * nb), partial], groups=nb, params=struct.pack("<f", scale))


async def sumsq_finish(dev: Device, partial: Buffer, state: Buffer, nb: int, scale: float, max_norm: float) -> None:
    """Record the final reduce: state.sumsq/norm/clip/gmul/skip (one workgroup)."""
    _need(partial, 4 * nb, "partial")
    _need(state, STATE_BYTES, "state")
    k = await dev.kernel(SHADER, "sumsq_finish")
    dev.dispatch(k, [partial, state.view(0, STATE_BYTES)], groups=1,
                 params=struct.pack("<Iff", nb, scale, max_norm))


async def sumsq_per_tensor(dev: Device, partial: Buffer, tensors: Buffer, tsumsq: Buffer, nt: int) -> None:
    """Record tsumsq[t] = sum of the block partials of tensor t (logging only)."""
    _need(tensors, 8 * nt, "tensors")
    _need(tsumsq, 4 * nt, "tsumsq")
    k = await dev.kernel(SHADER, "sumsq_per_tensor")
    dev.dispatch(k, [partial, tensors, tsumsq], groups=nt, params=struct.pack("<I", nt))


async def sumsq_accumulate(dev: Device, partial: Buffer, acc: Buffer, nb: int) -> None:
    """Record acc[0] += sum of partial[nb] (the seed's accumulator; one workgroup)."""
    _need(partial, 4 * nb, "partial")
    k = await dev.kernel(SHADER, "sumsq_accumulate")
    dev.dispatch(k, [partial, acc.view(0, 4)], groups=1, params=struct.pack("<I", nb))


async def clip_from_acc(dev: Device, acc: Buffer, state: Buffer, max_norm: float) -> None:
    """Record state.norm = sqrt(acc[0]), state.clip = min(1, max_norm / (norm + 1e-6))."""
    _need(state, STATE_BYTES, "state")
    k = await dev.kernel(SHADER, "clip_from_acc")
    dev.dispatch(k, [acc.view(0, 4), state.view(0, STATE_BYTES)], groups=1, params=struct.pack("<f", max_norm))


async def scale_const(dev: Device, g: Buffer, n: int, factor: float) -> None:
    """Record g[n] *= factor (n a multiple of 4)."""
    if n % 4:
        raise ValueError(f"scale_const: n = {n} is not a multiple of 4")
    _need(g, 4 * n, "g")
    k = await dev.kernel(SHADER, "scale_const")
    dev.dispatch(k, [g.view(0, 4 * n)], groups=-(-n // 1024), params=struct.pack("<fI", factor, n // 4))


async def scale_by_clip(dev: Device, g: Buffer, state: Buffer, n: int) -> None:
    """Record g[n] *= state.clip, the factor computed on the GPU."""
    if n % 4:
        raise ValueError(f"scale_by_clip: n = {n} is not a multiple of 4")
    _need(g, 4 * n, "g")
    k = await dev.kernel(SHADER, "scale_by_clip")
    dev.dispatch(k, [g.view(0, 4 * n), state.view(0, STATE_BYTES)], groups=-(-n // 1024),
                 params=struct.pack("<I", n // 4))
