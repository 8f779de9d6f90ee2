"""Portable cases for the forward matmul kernels (shaders/bitlinear.wgsl and
linear.wgsl): each entry point (the 64 x 64 tiled one and the few-rows one) run on
the same inputs, so the pytest side (tests/test_forward_kernels.py) can compare both
with numpy and with each other; and for the row-wise forward kernels (RMSNorm, the
activation quantiser) per kernel variant. Standard library + bitlora only.
"""
import array

from bitlora import ops
from bitlora.ops import bitlinear, linear


def _buf(dev, code, vals, label):
    return dev.buffer(4 * max(len(vals), 1), label, data=array.array(code, vals) if vals else None)


async def _prepare(dev):
    """Compile every kernel the ops record, for f32 and bf16 tables (once per device), the
    int8 ones where it has them."""
    await dev.prepare(ops.kernel_specs("f32", int8=dev.int8_dot) + ops.kernel_specs("bf16"))


def pack_xq(xq, N, I):
    """xq[N, I] (integers in -128..127) -> the packed int8 words of prelude.wgsl's xq8
    (byte j of word 4g + k: column 16g + 4j + k; 0 past I)."""
    words = 4 * -(-I // 16)
    out = array.array("I", bytes(4 * N * words))
    for n in range(N):
        for e in range(words):
            c = (e // 4) * 16 + e % 4
            out[n * words + e] = sum((int(xq[n * I + c + 4 * j]) & 0xFF) << (8 * j)
                                     for j in range(4) if c + 4 * j < I)
    return out


def unpack_xq(words, N, I):
    """The inverse of pack_xq: a flat list of N*I floats."""
    per = 4 * -(-I // 16)
    out = []
    for n in range(N):
        for c in range(I):
            b = (words[n * per + (c // 16) * 4 + c % 4] >> (8 * ((c % 16) // 4))) & 0xFF
            out.append(float(b - 256 if b > 127 else b))
    return out


async def _words(dev, buf, n):
    out = array.array("I")
    out.frombytes(await dev.read(buf, 0, 4 * n))
    return list(out)


async def _get(dev, buf, n):
    out = array.array("f")
    out.frombytes(await dev.read(buf, 0, 4 * n))
    return list(out)


async def case_bitlinear_forward(dev, xq, s, packed, scale, y0, N, I, O, accumulate, kind="gpu", splits=(2, 3),
                                 int8=True):
    """y for every entry point of device `kind` ("gpu": {"bitlinear_forward": [...],
    "bitlinear_forward_rows": [...]} and "bitlinear_forward_i8" (64-row tiles) and
    "bitlinear_forward_i8_r32" (32) where the device has dot4I8Packed; "cpu": bitlinear_matmul_cpu on the transposed weights with each adapter's
    constants, bitlinear_forward_cpu where I % 4 == 0, and the rows kernel; "op_t": the op given
    the transposed weights), under "op" what ops.bitlinear.bitlinear_forward
    picked for this N on that kind (with dev.int8_dot off unless `int8`), and under
    "split<S>" the op with its reduction split in S slices (splitk.wgsl; the CPU kernel
    ignores it). "int8" says whether the op's activations were packed."""
    await _prepare(dev)
    bx, bs, bw = _buf(dev, "f", xq, "xq"), _buf(dev, "f", s, "s"), _buf(dev, "I", packed, "w")
    bx8 = dev.buffer(4 * N * bitlinear.xq_floats(I, True), "xq8", data=pack_xq(xq, N, I))
    words = -(-I // 16)
    out = {}
    params = bitlinear.FORWARD.pack(N, I, O, scale, int(accumulate), words, 0)
    # CPU: bitlinear_matmul_cpu on the transposed weights with the shader's constants (lavapipe's)
    # and every adapter's of ops.bitlinear.CPU_TILES and CPU_ALTERNATIVES; bitlinear_forward_cpu where I % 4 == 0
    if kind == "cpu":
        bwt = bitlinear.transpose_weights(dev, bw, O, I)
        for name, c in [("", None)] + list(bitlinear.CPU_TILES + bitlinear.CPU_ALTERNATIVES):
            y = _buf(dev, "f", y0, "y")
            bitlinear.cpu_matmul(dev, bx, bs, bwt, scale, y, N, I, O, accumulate, divide=True, consts=c or {})
            out[f"bitlinear_matmul_cpu {name}".strip()] = await _get(dev, y, N * O)
    tiles = -(-O // bitlinear.CPU_TILE)
    cpu = [("bitlinear_forward_cpu", "bitlinear_forward_cpu",
            bitlinear.cpu_groups(dev, N, tiles, bitlinear.CPU_FWD_ROWS, bitlinear.CPU_DEFAULT), None)]
    runs = {"gpu": [("bitlinear_forward", "bitlinear_forward", (-(-O // 64), -(-N // 64), 1), None)],
            "cpu": cpu if I % 4 == 0 else []}[kind]
    for key, entry, groups, consts in runs + [("bitlinear_forward_rows", "bitlinear_forward_rows",
                                               (-(-O // 64), -(-N // 8), 1), None)]:
        y = _buf(dev, "f", y0, "y")
        binds = [bx, bs, bw, y] + ([dev.buffer(4, "part")] if entry == "bitlinear_forward" else [])
        dev.dispatch(dev.prepared("bitlinear.wgsl", entry, consts), binds, groups=groups, params=params)
        out[key] = await _get(dev, y, N * O)
    for rows in (64, 32) if kind == "gpu" and dev.int8_dot else ():   # both tile heights
        y = _buf(dev, "f", y0, "y")
        dev.dispatch(dev.prepared("bitlinear_i8.wgsl", "bitlinear_forward_i8", bitlinear.i8_constants(rows)),
                     [bx8, bs, bw, y, dev.buffer(4, "part"), dev.buffer(4, "y1"), dev.buffer(4, "y2")],
                     groups=(-(-O // 64), -(-N // rows), 1),
                     params=bitlinear.FORWARD_I8.pack(N, I, O, scale, int(accumulate), words, 0, 0, 0, 0, 0, 0.0, 0.0))
        out["bitlinear_forward_i8" + ("" if rows == 64 else f"_r{rows}")] = await _get(dev, y, N * O)
    old, dev.kind, int8_old = dev.kind, kind, dev.int8_dot
    dev.int8_dot = int8_old and int8
    try:
        out["int8"] = bitlinear.packed_xq(dev, N)
        for key, split in [("op", None)] + [(f"split{n}", n) for n in splits]:
            y = _buf(dev, "f", y0, "y")
            bitlinear.bitlinear_forward(dev, bx8 if out["int8"] else bx, bs, bw, scale, y, N, I, O, accumulate,
                                        split=split)
            out[key] = await _get(dev, y, N * O)
        if kind == "cpu":   # the op as a model on a CPU records it: with the transposed weights
            y = _buf(dev, "f", y0, "y")
            bitlinear.bitlinear_forward(dev, bx, bs, bw, scale, y, N, I, O, accumulate, w_t=bwt)
            out["op_t"] = await _get(dev, y, N * O)
    finally:
        dev.kind, dev.int8_dot = old, int8_old
    return out


def _group(dev, parts):
    """The parts' packed words in one buffer, 256 bytes apart, as the model lays a group:
    (buffer, byte offsets)."""
    offs, off = [], 0
    for words, *_ in parts:
        offs.append(off)
        off += -(-4 * len(words) // 256) * 256
    wbuf = dev.buffer(off, "w_parts")
    for o, (words, *_) in zip(offs, parts):
        dev.write(wbuf, array.array("I", words), o)
    return wbuf, offs


def _spec(offs, parts, ys):
    """bitlinear_forward_parts' parts for a _group: (word offset, O, scale, y) each."""
    return [(o // 4, O, sc, y) for o, (_, O, sc, _), y in zip(offs, parts, ys)]


async def case_bitlinear_forward_parts(dev, xq, s, parts, N, I, accumulate, kind="gpu", int8=True, splits=(2, 3)):
    """parts = [[packed words, O, scale, y0], ...] (1-3 projections of one input), laid in
    one buffer 256 bytes apart as the model lays a group: {"op": [y_p...]} through
    ops.bitlinear.bitlinear_forward_parts (one int8 dispatch where the activations are
    packed), "split<S>" the same split in S slices, "apart" each part through
    bitlinear_forward; "int8" whether the activations were packed."""
    await _prepare(dev)
    wbuf, offs = _group(dev, parts)
    old, dev.kind, int8_old = dev.kind, kind, dev.int8_dot
    dev.int8_dot = int8_old and int8
    out = {}
    try:
        out["int8"] = packed = bitlinear.packed_xq(dev, N)
        bx = _buf(dev, "f", xq, "xq") if not packed else dev.buffer(4 * N * bitlinear.xq_floats(I, True), "xq8",
                                                                     data=pack_xq(xq, N, I))
        bs = _buf(dev, "f", s, "s")
        for key, split in [("op", None), ("apart", None)] + [(f"split{n}", n) for n in splits]:
            ys = [_buf(dev, "f", y0, f"y{j}") for j, (_, _, _, y0) in enumerate(parts)]
            if key == "apart":
                for o, (words, O, sc, _), y in zip(offs, parts, ys):
                    bitlinear.bitlinear_forward(dev, bx, bs, wbuf.view(o, 4 * len(words)), sc, y, N, I, O, accumulate)
            else:
                bitlinear.bitlinear_forward_parts(dev, bx, bs, wbuf, _spec(offs, parts, ys), N, I, accumulate, split)
            out[key] = [await _get(dev, y, N * O) for y, (_, O, _, _) in zip(ys, parts)]
    finally:
        dev.kind, dev.int8_dot = old, int8_old
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
            vec = linear.quad_views(dev, I, bx, w) if entry == "linear_forward" else []
            dev.dispatch(k, [bx, w, y] + vec, groups=groups(oc),
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
    with the kernels of `kind` ("gpu", or "cpu": the CPU variant where D % 4 == 0).
    pos0 arrives split: half in the uniform, the rest in the kv_pos buffer (decoding's)."""
    await _prepare(dev)
    from bitlora.ops.attention import attention_forward
    N = B * T
    out, lse = dev.buffer(4 * N * H * D, "out"), dev.buffer(4 * N * H, "lse")
    kind0, dev.kind = dev.kind, kind
    try:
        attention_forward(dev, _buf(dev, "f", q, "q"), _buf(dev, "f", k, "k"), _buf(dev, "f", v, "v"), out, lse,
                          B, T, H, Hkv, D, S or T, pos0 // 2, kv_pos=_buf(dev, "I", [pos0 - pos0 // 2], "kv_pos"))
    finally:
        dev.kind = kind0
    return {"out": await _get(dev, out, N * H * D), "lse": await _get(dev, lse, N * H)}


async def case_rmsnorm_forward(dev, x, w, N, C, eps, kind):
    """y[N, C] and rstd[N] of ops.rmsnorm.rmsnorm_forward with the `kind` variant."""
    await _prepare(dev)
    from bitlora.ops.rmsnorm import rmsnorm_forward
    y, rstd = dev.buffer(4 * N * C, "y"), dev.buffer(4 * N, "rstd")
    with dev.kind_as(kind):
        rmsnorm_forward(dev, _buf(dev, "f", x, "x"), _buf(dev, "f", w, "w"), y, rstd, N, C, eps)
    return {"y": await _get(dev, y, N * C), "rstd": await _get(dev, rstd, N)}


async def case_actquant_forward(dev, x, N, I, kind):
    """xq[N, I] and s[N] of ops.bitlinear.actquant_forward with the `kind` variant
    (unpacked where it wrote packed int8: "packed" says so)."""
    await _prepare(dev)
    xq, s = dev.buffer(4 * N * max(I, bitlinear.xq_floats(I, True)), "xq"), dev.buffer(4 * N, "s")
    with dev.kind_as(kind):
        packed = bitlinear.packed_xq(dev, N)
        bitlinear.actquant_forward(dev, _buf(dev, "f", x, "x"), xq, s, N, I)
    return {"xq": await _xq(dev, xq, N, I, packed), "s": await _get(dev, s, N), "packed": packed}


async def _xq(dev, buf, N, I, packed):
    if packed:
        return unpack_xq(await _words(dev, buf, N * bitlinear.xq_floats(I, True)), N, I)
    return await _get(dev, buf, N * I)


async def case_rmsnorm_quant_forward(dev, x, w, N, C, eps, kind, int8=True):
    """y, rstd, xq (unpacked), s of ops.rmsnorm.rmsnorm_quant_forward with the `kind`
    variant (int8: leave dev.int8_dot as it is, else off), and the same of
    rmsnorm_forward + actquant_forward under "two_ops"."""
    await _prepare(dev)
    from bitlora.ops.rmsnorm import rmsnorm_forward, rmsnorm_quant_forward
    bx, bw = _buf(dev, "f", x, "x"), _buf(dev, "f", w, "w")
    out = {}
    int8_old = dev.int8_dot
    try:
        dev.int8_dot = int8_old and int8
        for key in ("fused", "two_ops"):
            y, rstd, s = dev.buffer(4 * N * C, "y"), dev.buffer(4 * N, "rstd"), dev.buffer(4 * N, "s")
            xq = dev.buffer(4 * N * max(C, bitlinear.xq_floats(C, True)), "xq")
            with dev.kind_as(kind):
                packed = bitlinear.packed_xq(dev, N)
                if key == "fused":
                    rmsnorm_quant_forward(dev, bx, bw, y, rstd, xq, s, N, C, eps)
                else:
                    rmsnorm_forward(dev, bx, bw, y, rstd, N, C, eps)
                    bitlinear.actquant_forward(dev, y, xq, s, N, C)
            out[key] = {"y": await _get(dev, y, N * C), "rstd": await _get(dev, rstd, N),
                        "xq": await _xq(dev, xq, N, C, packed), "s": await _get(dev, s, N), "packed": packed}
    finally:
        dev.int8_dot = int8_old
    return out


async def case_forward_gated(dev, xq, s, parts, N, I, act, splits=(1, 3)):
    """The MLP's gate and up projections (parts as case_bitlinear_forward_parts', two of
    one width F) and their gating h = act(g) * u, on a GPU kind: "split<S>" through
    bitlinear_forward_parts with gate (the gating inside the reduce where split, else its
    own dispatch), "apart<S>" the same product, then relu2.gating_forward. Each: g, u, h."""
    await _prepare(dev)
    from bitlora.ops.relu2 import gating_forward
    F = parts[0][1]
    wbuf, offs = _group(dev, parts)
    bx = dev.buffer(4 * N * bitlinear.xq_floats(I, True), "xq8", data=pack_xq(xq, N, I))
    bs = _buf(dev, "f", s, "s")
    out = {}
    with dev.kind_as("gpu"):
        out["int8"] = bitlinear.packed_xq(dev, N)
        for split in splits:
            for key in ("split", "apart"):
                g, u, h = (dev.buffer(4 * N * F, name) for name in "guh")
                spec = _spec(offs, parts, (g, u))
                if key == "split":
                    bitlinear.bitlinear_forward_parts(dev, bx, bs, wbuf, spec, N, I, False, split, gate=(act, h))
                else:
                    bitlinear.bitlinear_forward_parts(dev, bx, bs, wbuf, spec, N, I, False, split)
                    gating_forward(dev, act, g, u, h, N * F)
                out[f"{key}{split}"] = [await _get(dev, b, N * F) for b in (g, u, h)]
    return out


async def case_rope_after_split(dev, xq, s, parts, I, B, T, H, Hkv, D, S, pos0, split=3):
    """The int8 forward of q, k, v (parts as case_bitlinear_forward_parts', widths H*D,
    Hkv*D, Hkv*D) split in `split` slices, then ops.rope.rope_kv_store, on a GPU kind:
    "fused" with the forward's reduce deferred into rope_kv_store, "apart" with its own
    dispatch. Each: q (rotated) and both caches (filled with 7 before)."""
    await _prepare(dev)
    from bitlora.ops.rope import rope_kv_store, rope_tables
    N, W = B * T, Hkv * D
    wbuf, offs = _group(dev, parts)
    bx = dev.buffer(4 * N * bitlinear.xq_floats(I, True), "xq8", data=pack_xq(xq, N, I))
    bs = _buf(dev, "f", s, "s")
    cos, sin = rope_tables(pos0 + T, D, 10000.0)
    bc, bsin = _buf(dev, "f", cos, "cos"), _buf(dev, "f", sin, "sin")
    out = {}
    with dev.kind_as("gpu"):
        out["int8"] = bitlinear.packed_xq(dev, N)
        for key in ("fused", "apart"):
            ys = [dev.buffer(4 * N * O, f"y{j}") for j, (_, O, _, _) in enumerate(parts)]
            kc, vc = _buf(dev, "f", [7.0] * (B * S * W), "kc"), _buf(dev, "f", [7.0] * (B * S * W), "vc")
            sums = bitlinear.bitlinear_forward_parts(dev, bx, bs, wbuf, _spec(offs, parts, ys), N, I, False, split,
                                                     defer=key == "fused")
            out[key + "_deferred"] = sums is not None
            rope_kv_store(dev, *ys, kc, vc, bc, bsin, B, T, H, Hkv, D, S, pos0, sums=sums)
            out[key] = {"q": await _get(dev, ys[0], N * H * D), "kc": await _get(dev, kc, B * S * W),
                        "vc": await _get(dev, vc, B * S * W)}
    return out


async def case_int8_dot(dev):
    """Whether dot4I8Packed compiles and computes on this device, beside what the device
    decided (Device.int8_dot): the two must agree."""
    code = """@group(0) @binding(0) var<storage, read_write> o: array<i32>;
@compute @workgroup_size(1) fn main() { o[0] = dot4I8Packed(0x01020304u, 0xff7f8001u); o[1] = dot4I8Packed(0x80808080u, 0x81818181u); }"""
    try:
        k = await dev.compile(code, "main")
    except Exception as e:  # noqa: BLE001 - the compiler's refusal is the answer
        return {"int8_dot": dev.int8_dot, "compiles": False, "error": str(e)}
    out = dev.buffer(8, "out")
    dev.dispatch(k, [out], groups=1)
    got = array.array("i")
    got.frombytes(await dev.read(out))
    return {"int8_dot": dev.int8_dot, "compiles": True, "values": list(got)}

