"""Wrappers for shaders/lora.wgsl: the LoRA branch y += (alpha/R) B(A(dropout(x))) of
one adapted projection, forward and backward, with a counter-based dropout mask made
on the GPU. They check sizes, pack the uniform and record dispatches; the math is in
the shader header. Browser-safe: standard library + bitlora only.

Shapes: x[N, I] (the projection's input, before activation quantisation), a[R, I],
b[O, R], u[N, R] (saved by forward), y/dy[N, O], da[R, I], db[O, R], du[N, R],
dx[N, I], stream[1] u32 (the dropout stream of the micro-batch: a buffer the host
writes each step, so a recorded step replays unchanged). The dx contribution adds
(+=); the gradients of a, b add too, or with accumulate=False are written (=): a
step's first micro-batch then needs no zeroed gradients.
"""
from __future__ import annotations

from dataclasses import dataclass

from . import splitk
from ._check import need, quads, spare
from ._uniform import Uniform

SHADER = "lora.wgsl"
_FIELDS = "n:u32 i:u32 o:u32 r:u32 scale:f32 keep_threshold:u32 keep_scale:f32 seed:u32 per:u32 acc:u32"
PARAMS = Uniform("LoraParams", _FIELDS)
WG = 256
FORWARD_ENTRIES = ("lora_down", "lora_up")
BACKWARD_ENTRIES = ("lora_grad_b", "lora_grad_u", "lora_grad_a", "lora_grad_x")
AXB = Uniform("LoraAxbParams", _FIELDS + " ga:u32 gx:u32 gb:u32 boff:u32 bslices:u32")
SPLIT_ENTRIES = ("lora_grad_b_split", "lora_grad_axb")
DROPOUT_ENTRIES = ("lora_down", "lora_grad_a", "lora_grad_x")   # these also bind stream
LR = 16  # invocations per workgroup of the CPU variants (lora.wgsl LR)
WR = 256  # lanes of the GPU reductions over I or O and workgroup of their tiles (lora.wgsl WR)
WT = 64   # workgroup of lora_up_tile (lora.wgsl WT)
TK, TRD = 16, 4  # ranks, rows per workgroup of lora_down_tile / lora_grad_u_tile (lora.wgsl)
TR = 4   # rows a turn of lora_up_tile / lora_grad_axb's dx (lora.wgsl TR)
TQ = 1   # turns per invocation there (lora.wgsl's override TQ, whose default this is)
TILE_MIN_GROUPS = 256   # lora_down_tile / lora_grad_u_tile only with this many workgroups (else the plain kernels)
TILE_ENTRIES = ("lora_down", "lora_up", "lora_grad_u")   # GPU tiles: entry + "_tile" (lora_grad_x's: in lora_grad_axb)
TILES = True   # False: GPU kinds record the plain kernels (the tests compare the tiles' bits with theirs)
SPLIT_GROUPS = 1024   # the split dA, dB sums: slices until the grid has about this many workgroups
SPLIT_MIN_ROWS = 32   # ... but at least this many rows per slice
FUSED = True   # False: lora_grad_axb's three parts (dA's split sum, dx, dB's reduce) in a dispatch each
MATMULS = True   # False: GPU kinds record lora_down's tile (or plain kernel) at every N
MMR, MMK = 32, 32   # rows of a tile, i a staged chunk of lora_down_mm (lora.wgsl)
MM_MIN_ROWS = 512   # lora_down_mm from this many rows (below, lora_down and its tile were faster)
MM_GROUPS = 512   # its slices over I: until the grid has about this many workgroups
MM_MIN_CHUNKS = 2   # ... but at least this many chunks of MMK per slice


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """The GPU kernels (on a CPU they are the fallback where I, O or R % 4 != 0: not with
    `shapes` whose widths and rank are multiples of 4), the CPU variants (*_rows) unless
    kind is "gpu", the GPU tiles (*_tile), split gradient sums and (with MATMULS) the
    split matmul lora_down_mm unless it is "cpu"."""
    entries = FORWARD_ENTRIES + ("lora_down_parts",) + (BACKWARD_ENTRIES if training else ())
    gpu = [] if quads(shapes, "C", "F", "KV", "R") else [(SHADER, e) for e in entries]
    tiles = [(SHADER, e + "_tile", tq_constants(e + "_tile")) for e in TILE_ENTRIES if e in entries] if kind != "cpu" else []
    split = ([(SHADER, e, tq_constants(e)) for e in SPLIT_ENTRIES] + splitk.kernel_specs()
             if training and kind != "cpu" else [])
    mm = [(SHADER, "lora_down_mm")] + splitk.kernel_specs() if kind != "cpu" and MATMULS else []
    return gpu + ([(SHADER, e + "_rows") for e in entries] if kind != "gpu" else []) + tiles + split + mm


@dataclass(frozen=True)
class LoraShape:
    """One adapted projection: N rows, I inputs, O outputs, rank R, scale = alpha / R,
    dropout probability p and seed (per run/layer/module; the stream's `step`, per
    micro-batch, is in the stream buffer: forward and backward of one micro-batch must
    bind the same one)."""
    N: int
    I: int
    O: int
    R: int
    scale: float
    p: float = 0.0
    seed: int = 0

    def params(self, per: int = 0, accumulate: bool = True, *extra: int) -> bytes:
        """LoraParams (with `extra`: LoraAxbParams, whose further fields they are)."""
        if not 0.0 <= self.p < 1.0:
            raise ValueError(f"lora dropout p={self.p} must be in [0, 1)")
        thr = min(int(self.p * 4294967296.0), 0xFFFFFFFF)
        keep_scale = 1.0 / (1.0 - self.p)
        return (AXB if extra else PARAMS).pack(self.N, self.I, self.O, self.R, self.scale, thr, keep_scale,
                                               self.seed & 0xFFFFFFFF, per, int(accumulate), *extra)


def cpu_rows(dev, *widths: int) -> bool:
    """Whether a kernel runs its CPU variant (*_rows): a CPU device (dev.kind) and every
    width it reads as vec4 a multiple of 4 (also asked by matvec's LoRA-up, whose sum
    follows lora_up_rows' order where lora_up would run it)."""
    return dev.kind == "cpu" and all(w % 4 == 0 for w in widths)


def _tile(entry: str, s: LoraShape):
    """The workgroups of `entry`'s GPU tile (lora.wgsl *_tile) at shape s, or None where it
    has none or its vec4 widths are not multiples of 4 (then the plain kernel runs)."""
    N, I, O, R = s.N, s.I, s.O, s.R
    rows = -(-N // (TR * TQ))   # row blocks of lora_up_tile / lora_grad_axb's dx
    wide = (-(-N // TRD), -(-R // TK), 1)    # one chain of WR lanes per (row, rank) in both kernels:
    few = wide[0] * wide[1] < TILE_MIN_GROUPS   # with few rows the plain N*R workgroups hide latency better
    groups, widths = {
        "lora_down": (None if few else wide, ()),
        "lora_up": (-(-rows * (O // 4) // WT), (O, R)),
        "lora_grad_u": (None if few else wide, (R,)),
        "lora_grad_x": (-(-rows * (I // 4) // WG), (I,)),   # lora_grad_axb's dx part (WG lanes)
    }.get(entry, (None, ()))
    return groups if groups is not None and all(w % 4 == 0 for w in widths) else None


def _run(dev, entry: str, s: LoraShape, bufs: list, stream, accumulate: bool = True) -> None:
    """Record `entry`: on a CPU (dev.kind) its *_rows variant where its vec4 widths
    (I or O, and R for the four that read u, b, du or db as vec4) are multiples of 4,
    elsewhere its GPU tile (*_tile) where it has one for these widths; the dropout
    entries also bind `stream`."""
    N, I, O, R = s.N, s.I, s.O, s.R
    R4 = -(-R // 4)
    gpu_groups, widths, cpu_items = {               # cpu_items: invocations of *_rows
        "lora_down": (N * R, (I,), -(-N // 4) * R4),
        "lora_up": (-(-N * O // WG), (O, R), -(-N // 4) * O // 4),
        "lora_grad_b": (-(-R * O // WG), (O, R), R4 * O // 4),
        "lora_grad_u": (N * R, (O, R), N * R4),
        "lora_grad_a": (-(-R * I // WG), (I,), R4 * I // 4),
        "lora_grad_x": (-(-N * I // WG), (I, R), -(-N // 4) * I // 4),
    }[entry]
    if entry in DROPOUT_ENTRIES:
        bufs = bufs + [stream]
    tile = _tile(entry, s) if dev.kind != "cpu" and TILES and entry in TILE_ENTRIES else None
    if cpu_rows(dev, *widths):
        entry, groups = entry + "_rows", -(-cpu_items // LR)
    elif tile is not None:
        entry, groups = entry + "_tile", tile
    else:
        groups = gpu_groups
    dev.dispatch(dev.prepared(SHADER, entry, tq_constants(entry)), bufs, groups=groups,
                 params=s.params(accumulate=accumulate))


def tq_constants(entry: str) -> dict | None:
    """The override constants `entry` is compiled with: TQ for lora_up_tile / lora_grad_axb
    where it is not the shader's default (kernel_specs lists them so)."""
    return {"TQ": TQ} if TQ != 1 and entry in ("lora_up_tile", "lora_grad_axb") else None


def split_plan(N: int, cols: int, R: int) -> tuple[int, int]:
    """(slices, rows per slice) of a split dA or dB sum over N rows, `cols` columns."""
    tiles = -(-cols // WG) * -(-R // 4)
    slices = max(1, min(-(-SPLIT_GROUPS // tiles), N // SPLIT_MIN_ROWS))
    per = -(-N // slices)
    return -(-N // per), per


def mm_plan(N: int, I: int, R: int) -> tuple[int, int]:
    """(slices, inputs per slice) of lora_down_mm."""
    tiles = -(-N // MMR) * -(-R // 16)
    slices = max(1, min(-(-MM_GROUPS // tiles), I // (MM_MIN_CHUNKS * MMK)))
    per = -(-I // slices)
    per = -(-per // MMK) * MMK
    return -(-I // per), per


def uses_mm(kind: str, N: int, I: int) -> bool:
    """Whether lora_down runs as lora_down_mm (+ its reduce) on a device of `kind`."""
    return kind != "cpu" and MATMULS and N >= MM_MIN_ROWS and I % 4 == 0


def _down_mm(dev, s: LoraShape, x, a, u, stream) -> None:
    """u = dropout(x) a^T as lora_down_mm and the reduce of its slices (uses_mm)."""
    slices, per = mm_plan(s.N, s.I, s.R)
    part = u if slices == 1 else splitk.scratch(dev, slices * s.N * s.R)
    dev.dispatch(dev.prepared(SHADER, "lora_down_mm"), [x, a, part, stream],
                 groups=(-(-s.N // MMR), -(-s.R // 16), slices), params=s.params(per))
    if slices > 1:
        splitk.reduce(dev, part, None, u, s.N * s.R, slices, 1, 1.0, False)


def scratch_floats(N: int, sizes, R: int) -> int:
    """The split-K scratch (floats) the split dA, dB sums and lora_down_mm of projections
    `sizes` [(I, O)] need on a GPU kind."""
    return max([sum(_backward_scratch(N, I, O, R)) for I, O in sizes]
               + [mm_plan(N, I, R)[0] * N * R for I, O in sizes if uses_mm("gpu", N, I)], default=1)


def _backward_scratch(N: int, I: int, O: int, R: int) -> tuple[int, int]:
    """(boff, dB's floats): the backward's scratch holds dA's slices from 0, dB's from boff
    (a multiple of 64 floats: a binding may start there)."""
    return -(-split_plan(N, I, R)[0] * I * R // 64) * 64, split_plan(N, O, R)[0] * O * R


def lora_forward(dev, s: LoraShape, x, a, b, u, y, stream) -> None:
    """Record u[N, R] = dropout(x) a^T, then y[N, O] += scale * u b^T (the dropout
    mask from s.seed and stream[0])."""
    for buf, n, what in ((x, s.N * s.I, "x"), (a, s.R * s.I, "a"), (b, s.O * s.R, "b"),
                         (u, s.N * s.R, "u"), (y, s.N * s.O, "y"), (stream, 1, "stream")):
        need(buf, n, what, "lora_forward")
    if uses_mm(dev.kind, s.N, s.I):
        _down_mm(dev, s, x, a, u, stream)
    else:
        _run(dev, "lora_down", s, [x, a, u], stream)
    _run(dev, "lora_up", s, [u, b, y], stream)


def lora_backward(dev, s: LoraShape, dy, x, a, b, u, da, db, du, stream, dx=None, accumulate: bool = True) -> None:
    """Record db += scale dy^T u; du = scale dy b; da += du^T dropout(x) (da, db = instead
    of += with accumulate False); and, unless dx is None, dx[N, I] += mask * keep_scale *
    (du a). `stream` as the forward's. On GPUs the sums over N of da, db run split: dB's
    slices (lora_grad_b_split), du, then dA's slices, dx and dB's reduce in one dispatch
    (lora_grad_axb; dx there as a tile where I % 4 == 0), then dA's reduce."""
    for buf, n, what in ((dy, s.N * s.O, "dy"), (x, s.N * s.I, "x"), (a, s.R * s.I, "a"),
                         (b, s.O * s.R, "b"), (u, s.N * s.R, "u"), (da, s.R * s.I, "da"),
                         (db, s.O * s.R, "db"), (du, s.N * s.R, "du"), (stream, 1, "stream")):
        need(buf, n, what, "lora_backward")
    if dx is not None:
        need(dx, s.N * s.I, "dx", "lora_backward")
    if dev.kind == "cpu":
        _run(dev, "lora_grad_b", s, [dy, u, db], stream, accumulate)
        _run(dev, "lora_grad_u", s, [dy, b, du], stream)
        _run(dev, "lora_grad_a", s, [du, x, da], stream, accumulate)
        if dx is not None:
            _run(dev, "lora_grad_x", s, [du, a, dx], stream)
        return
    N, I, O, R = s.N, s.I, s.O, s.R
    a_slices, a_per = split_plan(N, I, R)
    b_slices, b_per = split_plan(N, O, R)
    boff, b_floats = _backward_scratch(N, I, O, R)
    part = splitk.scratch(dev, boff + b_floats)
    dev.dispatch(dev.prepared(SHADER, "lora_grad_b_split"), [dy, u, part.view(4 * boff, 4 * b_floats)],
                 groups=(-(-O // WG), -(-R // 4), b_slices), params=s.params(b_per))
    _run(dev, "lora_grad_u", s, [dy, b, du], stream)
    gx = _tile("lora_grad_x", s) if dx is not None and TILES else None
    ga, gb = -(-I // WG) * -(-R // 4) * a_slices, -(-O * R // WG)
    bufs = [du, x, part, stream] + ([a, dx] if gx else [spare(dev, 0), spare(dev, 1)]) + [db]
    k = dev.prepared(SHADER, "lora_grad_axb", tq_constants("lora_grad_axb"))
    parts = [(ga, gx or 0, gb)] if FUSED else [(ga, 0, 0), (0, gx or 0, 0), (0, 0, gb)]
    for g in parts:
        if sum(g):
            dev.dispatch(k, bufs, groups=sum(g), params=s.params(a_per, accumulate, *g, boff, b_slices))
    if dx is not None and not gx:
        _run(dev, "lora_grad_x", s, [du, a, dx], stream)
    splitk.reduce(dev, part, None, da, R * I, a_slices, 1, 1.0, accumulate)


PARTS = Uniform("LoraPartsParams", "i:u32 r:u32 a0:u32 a1:u32 a2:u32")
NONE = 0xFFFFFFFF


def lora_down_parts(dev, x, ab, a_offsets, u, I: int, R: int) -> None:
    """One token's u[p*R + r] = A_p x for up to three projections of one input x[I]
    (decoding: no dropout); A_p[R, I] at float a_offsets[p] of ab (None: not adapted).
    ops.matvec.ternary_matvec adds the up half."""
    if not 1 <= len(a_offsets) <= 3:
        raise ValueError(f"lora_down_parts: 1 to 3 parts, got {len(a_offsets)}")
    need(x, I, "x", "lora_down_parts")
    need(u, 3 * R, "u", "lora_down_parts")
    for a in a_offsets:
        if a is not None:
            need(ab, a + R * I, "ab (A)", "lora_down_parts")
    a = [NONE if o is None else o for o in a_offsets] + [NONE] * (3 - len(a_offsets))
    params = PARTS.pack(I, R, *a)
    if dev.kind == "cpu" and I % 4 == 0:
        dev.dispatch(dev.prepared(SHADER, "lora_down_parts_rows"), [x, ab, u], groups=-(-3 * R // LR), params=params)
    else:
        dev.dispatch(dev.prepared(SHADER, "lora_down_parts"), [x, ab, u], groups=3 * R, params=params)
