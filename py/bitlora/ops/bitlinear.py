"""Wrappers for shaders/bitlinear.wgsl: per-token int8 activation quantisation, the
packed ternary matmul, and its input gradient (straight-through estimator). They check
sizes, pack the uniform and record dispatches; the math is in the shader header.

On a GPU whose WGSL has dot4I8Packed (Device.int8_dot) the forward of more than
ROWS_KERNEL_MAX_N rows runs on int8 dot products (shaders/bitlinear_i8.wgsl), and the
quantiser then writes its activations packed four to a u32 (`packed_xq` decides, for
both); elsewhere xq holds the integers as f32. Same bits either way.
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from . import splitk
from .matvec import GATES, spare
from .relu2 import gating_forward
from ._check import need, quads
from ._uniform import Uniform

SHADER = "bitlinear.wgsl"
SHADER_I8 = "bitlinear_i8.wgsl"
ACTQUANT = Uniform("ActQuantParams", "n:u32 i:u32")
FORWARD = Uniform("BitlinearParams", "n:u32 i:u32 o:u32 scale:f32 accumulate:u32 kw:u32 split:u32")
FORWARD_I8 = Uniform("BitlinearI8Params", "n:u32 i:u32 o:u32 scale:f32 accumulate:u32 kw:u32 split:u32 "
                                         "o1:u32 o2:u32 base1:u32 base2:u32 scale1:f32 scale2:f32")
MAX_PARTS = 3   # projections of one input bitlinear_forward_parts multiplies in one dispatch
I8_KC = 8  # packed words per staged chunk of bitlinear_forward_i8 (its split-K unit)
# Up to this many rows (a short prompt) bitlinear_forward_i8 takes tiles of 32 rows, not 64
# (its override I8_ROWS): a 64-row tile would multiply as many zero rows as real ones.
I8_SHORT = 32
BACKWARD = Uniform("BitlinearBackwardParams", "n:u32 i:u32 o:u32 scale:f32 accumulate:u32 ko:u32 split:u32")

# Up to this many rows (decoding one token per sequence) the 8-row kernel wastes less
# than the 64 x 64 tiles; both give the same bits (integer sums are exact in f32).
ROWS_KERNEL_MAX_N = 8


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """The rows kernel and activation quantiser always (with `shapes` whose C and F are
    multiples of 4, the quantiser's CPU variant only); the tiled GPU kernels unless kind
    is "cpu", the CPU variants unless kind is "gpu" (on a CPU, the rows kernel is the
    forward's fallback where I % 4 != 0)."""
    specs = [(SHADER, e) for e in (("bitlinear_forward_rows",) if quads(shapes, "C", "F") else
                                   ("actquant_forward", "bitlinear_forward_rows"))]
    if kind in (None, "gpu"):
        specs += [(SHADER, "bitlinear_forward")] + ([(SHADER, "bitlinear_backward_input")] if training else [])
        specs += splitk.kernel_specs()
    return specs + _cpu_matmul_specs(training, kind, shapes) + actquant_specs(kind, shapes)


def int8_specs() -> list:
    """The int8 forward's kernels (a GPU with Device.int8_dot: ops.kernel_specs adds them)."""
    return [(SHADER_I8, "bitlinear_forward_i8"), (SHADER_I8, "bitlinear_forward_i8", i8_constants(I8_SHORT)),
            (SHADER, "actquant_forward_i8")]


def i8_rows(N: int) -> int:
    """Rows of bitlinear_forward_i8's tiles for N rows: 32 up to I8_SHORT, else 64."""
    return 32 if N <= I8_SHORT else 64


def i8_constants(rows: int) -> dict | None:
    """bitlinear_forward_i8's override constants for tiles of `rows` rows."""
    return {"I8_ROWS": float(rows)} if rows != 64 else None


def packed_xq(dev, N: int) -> bool:
    """Whether activations of N rows are quantised packed (prelude.wgsl xq8) for the int8
    forward: a GPU (dev.kind) whose WGSL has dot4I8Packed (dev.int8_dot), more rows than
    the few-rows kernel takes. The one place that decides; the quantisers and the
    forward all ask it."""
    return dev.kind == "gpu" and dev.int8_dot and N > ROWS_KERNEL_MAX_N


def xq_floats(I: int, packed: bool) -> int:
    """32-bit words of one row of xq: I (f32) or 4 per 16 columns (packed int8)."""
    return 4 * -(-I // 16) if packed else I


# -- CPU matmuls (Device.kind "cpu"): both ternary matmuls are bitlinear_matmul_cpu, 8 rows x 32
# columns per invocation, no split-K; the forward reads the weights transposed (transpose_weights,
# made once at load by Model.create where the model's packed weights take at most
# CPU_TRANSPOSE_MAX_BYTES: one more copy of them), else bitlinear_forward_cpu reads w_packed
# (I % 4 == 0; else the rows kernel).
CPU_TILE = 32
CPU_MATMUL = Uniform("CpuMatmulParams", "n:u32 k:u32 c:u32 scale:f32 accumulate:u32 divide:u32")
TRANSPOSE = Uniform("TransposeParams", "o:u32 i:u32")
CPU_TRANSPOSE_MAX_BYTES = 256 << 20
# The override constants of bitlinear_matmul_cpu (shaders/bitlinear.wgsl CPU_WG, CPU_STEP,
# CPU_CODES) per CPU adapter, matched lower-cased against its vendor / architecture / device /
# description; the first match wins, anything else gets the shader's defaults (CPU_WG 8,
# CPU_STEP 4, CPU_CODES on). None differs now: timed 2026-12-05 with bench/cpu_matmul.py, the
# defaults ran SwiftShader's matmuls 1.2-1.5x faster than its old entry (CPU_STEP 1) and
# lavapipe's 1.0-1.16x faster than CPU_CODES off. CPU_WG 8 and 16 ran alike on both, 4 slower.
# CPU_ALTERNATIVES are other constants the tests run too (they stay correct if an adapter
# needs them again).
CPU_TILES: tuple = ()
CPU_ALTERNATIVES: tuple = (("plain", {"CPU_STEP": 1, "CPU_CODES": 0}),)
CPU_DEFAULT = {"CPU_WG": 8}
CPU_WG = CPU_DEFAULT["CPU_WG"]


def cpu_constants(dev) -> dict | None:
    """The override constants of the CPU matmul on `dev` (None: the shader's defaults)."""
    return adapter_constants(getattr(dev, "adapter_info", None))


def adapter_constants(info: dict | None) -> dict | None:
    """CPU_TILES' entry for an adapter (Device.adapter_info), None for the shader's defaults."""
    text = " ".join(str((info or {}).get(k, "")) for k in ("vendor", "architecture", "device", "description")).lower()
    return next((c for name, c in CPU_TILES if name in text), None)


CPU_FWD_ROWS, CPU_ROWS = 4, 8   # rows per invocation of bitlinear_forward_cpu / bitlinear_matmul_cpu


def cpu_groups(dev, N: int, tiles: int, rows: int, consts: dict | None = None) -> int:
    """Workgroups of a CPU matmul with `tiles` column tiles per block of `rows` rows."""
    return -(-(-(-N // rows) * tiles) // (consts or cpu_constants(dev) or CPU_DEFAULT).get("CPU_WG", CPU_WG))


def _cpu_matmul_specs(training: bool, kind: str | None, shapes: dict | None = None) -> list:
    """The CPU matmuls: bitlinear_matmul_cpu with every CPU_TILES and CPU_ALTERNATIVES entry's
    constants and the shader's, the transpose and the untransposed forward; with `shapes`, the adapter's
    constants only, and the untransposed forward only where the weights are not transposed."""
    if kind not in (None, "cpu"):
        return []
    if shapes is None:
        consts, plain = [None] + [c for _, c in CPU_TILES + CPU_ALTERNATIVES], True
    else:
        consts, plain = [adapter_constants(shapes["adapter"])], not shapes["transposed"]
    # CPU_QUADS: every reduction length a multiple of 4 (forward C, F; input gradient C, KV, F)
    flags = (True,) if quads(shapes, "C", "F", "KV") else (True, False)
    return [(SHADER, "bitlinear_matmul_cpu", _with_quads(c, q)) for c in consts for q in flags] + \
        [(SHADER, "ternary_transpose")] + ([(SHADER, "bitlinear_forward_cpu")] if plain else [])


def _with_quads(consts: dict | None, quads: bool) -> dict:
    """bitlinear_matmul_cpu's constants with CPU_QUADS (K % 4 == 0: a read as vec4s)."""
    return {**(consts or {}), "CPU_QUADS": int(quads)}


def transpose_weights(dev, w_packed, O: int, I: int, label: str = "wt"):
    """w_packed[O, ceil(I/16)] u32 -> a new buffer wt[I, ceil(O/16)] u32 (the same ternary codes;
    bitlinear_matmul_cpu's forward reads it). Recorded, not waited for."""
    need(w_packed, O * -(-I // 16), "w_packed", "transpose_weights")
    n = I * -(-O // 16)
    wt = dev.buffer(4 * n, label)
    dev.dispatch(dev.prepared(SHADER, "ternary_transpose"), [w_packed, wt], groups=-(-n // 64),
                 params=TRANSPOSE.pack(O, I))
    return wt


def cpu_matmul(dev, a, s, wt, scale: float, y, N: int, K: int, C: int, accumulate: bool, divide: bool,
               consts: dict | None = None) -> None:
    """bitlinear_matmul_cpu: y[N, C] (= or +=) (a[N, K] t[K, C]) * scale (/ s[N] if divide), with
    `dev`'s constants (cpu_constants) unless `consts` are given ({}: the shader's defaults)."""
    consts = cpu_constants(dev) if consts is None else consts or None
    q = K % 4 == 0   # binding 5: a again, read as vec4s, or a spare buffer
    dev.dispatch(dev.prepared(SHADER, "bitlinear_matmul_cpu", _with_quads(consts, q)),
                 [a, s, wt, y, a if q else spare(dev, 0)],
                 groups=cpu_groups(dev, N, -(-C // CPU_TILE), CPU_ROWS, consts),
                 params=CPU_MATMUL.pack(N, K, C, scale, int(accumulate), int(divide)))


def forward_plan(N: int, I: int, O: int, split: int | None = None, unit: int = 4, rows: int = 64) -> tuple:
    """(slices, packed words per slice) of bitlinear_forward's 64 x 64 tiles (N > 8);
    `unit` the kernel's chunk of words and `rows` its tile's (bitlinear_forward_i8: I8_KC,
    i8_rows(N))."""
    return splitk.plan(-(-O // 64) * -(-N // rows), -(-I // 16), unit, split, cols_per_k=16)


# bitlinear_backward_input's split: about this many workgroups, at least this many outputs a
# slice. Timed on an H100 (bench/matmul.py --kernels bwd, 2026-12-07) at 256 rows: 6 slices of
# q/o (2560 -> 2560) 0.162 ms against the shared plan's 5 (0.179), of gate/up (6912 outputs)
# 0.324 against its 7 (0.379); at 1024 rows both give the fastest of 1-4 (2, 2, 1, 1 at the four
# 2B-4T widths).
BACKWARD_GROUPS = 480
BACKWARD_MIN_SLICE = 384


def backward_input_plan(N: int, I: int, O: int, split: int | None = None) -> tuple:
    """(slices, outputs per slice) of bitlinear_backward_input's tiles."""
    words = -(-I // 16)
    return splitk.plan(-(-words // 8) * -(-N // 64), O, 16, split, target=BACKWARD_GROUPS,
                       min_slice=BACKWARD_MIN_SLICE)


def forward_scratch_floats(N: int, I: int, O: int, kind: str = "gpu") -> int:
    """The split-K scratch (floats) the forward of N rows by O outputs (one projection, or
    a group's side by side: bitlinear_forward_parts) needs on a device of `kind`."""
    if kind == "cpu" or N <= ROWS_KERNEL_MAX_N:
        return 1
    return max(splitk.floats(forward_plan(N, I, O, None, unit, rows)[0], N, O)
               for unit, rows in ((4, 64), (I8_KC, i8_rows(N))))


def scratch_floats(N: int, I: int, O: int, kind: str = "gpu") -> int:
    """The split-K scratch (floats) the forward and input gradient at these sizes need
    on a device of `kind` (Device.kind: the CPU variants split nothing)."""
    if kind == "cpu":
        return 1
    return max(forward_scratch_floats(N, I, O, kind), splitk.floats(backward_input_plan(N, I, O)[0], N, I))


# ---------------------------------------------------------------- actquant
AQR = 16  # rows per workgroup of actquant_forward_rows (bitlinear.wgsl AQR)


def actquant_specs(kind: str | None = None, shapes: dict | None = None) -> list:
    """actquant_forward's CPU variant, unless kind is "gpu" (kernel_specs lists the GPU
    kernel always: on a CPU it is the fallback where I % 4 != 0), or `shapes`' C and F
    are multiples of 4 (a model quantises only a norm's output: rmsnorm_quant_forward_rows)."""
    return [] if kind == "gpu" or quads(shapes, "C", "F") else [(SHADER, "actquant_forward_rows")]


def actquant_forward(dev, x, xq, s, N: int, I: int) -> None:
    """x[N, I] -> xq[N, I] (integers -128..127 as f32; packed int8 where packed_xq), s[N] =
    127 / max|x[n]|. On a CPU (dev.kind) with I % 4 == 0: one row per invocation (same results)."""
    packed = packed_xq(dev, N)
    for b, n, what in ((x, N * I, "x"), (xq, N * xq_floats(I, packed), "xq"), (s, N, "s")):
        need(b, n, what, "actquant_forward")
    if packed:
        dev.dispatch(dev.prepared(SHADER, "actquant_forward_i8"), [x, xq, s], groups=N, params=ACTQUANT.pack(N, I))
    elif dev.kind == "cpu" and I % 4 == 0:
        dev.dispatch(dev.prepared(SHADER, "actquant_forward_rows"), [x, xq, s], groups=-(-N // AQR),
                     params=ACTQUANT.pack(N, I))
    else:
        dev.dispatch(dev.prepared(SHADER, "actquant_forward"), [x, xq, s], groups=N, params=ACTQUANT.pack(N, I))


def bitlinear_forward(dev, xq, s, w_packed, scale: float, y, N: int, I: int, O: int,
                      accumulate: bool = False, split: int | None = None, w_t=None) -> None:
    """xq[N, I] (as actquant_forward wrote it: packed where packed_xq), s[N],
    w_packed[O, ceil(I/16)] u32 -> y[N, O] = xq t^T * scale / s (= or +=).
    `split` forces the number of reduction slices (default: ops.splitk.plan's; GPU kernels
    only). On a CPU device N > 8 rows run unsplit: bitlinear_matmul_cpu where `w_t` (the
    weights transposed: transpose_weights) is given, else bitlinear_forward_cpu where
    I % 4 == 0, else the rows kernel."""
    words = -(-I // 16)
    packed = packed_xq(dev, N)
    for b, n, what in ((xq, N * xq_floats(I, packed), "xq"), (s, N, "s"), (w_packed, O * words, "w_packed"),
                       (y, N * O, "y")):
        need(b, n, what, "bitlinear_forward")
    if packed:
        sums = _forward_i8(dev, xq, s, w_packed, [(0, O, scale, y)], N, I, accumulate, split)
        if sums is not None:
            sums.flush(dev)
        return
    cpu = dev.kind == "cpu"
    if cpu and w_t is not None and N > ROWS_KERNEL_MAX_N:
        need(w_t, I * -(-O // 16), "w_t", "bitlinear_forward")
        cpu_matmul(dev, xq, s, w_t, scale, y, N, I, O, accumulate, divide=True)
        return
    if N <= ROWS_KERNEL_MAX_N or (cpu and I % 4):
        dev.dispatch(dev.prepared(SHADER, "bitlinear_forward_rows"), [xq, s, w_packed, y],
                     groups=(-(-O // 64), -(-N // 8), 1),
                     params=FORWARD.pack(N, I, O, scale, int(accumulate), words, 0))
        return
    if cpu:
        dev.dispatch(dev.prepared(SHADER, "bitlinear_forward_cpu"), [xq, s, w_packed, y],
                     groups=cpu_groups(dev, N, -(-O // CPU_TILE), CPU_FWD_ROWS, CPU_DEFAULT),
                     params=FORWARD.pack(N, I, O, scale, int(accumulate), words, 0))
        return
    slices, kw = forward_plan(N, I, O, split)
    part = splitk.scratch(dev, splitk.floats(slices, N, O))
    dev.dispatch(dev.prepared(SHADER, "bitlinear_forward"), [xq, s, w_packed, y, part],
                 groups=(-(-O // 64), -(-N // 64), slices),
                 params=FORWARD.pack(N, I, O, scale, int(accumulate), kw, int(slices > 1)))
    if slices > 1:
        splitk.reduce(dev, part, s, y, N * O, slices, O, scale, accumulate)


def bitlinear_forward_parts(dev, xq, s, w, parts, N: int, I: int, accumulate: bool = False,
                            split: int | None = None, w_ts=None, defer: bool = False, gate=None):
    """bitlinear_forward of up to MAX_PARTS projections of one input: parts = [(word offset
    of w_p in w, O_p, scale_p, y_p[N, O_p]), ...] (the first at word 0), w the buffer (or
    view) holding every w_p[O_p, ceil(I/16)] u32. Where the activations are packed
    (packed_xq) one int8 dispatch multiplies them all (and one reduce adds their slices),
    else each part is bitlinear_forward of its view of w (w_ts: each part's transposed
    weights or None, as bitlinear_forward's w_t). The same bits either way.
    gate = (act, h): two parts g, u of one width F (written, not added), then
    h[N, F] = act(g) * u (relu2.gating_forward's bits): in the reduce where the int8
    dispatch is split (splitk_reduce_gated), else its own dispatch.
    defer (without gate): where the int8 dispatch is split, leave its reduce undispatched
    and return it (a splitk.SplitSums, for a kernel that reduces as it reads: rope_kv_store);
    else None."""
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"bitlinear_forward_parts: 1 to {MAX_PARTS} parts, got {len(parts)}")
    if parts[0][0] != 0:
        raise ValueError("bitlinear_forward_parts: the first part must start at word 0 of w")
    if gate is not None and (len(parts) != 2 or accumulate or parts[0][1] != parts[1][1]):
        raise ValueError("bitlinear_forward_parts: gate takes two parts of one width, written (not added)")
    if gate is not None and gate[0] not in GATES:
        raise ValueError(f"bitlinear_forward_parts: activation {gate[0]!r} is not one of {tuple(GATES)}")
    words = -(-I // 16)
    sums = None
    if not packed_xq(dev, N):
        for j, (off, O, scale, y) in enumerate(parts):
            bitlinear_forward(dev, xq, s, w.view(4 * off, 4 * O * words), scale, y, N, I, O, accumulate, split,
                              w_t=w_ts[j] if w_ts else None)
    else:
        need(xq, N * xq_floats(I, True), "xq", "bitlinear_forward_parts")
        need(s, N, "s", "bitlinear_forward_parts")
        for j, (off, O, _, y) in enumerate(parts):
            need(w, off + O * words, f"w (part {j})", "bitlinear_forward_parts")
            need(y, N * O, f"y{j}", "bitlinear_forward_parts")
        sums = _forward_i8(dev, xq, s, w, parts, N, I, accumulate, split)
    if gate is None:
        if sums is not None and not defer:
            sums.flush(dev)
            return None
        return sums
    act, h = gate
    (_, F, s0, g), (_, _, s1, u) = parts
    need(h, N * F, "h", "bitlinear_forward_parts")
    if sums is not None:
        splitk.reduce_gated(dev, sums.part, sums.s, g, u, h, N, F, sums.slices, (s0, s1), GATES[act])
    else:
        gating_forward(dev, act, g, u, h, N * F)
    return None


def _forward_i8(dev, xq, s, w, parts, N: int, I: int, accumulate: bool, split: int | None):
    """bitlinear_forward_i8 over `parts` (bitlinear_forward_parts'); its reduce, if split,
    undispatched (a splitk.SplitSums), else None."""
    full = list(parts) + [(0, 0, 0.0, spare(dev, j)) for j in range(len(parts), MAX_PARTS)]
    (_, o0, s0, y0), (b1, o1, s1, y1), (b2, o2, s2, y2) = full
    rows, tiles = i8_rows(N), sum(-(-O // 64) for _, O, _, _ in parts)
    total = o0 + o1 + o2
    slices, kw = forward_plan(N, I, 64 * tiles, split, I8_KC, rows)   # planned on the grid's tiles
    part = splitk.scratch(dev, splitk.floats(slices, N, total))
    dev.dispatch(dev.prepared(SHADER_I8, "bitlinear_forward_i8", i8_constants(rows)), [xq, s, w, y0, part, y1, y2],
                 groups=(tiles, -(-N // rows), slices),
                 params=FORWARD_I8.pack(N, I, o0, s0, int(accumulate), kw, int(slices > 1), o1, o2, b1, b2, s1, s2))
    if slices == 1:
        return None
    outs = ((o0, s0, y0),) if len(parts) == 1 else ((o0, s0, y0), (o1, s1, y1), (o2, s2, y2))
    return splitk.SplitSums(part, s, N, slices, outs, accumulate)


def dy_quads(dev, dy, O: int):
    """bitlinear_backward_input's binding 5: dy again, which it reads as vec4s where its rows
    are whole quads (O % 4 == 0), or a spare buffer where they are not."""
    return dy if O % 4 == 0 else spare(dev, 0)


def bitlinear_backward_input(dev, dy, w_packed, scale: float, dx, N: int, I: int, O: int,
                             accumulate: bool = False, split: int | None = None, defer: bool = False):
    """dy[N, O], w_packed[O, ceil(I/16)] u32 (ternary, times scale) -> dx[N, I] = dy Wq (= or +=).
    `split` as in bitlinear_forward (GPU only). defer: where the product is split, leave its
    reduce undispatched and return it (a splitk.SplitSums, for a kernel that reduces as it
    reads: rmsnorm.rmsnorm_backward's sums); else None."""
    words = -(-I // 16)
    for b, n, what in ((dy, N * O, "dy"), (w_packed, O * words, "w_packed"), (dx, N * I, "dx")):
        need(b, n, what, "bitlinear_backward_input")
    if dev.kind == "cpu":   # dy binds as s too (unused: no division)
        cpu_matmul(dev, dy, dy, w_packed, scale, dx, N, O, I, accumulate, divide=False)
        return None
    slices, ko = backward_input_plan(N, I, O, split)
    part = splitk.scratch(dev, splitk.floats(slices, N, I))
    dev.dispatch(dev.prepared(SHADER, "bitlinear_backward_input"), [dy, w_packed, dx, part, dy_quads(dev, dy, O)],
                 groups=(-(-words // 8), -(-N // 64), slices),
                 params=BACKWARD.pack(N, I, O, scale, int(accumulate), ko, int(slices > 1)))
    if slices == 1:
        return None
    sums = splitk.SplitSums(part, None, N, slices, ((I, scale, dx),), accumulate)
    if defer:
        return sums
    sums.flush(dev)
    return None
