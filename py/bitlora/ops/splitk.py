"""Split-K for the matmuls (shaders/splitk.wgsl): how many slices of the reduction a
dispatch gets, the scratch their partial sums go to, and the pass that adds them.
Browser-safe: standard library + bitlora only.

A 64 x 64-tiled grid over N = 256 rows has ~100 workgroups at 2B-4T widths, far too
few for a big GPU, each looping over the whole reduction. With S slices the grid has
S times more workgroups; the cost is S partial outputs written and read once more."""
from __future__ import annotations

from dataclasses import dataclass

from ._uniform import Uniform

SHADER = "splitk.wgsl"
PARAMS = Uniform("SplitkParams", "count:u32 slices:u32 m:u32 scale:f32 accumulate:u32 use_s:u32")
PARTS = Uniform("SplitkPartsParams", "count:u32 slices:u32 o0:u32 o1:u32 o2:u32 scale0:f32 scale1:f32 scale2:f32 "
                                     "accumulate:u32 act:u32")
TARGET_GROUPS = 512     # split until the grid has about this many workgroups
MIN_SLICE = 512         # ... but give every slice at least this many reduction columns


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    return [] if kind == "cpu" else [(SHADER, e) for e in ("splitk_reduce", "splitk_reduce_parts",
                                                           "splitk_reduce_gated")]   # CPU: no splits


def plan(tiles: int, K: int, unit: int, split: int | None = None, cols_per_k: int = 1,
         target: int = TARGET_GROUPS, min_slice: int = MIN_SLICE) -> tuple[int, int]:
    """(slices, per) for a grid of `tiles` workgroups reducing over K (in units of
    `cols_per_k` columns: 16 for packed ternary words): slices of `per` (a multiple of
    `unit`, the kernel's step), until the grid has about `target` workgroups, each slice
    at least `min_slice` columns. `split` forces a slice count. On an H200 at 2B-4T
    widths 4-8 slices were fastest for 256 rows (bench/matmul.py)."""
    s = split if split is not None else min(-(-target // max(tiles, 1)), K * cols_per_k // min_slice)
    s = max(1, min(s, -(-K // unit)))
    per = -(-K // s)
    per = -(-per // unit) * unit
    return -(-K // per), per


def floats(slices: int, rows: int, cols: int) -> int:
    """Scratch floats a dispatch split in `slices` over an output [rows, cols] needs."""
    return slices * rows * cols if slices > 1 else 1


def scratch(dev, floats: int):
    """A device-wide scratch buffer of at least `floats` f32 (grown, never shrunk).
    Dispatches run in order, so one buffer serves every split matmul of a submit."""
    buf = dev.splitk_scratch
    if buf is None or buf.size < 4 * floats:
        buf = dev.splitk_scratch = dev.buffer(4 * max(floats, 1), "splitk.partials")
    return buf


def reduce(dev, part, s, y, count: int, slices: int, m: int, scale: float, accumulate: bool) -> None:
    """y[count] (= or +=) sum of part[slices, count] * scale (divided by s[e // m] if s)."""
    dev.dispatch(dev.prepared(SHADER, "splitk_reduce"), [part, s if s is not None else part, y],
                 groups=-(-count // 256),
                 params=PARAMS.pack(count, slices, m, scale, int(accumulate), int(s is not None)))



def reduce_parts(dev, part, s, ys, N: int, slices: int, outs, scales, accumulate: bool) -> None:
    """y_p[N, O_p] (= or +=) sum of part[slices, N, sum O_p] (the parts' columns side by
    side) * scale_p / s[n], for the three parts (ys, outs, scales; O_p = 0 where absent)."""
    count = N * sum(outs)
    dev.dispatch(dev.prepared(SHADER, "splitk_reduce_parts"), [part, s, *ys], groups=-(-count // 256),
                 params=PARTS.pack(count, slices, *outs, *scales, int(accumulate), 0))


def reduce_gated(dev, part, s, g, u, h, N: int, F: int, slices: int, scales, act: int) -> None:
    """reduce_parts of two parts of width F into g and u (written), and h = gating(g, u)
    (act: the prelude's GATE_*) in the same dispatch."""
    dev.dispatch(dev.prepared(SHADER, "splitk_reduce_gated"), [part, s, g, u, h], groups=-(-N * F // 256),
                 params=PARTS.pack(N * F, slices, F, F, 0, *scales, 0.0, 0, act))


@dataclass(frozen=True)
class SplitSums:
    """The slices of a split product (the int8 forward, or the ternary input gradient) whose
    reduce is not yet dispatched: flush does it as reduce or reduce_parts, or a kernel that
    reads the outputs next adds them as it reads, one dispatch fewer (bitlinear_forward_parts'
    defer: rope_kv_store; bitlinear_backward_input's: the norm's backward after o_proj,
    up_proj and down_proj). part[slices, N, sum O_p] holds them; y_p (= or +=)
    (sum_z part) * scale_p (/ s[n] where s is given) is what the reduce would write: outs =
    ((O, scale, y),) for one projection, else three (O_p, scale_p, y_p), absent ones O_p = 0
    with a spare y_p, as reduce_parts takes them (always with s). Only a dispatch that does
    not use the scratch may come between the product and the kernel that reduces."""
    part: object
    s: object
    N: int
    slices: int
    outs: tuple
    accumulate: bool

    def flush(self, dev) -> None:
        """The reduce as the forward would have dispatched it."""
        if len(self.outs) == 1:
            (O, scale, y), = self.outs
            reduce(dev, self.part, self.s, y, self.N * O, self.slices, O, scale, self.accumulate)
        else:
            reduce_parts(dev, self.part, self.s, [y for _, _, y in self.outs], self.N, self.slices,
                         [O for O, _, _ in self.outs], [sc for _, sc, _ in self.outs], self.accumulate)
