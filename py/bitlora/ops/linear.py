"""Wrappers for shaders/linear.wgsl: the dense output head y = x W^T over a weight kept
in row chunks, and its input gradient. W is f32 or bf16 (the table as stored). They
check sizes, pack the uniform and record dispatches; the math is in the shader header.
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from . import splitk
from ._check import need
from .matvec import spare
from ._uniform import Uniform

SHADER = "linear.wgsl"
FORWARD = Uniform("LinearParams", "n:u32 i:u32 oc:u32 ld_y:u32 v0:u32 x_row0:u32 x_step:u32")
BACKWARD = Uniform("LinearBackwardParams", "n:u32 i:u32 o:u32 scale:f32 accumulate:u32 ld_dy:u32 ko:u32 split:u32")
ROWS_KERNEL_MAX_N = 8  # up to this many rows (decoding) the 8-row kernel wastes less than 64 x 64 tiles


def _constants(w_dtype: str) -> dict | None:
    if w_dtype not in ("f32", "bf16"):
        raise ValueError(f"linear: weight dtype {w_dtype!r} is not f32 or bf16")
    return {"LN_BF16": 1.0} if w_dtype == "bf16" else None


CPU_WG = 8      # CPU variants (Device.kind "cpu"): invocations per workgroup (shaders/linear.wgsl)
CPU_TILE = 32   # ... the forward's 8 rows x 32 outputs (I % 4 == 0, else the rows kernel)
CPU_BWD_TILE = 16   # ... the input gradient's 8 rows x 16 input columns


def cpu_groups(N: int, cols: int) -> int:
    """Workgroups of linear_forward_cpu over N rows and `cols` outputs."""
    return -(-(-(-N // 8) * -(-cols // CPU_TILE)) // CPU_WG)


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    c = _constants(table_dtype)
    entries = ["linear_forward_rows"]
    if kind in (None, "gpu"):
        entries += ["linear_forward"] + (["linear_backward_input"] if training else [])
    cpu_bwd = []
    if kind in (None, "cpu"):
        entries += ["linear_forward_cpu"]
        if training:   # LN_QUADS for I % 4 == 0 (with `shapes` whose C is such, only that one)
            quads = [True] if shapes is not None and shapes["C"] % 4 == 0 else [True, False]
            cpu_bwd = [(SHADER, "linear_backward_input_cpu", _cpu_backward_constants(table_dtype, q)) for q in quads]
    return [(SHADER, e, c) for e in entries] + cpu_bwd + (splitk.kernel_specs() if training and kind != "cpu" else [])


def _cpu_backward_constants(w_dtype: str, quads: bool) -> dict:
    """linear_backward_input_cpu's override constants: the dtype's, and LN_QUADS (I % 4 == 0)."""
    return {**(_constants(w_dtype) or {}), "LN_QUADS": 1.0 if quads else 0.0}


# linear_backward_input's split: about this many workgroups where the reduction (the
# vocabulary) has room; slices cost little beside it. Timed on an H100 (bitlora.bench.train),
# at 1024 x 2560 x 128256 (bf16; 320 tiles, --profile): 1 slice 39.8 ms, 2 (the ternary
# kernels' 512-workgroup target) 29.6, 3 25.7, 4 24.1; at 256 rows (80 tiles; config A, whole
# steps, two runs each) 7 slices 89.4 / 89.6 ms a step, 14 89.6 / 88.1, 16 87.5 / 86.4.
# 4 x 320 = 16 x 80: one target for both.
BACKWARD_GROUPS = 1280


def backward_input_plan(N: int, I: int, O: int, split: int | None = None) -> tuple:
    """(slices, outputs per slice) of linear_backward_input's 64-row x 128-column tiles."""
    tiles = -(-I // 128) * -(-N // 64)
    if split is None:
        split = splitk.plan(tiles, O, 16, target=BACKWARD_GROUPS)[0]
    return splitk.plan(tiles, O, 16, split)


def scratch_floats(N: int, I: int, O: int, kind: str = "gpu") -> int:
    """The split-K scratch (floats) linear_backward_input at these sizes needs on a
    device of `kind` (Device.kind: the CPU variant splits nothing)."""
    if kind == "cpu":
        return 1
    return splitk.floats(backward_input_plan(N, I, O)[0], N, I)


def quad_views(dev, I: int, *bufs) -> list:
    """linear_forward's bindings 4, 5 (x and w again, which it reads as vectors where the
    rows are whole quads, I % 4 == 0), or spare buffers where they are not."""
    return list(bufs) if I % 4 == 0 else [spare(dev, j) for j in range(len(bufs))]


def linear_forward(dev, x, chunks, y, N: int, I: int, O: int, x_row0: int = 0, x_step: int = 1) -> None:
    """x[.., I] (rows x_row0 + n*x_step, n < N), chunks = [(v0, Oc, w[Oc, I] buffer), ...]
    covering O rows -> y[N, O] = x W^T. W is f32, or bf16 where `chunks.dtype` says so
    (model.RowTable)."""
    need(x, (x_row0 + (N - 1) * x_step + 1) * I, "x", "linear_forward")
    need(y, N * O, "y", "linear_forward")
    bf16 = getattr(chunks, "dtype", "f32") == "bf16"
    cpu = dev.kind == "cpu" and I % 4 == 0
    if N <= ROWS_KERNEL_MAX_N or (dev.kind == "cpu" and not cpu):
        entry, cols, rows = "linear_forward_rows", 64, 8
    elif cpu:
        entry = "linear_forward_cpu"
    else:
        entry, cols, rows = "linear_forward", 128, 64
    k = dev.prepared(SHADER, entry, _constants("bf16" if bf16 else "f32"))
    for v0, oc, w in chunks:
        need(w, -(-oc * I // 2) if bf16 else oc * I, "w", "linear_forward")
        vec = quad_views(dev, I, x, w) if entry == "linear_forward" else []
        dev.dispatch(k, [x, w, y] + vec, groups=cpu_groups(N, oc) if entry == "linear_forward_cpu" else
                     (-(-oc // cols), -(-N // rows), 1), params=FORWARD.pack(N, I, oc, O, v0, x_row0, x_step))


def linear_backward_input(dev, dy, w, dx, N: int, I: int, O: int, scale: float = 1.0,
                          accumulate: bool = False, ld_dy: int | None = None, w_dtype: str = "f32",
                          split: int | None = None) -> None:
    """dy[N, ld_dy] (first O columns used), dense w[O, I] (f32 or "bf16": u32 pairs, low
    half first; e.g. lm_head = embedding[V, C] or a vocabulary chunk of it) ->
    dx[N, I] = scale * dy w (= or +=). `split` forces the split-K slices (GPU kernel only)."""
    ld = O if ld_dy is None else ld_dy
    constants = _constants(w_dtype)
    w_words = O * I if w_dtype == "f32" else -(-O * I // 2)
    for b, n, what in ((dy, (N - 1) * ld + O, "dy"), (w, w_words, "w"), (dx, N * I, "dx")):
        need(b, n, what, "linear_backward_input")
    if dev.kind == "cpu":
        dev.dispatch(dev.prepared(SHADER, "linear_backward_input_cpu", _cpu_backward_constants(w_dtype, I % 4 == 0)),
                     [dy, w, dx],
                     groups=(-(-I // (CPU_WG * CPU_BWD_TILE)), -(-N // 8), 1),
                     params=BACKWARD.pack(N, I, O, scale, int(accumulate), ld, O, 0))
        return
    k = dev.prepared(SHADER, "linear_backward_input", constants)
    slices, ko = backward_input_plan(N, I, O, split)
    part = splitk.scratch(dev, splitk.floats(slices, N, I))
    w2 = w if I % 4 == 0 else spare(dev, 0)   # 5, 6: w and dy again, read as vectors where rows align
    dy4 = dy if ld % 4 == 0 and dy.size >= 16 else spare(dev, 1)
    dev.dispatch(k, [dy, w, dx, part, w2, dy4], groups=(-(-I // 128), -(-N // 64), slices),
                 params=BACKWARD.pack(N, I, O, scale, int(accumulate), ld, ko, int(slices > 1)))
    if slices > 1:
        splitk.reduce(dev, part, None, dx, N * I, slices, I, scale, accumulate)
