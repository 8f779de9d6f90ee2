"""Portable cases for the forward matmul kernels (shaders/bitlinear.wgsl and
linear.wgsl): each entry point (the 64 x 64 tiled one and the few-rows one) run on
the same inputs, so the pytest side (tests/test_forward_kernels.py) can compare both
with numpy and with each other; and for the row-wise forward kernels (RMSNorm, the
activation quantiser) per kernel variant. Standard library + bitlora only.
"""
import array
import contextlib

from bitlora import ops
from bitlora.ops import bitlinear, linear


def _buf(dev, code, vals, label):
    return dev.buffer(4 * max(len(vals), 1), label, data=array.array(code, vals) if vals else None)


async def _prepare(dev):
    """Compile every kernel the ops record, for f32 and bf16 tables (once per device)."""
    await dev.prepare(ops.kernel_specs("f32") + ops.kernel_specs("bf16"))


async def _get(dev, buf, n):
    out = array.array("f")
    out.frombytes(await dev.read(buf, 0, 4 * n))
    return list(out)


async def case_bitlinear_forward(dev, xq, s, packed, scale, y0, N, I, O, accumulate, kind="gpu", splits=(2, 3)):
    """y for every entry point of device `kind` ("gpu": {"bitlinear_forward": [...],
    "bitlinear_forward_rows": [...]}; "cpu": bitlinear_forward_cpu with each adapter's
    constants where I % 4 == 0, and the rows kernel),
    under "op" what ops.bitlinear.bitlinear_forward picked for this N on that kind, and
    under "split<S>" the op with its reduction split in S slices (splitk.wgsl; the CPU
    kernel ignores it)."""
    await _prepare(dev)
    bx, bs, bw = _buf(dev, "f", xq, "xq"), _buf(dev, "f", s, "s"), _buf(dev, "I", packed, "w")
    words = -(-I // 16)
    params = bitlinear.FORWARD.pack(N, I, O, scale, int(accumulate), words, 0)
    # CPU (I % 4 == 0): the default workgroup (lavapipe's) and every adapter's of ops.bitlinear.CPU_TILES
    tiles = -(-O // bitlinear.CPU_TILE)
    rows = bitlinear.CPU_FWD_ROWS
    cpu = [("bitlinear_forward_cpu", "bitlinear_forward_cpu",
            bitlinear.cpu_groups(dev, N, tiles, rows, bitlinear.CPU_DEFAULT), None)]
    cpu += [(f"bitlinear_forward_cpu {name}", "bitlinear_forward_cpu", bitlinear.cpu_groups(dev, N, tiles, rows, c), c)
            for name, c in bitlinear.CPU_TILES]
    runs = {"gpu": [("bitlinear_forward", "bitlinear_forward", (-(-O // 64), -(-N // 64), 1), None)],
            "cpu": cpu if I % 4 == 0 else []}[kind]
    out = {}
    for key, entry, groups, consts in runs + [("bitlinear_forward_rows", "bitlinear_forward_rows",
                                               (-(-O // 64), -(-N // 8), 1), None)]:
        y = _buf(dev, "f", y0, "y")
        binds = [bx, bs, bw, y] + ([dev.buffer(4, "part")] if entry == "bitlinear_forward" else [])
        dev.dispatch(dev.prepared("bitlinear.wgsl", entry, consts), binds, groups=groups, params=params)
        out[key] = await _get(dev, y, N * O)
    old, dev.kind = dev.kind, kind
    try:
        for key, split in [("op", None)] + [(f"split{n}", n) for n in splits]:
            y = _buf(dev, "f", y0, "y")
            bitlinear.bitlinear_forward(dev, bx, bs, bw, scale, y, N, I, O, accumulate, split=split)
            out[key] = await _get(dev, y, N * O)
    finally:
        dev.kind = old
    return out


class _Chunks(list):
    """Weight chunks [(v0, Oc, buffer), ...] with the table's dtype (as model.RowTable)."""
    def __init__(self, items, dtype):
        super().__init__(items)
        self.dtype = dtype


async def case_linear_forward(dev, x, w_chunks, N, I, O, x_row0, x_step, kind="gpu", w_dtype="f32"):
    """logits for every entry point of linear.wgsl of device `kind` (the tiled one of
    that kind, the CPU one where I % 4 == 0, and the few-rows one) over a weight split in row chunks
    (w_chunks = [[v0, Oc, floats or bf16 words], ...]), and through ops.linear.linear_forward."""
    await _prepare(dev)
    bx = _buf(dev, "f", x, "x")
    code = "f" if w_dtype == "f32" else "I"        # bf16: the chunk's u32 words of bf16 pairs
    chunks = _Chunks([(v0, oc, _buf(dev, code, vals, f"w{v0}")) for v0, oc, vals in w_chunks], w_dtype)
    consts = {"LN_BF16": 1.0} if w_dtype == "bf16" else None
    tiles = {"gpu": [("linear_forward", lambda oc: (-(-oc // 64), -(-N // 64), 1))],
             "cpu": [("linear_forward_cpu", lambda oc: linear.cpu_groups(N, oc))] if I % 4 == 0 else []}[kind]
    out = {}
    for entry, groups in tiles + [("linear_forward_rows", lambda oc: (-(-oc // 64), -(-N // 8), 1))]:
        y = dev.buffer(4 * N * O, "y")
        k = dev.prepared("linear.wgsl", entry, consts)
        for v0, oc, w in chunks:
            dev.dispatch(k, [bx, w, y], groups=groups(oc),
                         params=linear.FORWARD.pack(N, I, oc, O, v0, x_row0, x_step))
        out[entry] = await _get(dev, y, N * O)
    y = dev.buffer(4 * N * O, "y")
    old, dev.kind = dev.kind, kind
    try:
        linear.linear_forward(dev, bx, chunks, y, N, I, O, x_row0, x_step)
    finally:
        dev.kind = old
    out["op"] = await _get(dev, y, N * O)
    return out


async def case_attention_forward(dev, q, k, v, B, T, H, Hkv, D, kind="gpu", pos0=0, S=None):
    """Causal GQA attention of T new tokens per sequence at positions pos0.. over a cache
    k, v[B, S, Hkv*D] (default S = T, pos0 = 0: a whole sequence batch): out and lse,
    with the kernels of `kind` ("gpu", or "cpu": the CPU variant where D % 4 == 0)."""
    await _prepare(dev)
    from bitlora.ops.attention import attention_forward
    N = B * T
    out, lse = dev.buffer(4 * N * H * D, "out"), dev.buffer(4 * N * H, "lse")
    kind0, dev.kind = dev.kind, kind
    try:
        attention_forward(dev, _buf(dev, "f", q, "q"), _buf(dev, "f", k, "k"), _buf(dev, "f", v, "v"), out, lse,
                          B, T, H, Hkv, D, S or T, pos0)
    finally:
        dev.kind = kind0
    return {"out": await _get(dev, out, N * H * D), "lse": await _get(dev, lse, N * H)}


@contextlib.contextmanager
def _kind(dev, kind):
    """Record with dev.kind = kind ("gpu" or "cpu": the ops pick their variant from it)."""
    kind0, dev.kind = dev.kind, kind
    try:
        yield
    finally:
        dev.kind = kind0


async def case_rmsnorm_forward(dev, x, w, N, C, eps, kind):
    """y[N, C] and rstd[N] of ops.rmsnorm.rmsnorm_forward with the `kind` variant."""
    await _prepare(dev)
    from bitlora.ops.rmsnorm import rmsnorm_forward
    y, rstd = dev.buffer(4 * N * C, "y"), dev.buffer(4 * N, "rstd")
    with _kind(dev, kind):
        rmsnorm_forward(dev, _buf(dev, "f", x, "x"), _buf(dev, "f", w, "w"), y, rstd, N, C, eps)
    return {"y": await _get(dev, y, N * C), "rstd": await _get(dev, rstd, N)}


async def case_actquant_forward(dev, x, N, I, kind):
    """xq[N, I] and s[N] of ops.bitlinear.actquant_forward with the `kind` variant."""
    await _prepare(dev)
    xq, s = dev.buffer(4 * N * I, "xq"), dev.buffer(4 * N, "s")
    with _kind(dev, kind):
        bitlinear.actquant_forward(dev, _buf(dev, "f", x, "x"), xq, s, N, I)
    return {"xq": await _get(dev, xq, N * I), "s": await _get(dev, s, N)}
