"""Wrappers for shaders/matvec.wgsl: decoding's kernels for one row (N = 1) — the norm
before a BitLinear fused with its activation quantisation, the packed ternary
matrix-vector product of up to three projections sharing that input, and the output
head's dense matrix-vector product. They check sizes, pack the uniform and record
dispatches; the math and the packed activation layout are in the shader header.
On a CPU adapter (dev.kind "cpu"), and where rows are not whole 16-byte words, they
record the one-row-per-invocation variants (`*_rows`, `*_cpu`).
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from ._check import need, quads, spare
from .lora import cpu_rows, lora_down_parts
from .relu2 import gating_forward
from ._uniform import Uniform

SHADER = "matvec.wgsl"
NORM_QUANT = Uniform("NormQuantParams", "c:u32 eps:f32 r:u32 a0:u32 a1:u32 a2:u32")
MATVEC = Uniform("MatvecParams", "w4:u32 o0:u32 o1:u32 o2:u32 base1:u32 base2:u32 "
                                 "scale0:f32 scale1:f32 scale2:f32 accumulate:u32 r:u32 lora_scale:f32 b0:u32 b1:u32 b2:u32 "
                                 "rank4:u32 c:u32 eps:f32")
DENSE = Uniform("DenseParams", "c:u32 oc:u32 v0:u32 x0:u32")
WG, TPR, ROWS = 256, 16, 16    # matvec.wgsl MV_WG, MV_TPR (default), MV_ROWS
MAX_PARTS = 3
NONE = 0xFFFFFFFF   # "no LoRA on this part"


def _dense_constants(table_dtype: str) -> dict | None:
    if table_dtype not in ("f32", "bf16"):
        raise ValueError(f"dense_matvec: weight dtype {table_dtype!r} is not f32 or bf16")
    return {"MV_BF16": 1.0} if table_dtype == "bf16" else None


GATES = {"relu2": 1, "silu": 2}   # hidden_act -> matvec.wgsl NQ_GATE (the prelude's GATE_*)


def _gate_constants(act: str | None) -> dict | None:
    if act is not None and act not in GATES:
        raise ValueError(f"rmsnorm_quant: activation {act!r} is not one of {tuple(GATES)}")
    return {"NQ_GATE": GATES[act]} if act else None


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """The one-row-per-invocation kernels always (a GPU's fallback for odd widths), the
    GPU kernels unless kind is "cpu", the CPU norm unless kind is "gpu"; the GPU norm plain
    and gated by either activation (on a CPU its fallback where C % 4 != 0: not with
    `shapes` whose C and F are multiples of 4)."""
    c = _dense_constants(table_dtype)
    specs = [] if quads(shapes, "C", "F") else [(SHADER, e, _gate_constants(a)) for e in ("rmsnorm_quant", "rmsnorm_quant_down")
                                                for a in (None, *GATES)]
    specs += [(SHADER, "rmsnorm_quant_cpu")] if kind in (None, "cpu") else []
    specs += [(SHADER, "ternary_matvec_rows"), (SHADER, "dense_matvec_rows", c)]
    if kind in (None, "gpu"):
        specs += [(SHADER, "ternary_matvec"), (SHADER, "dense_matvec", c)]
        specs += [(SHADER, "norm_matvec", _nm_constants(a, b)) for a in (None, *GATES) for b in (1, *NM_BATCHES)]
    return specs


# norm_matvec: NM_BATCH blocks of WG // TPR rows per workgroup (each workgroup norms the row
# once for all of them) where the plain grid would have at least NM_BATCH_MIN_GROUPS
# workgroups: at 2B-4T, gate + up's 864 -> 216. H200 decoding, alternating runs in one call:
# 238.8 / 238.7 -> 242.9 / 243.3 tokens/s (the same ids); 8 blocks 228.7, 2 blocks for every
# projection 224.9; 2 blocks for down alone (after the four-column norm turns) 307.8 / 306.0
# against 306.4 / 307.4, not kept (docs/PERFORMANCE.md).
NM_BATCH = 4
NM_BATCH_MIN_GROUPS = 512
NM_BATCHES = (NM_BATCH,)   # the row-block counts nm_batch picks besides 1 (kernel_specs prepares them)


def nm_batch(groups: int) -> int:
    """Row blocks a norm_matvec workgroup takes for a plain grid of `groups`."""
    return NM_BATCH if groups >= NM_BATCH_MIN_GROUPS else 1


def _nm_constants(act: str | None, batch: int) -> dict | None:
    c = dict(_gate_constants(act) or {})
    if batch > 1:
        c["NM_BATCH"] = float(batch)
    return c or None


def xq_words(I: int) -> int:
    """u32 words of packed int8 activations for I inputs (a vec4 per 16 columns)."""
    return 4 * -(-I // 16)


def rmsnorm_quant(dev, x, w, y, xq, qs, C: int, eps: float, gate=None, down=None) -> None:
    """x[C], w[C] -> y[C] = w * x * rstd (rmsnorm_forward's bits on this device kind),
    xq[xq_words(C)] u32 (y quantised as actquant_forward does, packed), qs[2] = {s, sum q}.
    gate = (act, g[C], u[C]): the row is act(g) * u (ops.relu2.gating_forward's bits), in
    the same dispatch on a GPU; a CPU adapter writes it into x first (one more).
    down = (ab, [float offset of A_p in ab or None, per part], u[3R], R): also the LoRA
    down half of y, u[p*R + r] = A_p y (ops.lora.lora_down_parts' bits), in the same
    dispatch where the GPU kernel runs (rmsnorm_quant_down), after it on a CPU adapter."""
    for b, n, what in ((x, C, "x"), (w, C, "w"), (y, C, "y"), (xq, xq_words(C), "xq"), (qs, 2, "qs")):
        need(b, n, what, "rmsnorm_quant")
    if down is not None:
        ab, a_offsets, lu, R = down
        if not 1 <= len(a_offsets) <= MAX_PARTS:
            raise ValueError(f"rmsnorm_quant: 1 to {MAX_PARTS} LoRA parts, got {len(a_offsets)}")
        need(lu, MAX_PARTS * R, "u", "rmsnorm_quant")
        for a in a_offsets:
            if a is not None:
                need(ab, a + R * C, "ab (A)", "rmsnorm_quant")
    if dev.kind == "cpu" and C % 4 == 0:
        if gate is not None:
            gating_forward(dev, gate[0], gate[1], gate[2], x, C)
        dev.dispatch(dev.prepared(SHADER, "rmsnorm_quant_cpu"), [x, w, y, xq, qs], groups=1,
                     params=NORM_QUANT.pack(C, eps, 0, NONE, NONE, NONE))
        if down is not None:
            lora_down_parts(dev, y, ab, a_offsets, lu, C, R)
        return
    act, g, u = gate if gate is not None else (None, x, x)    # ungated: u unread (x stands in)
    need(u, C if gate else 1, "u", "rmsnorm_quant")
    if down is None:
        dev.dispatch(dev.prepared(SHADER, "rmsnorm_quant", _gate_constants(act)), [g, w, y, xq, qs, u], groups=1,
                     params=NORM_QUANT.pack(C, eps, 0, NONE, NONE, NONE))
        return
    a = [NONE if o is None else o for o in a_offsets] + [NONE] * (MAX_PARTS - len(a_offsets))
    dev.dispatch(dev.prepared(SHADER, "rmsnorm_quant_down", _gate_constants(act)), [g, w, y, xq, qs, u, ab, lu],
                 groups=MAX_PARTS * R + 1, params=NORM_QUANT.pack(C, eps, R, *a))


def ternary_matvec(dev, xq, qs, w, parts, I: int, accumulate: bool = False, lora=None) -> None:
    """Record y_p (= or +=) BitLinear of projection p for up to three projections of one
    input. xq[xq_words(I)], qs[2] from rmsnorm_quant; w the buffer (or view) holding every
    part's packed rows w_p[O_p, ceil(I/16)] u32; parts = [(word offset of w_p in w, O_p,
    scale_p, y_p[O_p]), ...]. lora = (u[3R], ab, R, scale, [float offset of B_p in ab or
    None, per part]) adds each adapted part's LoRA branch (u from lora.lora_down_parts)."""
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"ternary_matvec: 1 to {MAX_PARTS} parts, got {len(parts)}")
    words = -(-I // 16)
    need(xq, xq_words(I), "xq", "ternary_matvec")
    need(qs, 2, "qs", "ternary_matvec")
    for j, (off, O, _, y) in enumerate(parts):
        need(w, off + O * words, f"w (part {j})", "ternary_matvec")
        need(y, O, f"y{j}", "ternary_matvec")
    if parts[0][0] != 0:
        raise ValueError("ternary_matvec: the first part must start at word 0 of w")
    full = list(parts) + [(0, 0, 0.0, spare(dev, j)) for j in range(len(parts), MAX_PARTS)]
    vec4 = dev.kind == "gpu" and words % 4 == 0 and all(off % 4 == 0 for off, *_ in parts)
    unit = 4 if vec4 else 1
    rows = sum(O for _, O, _, _ in parts)
    (_, o0, s0, y0), (b1, o1, s1, y1), (b2, o2, s2, y2) = full
    if lora is None:
        u, ab, R, lscale, bs = spare(dev, MAX_PARTS), spare(dev, MAX_PARTS + 1), 0, 0.0, []
    else:
        u, ab, R, lscale, bs = lora
        need(u, MAX_PARTS * R, "u", "ternary_matvec")
        for (_, O, _, _), b in zip(parts, bs):
            if b is not None:
                need(ab, b + O * R, "ab (B)", "ternary_matvec")
    bs = [NONE if b is None else b for b in bs] + [NONE] * (MAX_PARTS - len(bs))
    # bit p: part p's LoRA sum in lora_up_rows' order (where lora.lora_up would run it)
    rank4 = sum(1 << j for j, (_, O, _, _) in enumerate(parts) if cpu_rows(dev, O, R)) if lora else 0
    params = MATVEC.pack(words // unit, o0, o1, o2, b1 // unit, b2 // unit, s0, s1, s2, int(accumulate),
                         R, lscale, *bs, rank4, 0, 0.0)
    if vec4:
        dev.dispatch(dev.prepared(SHADER, "ternary_matvec"), [xq, qs, w, y0, y1, y2, u, ab],
                     groups=-(-rows // (WG // TPR)), params=params)
    else:
        dev.dispatch(dev.prepared(SHADER, "ternary_matvec_rows"), [xq, qs, w, y0, y1, y2, u, ab],
                     groups=-(-rows // ROWS), params=params)


MAX_FUSED = 8192   # norm_matvec's widest row (matvec.wgsl nm_xq)


def fusable(dev, parts, I: int) -> bool:
    """Whether norm_matvec takes these parts [(word offset, ...), ...] of I inputs: the
    GPU kernels, whole vec4 words, I <= MAX_FUSED (and no LoRA: the caller's to know)."""
    words = -(-I // 16)
    return dev.kind == "gpu" and I <= MAX_FUSED and words % 4 == 0 and all(p[0] % 4 == 0 for p in parts)


def norm_matvec(dev, x, w, eps: float, wp, parts, I: int, accumulate: bool = False, gate=None,
                batch: int | None = None) -> None:
    """rmsnorm_quant and ternary_matvec (no LoRA) in one dispatch: y_p (= or +=) BitLinear
    of projection p of norm(x[I]) (w[I] the norm's weight; gate = (act, g[I], u[I]): the
    row is act(g) * u), the same bits, the normed row itself not kept. wp, parts as
    ternary_matvec's; `fusable` must hold. batch: row blocks a workgroup (1 or one of
    NM_BATCHES; default nm_batch's choice)."""
    if not 1 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"norm_matvec: 1 to {MAX_PARTS} parts, got {len(parts)}")
    if not fusable(dev, parts, I):
        raise ValueError(f"norm_matvec: needs the GPU kernels, I <= {MAX_FUSED} in whole vec4 words (I={I})")
    if parts[0][0] != 0:
        raise ValueError("norm_matvec: the first part must start at word 0 of w")
    words = -(-I // 16)
    act, g, u = gate if gate is not None else (None, x, x)
    for b, n, what in ((g, I, "x"), (w, I, "w"), (u, I, "u")):
        need(b, n, what, "norm_matvec")
    for j, (off, O, _, y) in enumerate(parts):
        need(wp, off + O * words, f"w (part {j})", "norm_matvec")
        need(y, O, f"y{j}", "norm_matvec")
    full = list(parts) + [(0, 0, 0.0, spare(dev, j)) for j in range(len(parts), MAX_PARTS)]
    (_, o0, s0, y0), (b1, o1, s1, y1), (b2, o2, s2, y2) = full
    params = MATVEC.pack(words // 4, o0, o1, o2, b1 // 4, b2 // 4, s0, s1, s2, int(accumulate), 0, 0.0,
                         NONE, NONE, NONE, 0, I, eps)
    groups = -(-(o0 + o1 + o2) // (WG // TPR))
    batch = nm_batch(groups) if batch is None else batch
    if batch not in (1, *NM_BATCHES):
        raise ValueError(f"norm_matvec: batch {batch} is not 1 or one of {NM_BATCHES}")
    dev.dispatch(dev.prepared(SHADER, "norm_matvec", _nm_constants(act, batch)), [g, w, wp, y0, y1, y2, u],
                 groups=-(-groups // batch), params=params)


def dense_matvec(dev, x, chunks, y, C: int, V: int, x_row0: int = 0) -> None:
    """y[V] = x[x_row0] W^T for one row of x[.., C], over W's row chunks [(v0, Vc, w), ...]
    (f32, or bf16 where `chunks.dtype` says so: model.RowTable); one dispatch per chunk."""
    dtype = getattr(chunks, "dtype", "f32")
    bf16 = dtype == "bf16"
    need(x, (x_row0 + 1) * C, "x", "dense_matvec")
    need(y, V, "y", "dense_matvec")
    x0 = x_row0 * C
    vec = dev.kind == "gpu" and C % (8 if bf16 else 4) == 0 and x0 % 4 == 0
    k = dev.prepared(SHADER, "dense_matvec" if vec else "dense_matvec_rows", _dense_constants(dtype))
    for v0, oc, w in chunks:
        need(w, -(-oc * C // 2) if bf16 else oc * C, "w", "dense_matvec")
        dev.dispatch(k, [x, w, y], groups=-(-oc // (WG // TPR if vec else ROWS)), params=DENSE.pack(C, oc, v0, x0))
