"""Wrappers for shaders/attention.wgsl: causal GQA attention over a KV cache (forward),
the KV-cache store, and the backward over whole sequences. They check sizes, pack the
uniform and record dispatches; the math is in the shader header. On a CPU adapter
(dev.kind "cpu") the forward and backward record the CPU variants where D % 4 == 0:
`*_d32` (4 rows per invocation, a row in registers) where D <= 32, else the per-row
`*_rows`; elsewhere the kernels shaped for GPUs: where T > 1 blocks of 32 query rows (or
keys) where D % 4 == 0 and D <= 128 (`*_q32`), else of 8 (attention_forward_tiled and the
8-row backward); one workgroup per query row when decoding.
Browser-safe: standard library + bitlora only."""
from __future__ import annotations

from . import splitk
from ._check import need
from ._uniform import Uniform

SHADER = "attention.wgsl"
FORWARD = Uniform("AttentionParams", "b:u32 t:u32 h:u32 hkv:u32 d:u32 s:u32 pos0:u32 scale:f32")
KV_STORE = Uniform("KvStoreParams", "b:u32 t:u32 s:u32 w:u32 pos0:u32")
KV_ADVANCE = Uniform("KvAdvanceParams", "t:u32")
BACKWARD = Uniform("AttentionBackwardParams", "b:u32 t:u32 h:u32 hkv:u32 d:u32 scale:f32")


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """The GPU kernels (the CPU's fallback where D % 4 != 0; the tiled forward unless kind is
    "cpu") and the CPU variants; with `shapes`, the one CPU variant its D picks."""
    entries = ["attention_forward"] + (["attention_backward_dq", "attention_backward_dkv"] if training else [])
    # the GPU dq with out and lse (no CPU variant), and the 32 x 32 tiles of the backward
    gpu_saved = ["attention_backward_dqs", "attention_backward_dqs_q32", "attention_backward_dkv_q32"] if training else []
    always = ["kv_store", "kv_advance"]
    saved = ["attention_backward_dq_d32s"] if training else []   # the model's: with out and lse
    if shapes is not None and shapes["D"] % 4 == 0:
        if shapes["D"] <= 32:
            return [(SHADER, e) for e in always + ["attention_forward_d32"] +
                    (["attention_backward_dkv_d32"] + saved if training else [])]
        return [(SHADER, e) for e in always + [e + "_rows" for e in entries]]
    tiled = ["attention_forward_tiled", "attention_forward_q32"] if kind in (None, "gpu") else []
    cpu = [e + v for v in ("_rows", "_d32") for e in entries] + saved if kind in (None, "cpu") else []
    return [(SHADER, e) for e in entries + gpu_saved + always + tiled + cpu]


ROWS_WG = 16   # invocations per workgroup of the CPU variants (AR in the shader)
TILE_ROWS = 8  # query rows per workgroup of attention_forward_tiled and the backward (AO in the shader)
Q32_ROWS = 32  # query rows per workgroup of attention_forward_q32 (FQ in the shader)
Q32_MAX_D = 128   # ... which takes D % 4 == 0 up to this
D32_ROWS = 4   # rows per invocation of the *_d32 variants (AB in the shader)


def _variant(dev, D: int) -> str:
    """The entry points' suffix: "_d32" or "_rows" on a CPU adapter where D % 4 == 0
    (D <= 32 for "_d32"), else "" (the GPU kernels)."""
    if dev.kind != "cpu" or D % 4:
        return ""
    return "_d32" if D <= 32 else "_rows"


def _q32(D: int) -> bool:
    """Whether the GPU kernels in blocks of 32 rows (*_q32) take head dim D."""
    return D % 4 == 0 and D <= Q32_MAX_D


def scratch_floats(N: int, H: int, Hkv: int, D: int, kind: str = "gpu") -> int:
    """The split-K scratch (floats) attention_backward needs: the query heads' shares of
    dk, dv where several share a KV head (attention_backward_dkv_q32)."""
    return 2 * H * N * D + 64 if kind != "cpu" and _q32(D) and H > Hkv else 1


def _groups(variant: str, B: int, T: int, heads: int):
    """Workgroups of a kernel with `heads` owned rows per position (H, or Hkv for dkv)."""
    if variant == "_d32":
        return -(-B * -(-T // D32_ROWS) * heads // ROWS_WG)
    return -(-B * T * heads // ROWS_WG)


def zero_pos(dev):
    """A 16-byte buffer of zeros: the kv_pos bound where positions come from pos0 alone,
    and attention_forward's unread vec4 view of k where D % 4 != 0."""
    buf = getattr(dev, "_zero_kv_pos", None)
    if buf is None:
        buf = dev._zero_kv_pos = dev.buffer(16, "zero_kv_pos")
    return buf


def kv_advance(dev, kv_pos, T: int) -> None:
    """kv_pos[0] += T on the GPU (a KV cache's length after a forward of T tokens)."""
    need(kv_pos, 1, "kv_pos", "kv_advance")
    dev.dispatch(dev.prepared(SHADER, "kv_advance"), [kv_pos], groups=1, params=KV_ADVANCE.pack(T))


def attention_forward(dev, q, k_cache, v_cache, out, lse, B: int, T: int, H: int, Hkv: int, D: int,
                      S: int, pos0: int = 0, scale: float | None = None, kv_pos=None) -> None:
    """q[N, H*D] (post-RoPE, N = B*T), k_cache, v_cache[B, S, Hkv*D] holding positions
    0..pos0+T-1 -> out[N, H*D], lse[N, H]. scale defaults to D**-0.5 (HF). kv_pos: a
    GPU buffer whose u32 [0] is added to pos0 as the kernel runs (decoding: the cache's
    length, so one recorded step serves every position); the caller keeps pos0 + it + T <= S."""
    N = B * T
    if D > 256 or H % Hkv or pos0 + T > S:
        raise ValueError(f"attention_forward: need D <= 256, H % Hkv == 0, pos0 + T <= S "
                         f"(D={D}, H={H}, Hkv={Hkv}, pos0={pos0}, T={T}, S={S})")
    for b, n, what in ((q, N * H * D, "q"), (k_cache, B * S * Hkv * D, "k_cache"),
                       (v_cache, B * S * Hkv * D, "v_cache"), (out, N * H * D, "out"), (lse, N * H, "lse")):
        need(b, n, what, "attention_forward")
    if kv_pos is not None:
        need(kv_pos, 1, "kv_pos", "attention_forward")
    variant = _variant(dev, D)
    params = FORWARD.pack(B, T, H, Hkv, D, S, pos0, D ** -0.5 if scale is None else scale)
    pos = kv_pos if kv_pos is not None else zero_pos(dev)
    if not variant and dev.kind != "cpu" and T > 1:   # whole sequences, prompts: blocks of query rows
        rows, entry = (Q32_ROWS, "attention_forward_q32") if _q32(D) else (TILE_ROWS, "attention_forward_tiled")
        dev.dispatch(dev.prepared(SHADER, entry), [q, k_cache, v_cache, out, lse, pos],
                     groups=B * -(-T // rows) * H, params=params)
        return
    binds = [q, k_cache, v_cache, out, lse, pos]
    if not variant:   # the GPU kernel reads a key row as 16-byte words where D % 4 == 0
        binds.append(k_cache if D % 4 == 0 else zero_pos(dev))
    dev.dispatch(dev.prepared(SHADER, "attention_forward" + variant), binds,
                 groups=_groups(variant, B, T, H) if variant else N * H, params=params)


def kv_store(dev, k, v, k_cache, v_cache, B: int, T: int, S: int, W: int, pos0: int = 0) -> None:
    """k, v[N, W] (N = B*T, W = Hkv*D) -> k_cache, v_cache[B, S, W] at positions pos0..pos0+T-1."""
    if pos0 + T > S:
        raise ValueError(f"kv_store: positions {pos0}..{pos0 + T - 1} do not fit a cache of S={S}")
    for b, n, what in ((k, B * T * W, "k"), (v, B * T * W, "v"), (k_cache, B * S * W, "k_cache"),
                       (v_cache, B * S * W, "v_cache")):
        need(b, n, what, "kv_store")
    dev.dispatch(dev.prepared(SHADER, "kv_store"), [k, v, k_cache, v_cache], groups=-(-B * T * W // 256),
                 params=KV_STORE.pack(B, T, S, W, pos0))


def attention_backward(dev, dout, q, k, v, dq, dk, dv, stats, B: int, T: int, H: int, Hkv: int,
                       D: int, scale: float | None = None, out=None, lse=None) -> None:
    """Causal GQA attention backward over all positions. dout, q[N, H*D]; k, v[N, Hkv*D]
    (q, k post-RoPE) -> dq[N, H*D], dk, dv[N, Hkv*D] (overwrite); stats[N, H, 2] scratch.
    scale defaults to D**-0.5 (HF). `out`[N, H*D] and `lse`[N, H], the forward's (of these
    q, k, v and scale), spare the GPU kernel and the *_d32 CPU variant a sweep over the keys
    (attention_backward_dqs, attention_backward_dq_d32s: (lse, Dsum = dout . out) per row)."""
    N = B * T
    if D > 256 or H % Hkv:
        raise ValueError(f"attention_backward: need D <= 256 and H % Hkv == 0 (D={D}, H={H}, Hkv={Hkv})")
    for b, n, what in ((dout, N * H * D, "dout"), (q, N * H * D, "q"), (k, N * Hkv * D, "k"),
                       (v, N * Hkv * D, "v"), (dq, N * H * D, "dq"), (dk, N * Hkv * D, "dk"),
                       (dv, N * Hkv * D, "dv"), (stats, N * H * 2, "stats")):
        need(b, n, what, "attention_backward")
    saved = out is not None and lse is not None
    if saved:
        need(out, N * H * D, "out", "attention_backward")
        need(lse, N * H, "lse", "attention_backward")
    params = BACKWARD.pack(B, T, H, Hkv, D, D ** -0.5 if scale is None else scale)
    variant = _variant(dev, D)
    if variant == "_d32" and saved:
        dev.dispatch(dev.prepared(SHADER, "attention_backward_dq_d32s"), [dout, q, k, v, dq, stats, out, lse],
                     groups=_groups(variant, B, T, H), params=params)
    elif variant:
        dev.dispatch(dev.prepared(SHADER, "attention_backward_dq" + variant), [dout, q, k, v, dq, stats],
                     groups=_groups(variant, B, T, H), params=params)
    if variant:
        dev.dispatch(dev.prepared(SHADER, "attention_backward_dkv" + variant), [dout, q, k, v, stats, dk, dv],
                     groups=_groups(variant, B, T, Hkv), params=params)
        return
    blocks = B * -(-T // TILE_ROWS)   # 8-row blocks, never straddling sequences
    q32 = _q32(D)
    if q32 and saved:
        dev.dispatch(dev.prepared(SHADER, "attention_backward_dqs_q32"), [dout, q, k, v, dq, stats, out, lse],
                     groups=B * -(-T // Q32_ROWS) * H, params=params)
    else:
        dev.dispatch(dev.prepared(SHADER, "attention_backward_dqs" if saved else "attention_backward_dq"),
                     [dout, q, k, v, dq, stats] + ([out, lse] if saved else []), groups=blocks * H, params=params)
    if not q32:
        dev.dispatch(dev.prepared(SHADER, "attention_backward_dkv"), [dout, q, k, v, stats, dk, dv],
                     groups=blocks * Hkv, params=params)
        return
    # one workgroup per query head and 32 keys; where heads share a KV head, their shares
    # of dk, dv go to scratch slices [H/Hkv, N, Hkv*D] and are added up after
    rep, n = H // Hkv, N * Hkv * D
    parts = (dk, dv)
    if rep > 1:
        size = 4 * rep * n
        off = -(-size // 256) * 256   # a storage binding's offset: a multiple of 256 suits every device
        buf = splitk.scratch(dev, (off + size) // 4)
        parts = (buf.view(0, size), buf.view(off, size))
    dev.dispatch(dev.prepared(SHADER, "attention_backward_dkv_q32"), [dout, q, k, v, stats, *parts],
                 groups=B * -(-T // Q32_ROWS) * H, params=params)
    if rep > 1:
        for part, y in zip(parts, (dk, dv)):
            splitk.reduce(dev, part, None, y, n, rep, 1, 1.0, False)
