"""bitlora.ops: one module per kernel family, each wrapping its file in shaders/.

An op is a plain synchronous function `op(dev, ...)` that checks sizes, packs its
uniform (declared once, as a `Uniform`) and records a dispatch on the device's
encoder. It compiles nothing: the kernels are prepared beforehand, once,

    await dev.prepare(ops.kernel_specs(table_dtype, training=True))

and an op whose kernel was not prepared raises GPUError naming it. The optimizer's
kernels (grad_norm, adamw) depend on the arena's layout: optim.AdamW prepares them.
Browser-safe: standard library + bitlora only.
"""
from __future__ import annotations

from . import (attention, bitlinear, cross_entropy, embedding, linear, lora, matvec, relu2, rmsnorm, rope, sample,
               splitk)

MODEL_FAMILIES = (embedding, rmsnorm, bitlinear, splitk, rope, attention, relu2, linear, lora, cross_entropy,
                  matvec, sample)


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 int8: bool = False, shapes: dict | None = None) -> list:
    """The (shader, entry[, constants]) of every kernel a model runs: its forward for
    logits and decoding (LoRA's forward included) and, with `training`, the loss and
    every backward pass. `table_dtype` is the embedding / lm_head table's ("f32" or
    "bf16": model.RowTable.dtype); `kind` the device's ("gpu" or "cpu": Device.kind)
    where a family has variants per kind, None for both; `int8` the device's
    Device.int8_dot (the GPU forward's int8 kernels compile only where it is true).
    `shapes` (Model.kernel_shapes: the widths C, F, D, V, KV, the gating, the LoRA rank R or
    None, the adapter, whether the weights are kept transposed) leaves out, on kind "cpu",
    the variants a model of those shapes never picks (a CPU compiles each pipeline slowly:
    the page waits for it)."""
    specs = []
    extra = bitlinear.int8_specs() if int8 and kind != "cpu" else []
    shapes = shapes if kind == "cpu" else None
    for spec in [s for family in MODEL_FAMILIES for s in family.kernel_specs(table_dtype, training, kind, shapes)] + extra:
        if spec not in specs:
            specs.append(spec)
    return specs

