"""Portable cases for decoding's one-row kernels (shaders/matvec.wgsl, sample.wgsl):
each run beside the kernels it stands in for on the same inputs (rmsnorm + actquant +
bitlinear_forward; linear_forward), with the device's kind forced, so the pytest side
(tests/test_decode_kernels.py) can compare them bit for bit and with numpy.
Standard library + bitlora only."""
import array
import struct

from bitlora import ops
from bitlora.ops import bitlinear, matvec, sample
from bitlora.ops.linear import linear_forward
from bitlora.ops.rmsnorm import rmsnorm_forward


def _buf(dev, code, vals, label, size=None):
    return dev.buffer(size or 4 * max(len(vals), 1), label, data=array.array(code, vals) if vals else None)


async def _get(dev, buf, n, code="f"):
    out = array.array(code)
    out.frombytes(await dev.read(buf, 0, 4 * n))
    return list(out)


async def case_norm_quant_matvec(dev, x, w, C, eps, parts, accumulate, kind, loras=None, R=0, lora_scale=0.0,
                                 act=None, u=None):
    """parts = [[packed words, O, scale, y0], ...] (1-3 projections of C inputs), laid in
    one buffer 256 bytes apart as the model lays them. Returns the new path's
    (rmsnorm_quant + ternary_matvec) y, xq words, qs and outputs, and the outputs and
    norm of the kernels it replaces (rmsnorm_forward, actquant_forward, bitlinear_forward).
    loras = [[A[R, C], B[O, R]] or None per part]: each adapted part's LoRA branch, fused
    (its down half in rmsnorm_quant, its up half in the matvec) and as lora_forward adds
    it; "u" / "u_apart": the down half's u from rmsnorm_quant and from lora_down_parts. act ("relu2" or "silu")
    with u[C]: x is the MLP's gate and the row normed act(x) * u (gating_forward first)."""
    from bitlora.ops.relu2 import gating_forward
    from bitlora.ops import lora as lora_ops
    for t in ("f32",):
        await dev.prepare(ops.kernel_specs(t))
    bx, bw = _buf(dev, "f", x, "x"), _buf(dev, "f", w, "w")
    offs, off = [], 0
    for words, *_ in parts:
        offs.append(off)
        off += -(-4 * len(words) // 256) * 256
    wbuf = dev.buffer(off, "w_parts")
    for o, (words, *_) in zip(offs, parts):
        dev.write(wbuf, array.array("I", words), o)
    loras = loras or [None] * len(parts)
    ab_offs, flat = [], []
    for ab in loras:                     # an arena: tensors 64 floats apart
        if ab is None:
            ab_offs.append(None)
            continue
        pair = []
        for t in ab:
            pair.append(len(flat))
            flat += list(t) + [0.0] * (-len(t) % 64)
        ab_offs.append(pair)
    arena = _buf(dev, "f", flat, "arena")
    out = {}
    with dev.kind_as(kind):
        y, xq, qs = dev.buffer(4 * C, "y"), dev.buffer(4 * matvec.xq_words(C), "xq"), dev.buffer(8, "qs")
        bu = _buf(dev, "f", u, "u") if act else None
        h = dev.buffer(4 * C, "h_new") if act else bx       # where a CPU adapter puts act(x) * u
        fused = down = None
        if any(loras):   # the down half beside the norm (one dispatch on a GPU), and apart
            u = dev.buffer(4 * 3 * R, "u")
            down = (arena, [o and o[0] for o in ab_offs], u, R)
            fused = (u, arena, R, lora_scale, [o and o[1] for o in ab_offs])
        matvec.rmsnorm_quant(dev, h, bw, y, xq, qs, C, eps, (act, bx, bu) if act else None, down)
        if any(loras):
            u2 = dev.buffer(4 * 3 * R, "u2")
            lora_ops.lora_down_parts(dev, y, arena, down[1], u2, C, R)
            out["u"], out["u_apart"] = await _get(dev, u, 3 * R), await _get(dev, u2, 3 * R)
        ys = [_buf(dev, "f", y0, f"y{j}") for j, (_, _, _, y0) in enumerate(parts)]
        matvec.ternary_matvec(dev, xq, qs, wbuf, [(o // 4, O, sc, yb) for o, (_, O, sc, _), yb in zip(offs, parts, ys)],
                              C, accumulate, fused)
        out["y"] = await _get(dev, y, C)
        wparts = [(o // 4, O, sc, _buf(dev, "f", y0, f"fy{j}")) for j, (o, (_, O, sc, y0)) in enumerate(zip(offs, parts))]
        if not any(loras) and matvec.fusable(dev, wparts, C):   # norm and product in one dispatch
            matvec.norm_matvec(dev, bx, bw, eps, wbuf, wparts, C, accumulate, (act, bx, bu) if act else None)
            out["fused_out"] = [await _get(dev, yb, O) for _, O, _, yb in wparts]
            for b in matvec.NM_BATCHES:   # the same with b blocks of rows a workgroup, at any grid size
                bparts = [(o // 4, O, sc, _buf(dev, "f", y0, f"by{j}")) for j, (o, (_, O, sc, y0)) in enumerate(zip(offs, parts))]
                matvec.norm_matvec(dev, bx, bw, eps, wbuf, bparts, C, accumulate, (act, bx, bu) if act else None, batch=b)
                out[f"fused_batched{b}_out"] = [await _get(dev, yb, O) for _, O, _, yb in bparts]
        out["xq"] = await _get(dev, xq, matvec.xq_words(C), "I")
        out["qs"] = await _get(dev, qs, 2)
        out["out"] = [await _get(dev, yb, O) for yb, (_, O, _, _) in zip(ys, parts)]
        n, rstd = dev.buffer(4 * C, "n"), dev.buffer(4, "rstd")
        fq, s = dev.buffer(4 * C, "fq"), dev.buffer(4, "s")
        if act:
            h = dev.buffer(4 * C, "h")
            gating_forward(dev, act, bx, bu, h, C)
            bx = h
        rmsnorm_forward(dev, bx, bw, n, rstd, 1, C, eps)
        bitlinear.actquant_forward(dev, n, fq, s, 1, C)
        ys = [_buf(dev, "f", y0, f"y{j}") for j, (_, _, _, y0) in enumerate(parts)]
        for o, (words, O, sc, _), yb, ab in zip(offs, parts, ys, ab_offs):
            bitlinear.bitlinear_forward(dev, fq, s, wbuf.view(o, 4 * len(words)), sc, yb, 1, C, O, accumulate)
            if ab is not None:
                shape = lora_ops.LoraShape(1, C, O, R, lora_scale)
                lora_ops.lora_forward(dev, shape, n, arena.view(4 * ab[0], 4 * R * C), arena.view(4 * ab[1], 4 * O * R),
                                      dev.buffer(4 * R, "u_old"), yb, dev.buffer(4, "stream"))   # no dropout: any stream
        out["old_y"] = await _get(dev, n, C)
        out["old_out"] = [await _get(dev, yb, O) for yb, (_, O, _, _) in zip(ys, parts)]
    return out


async def case_dense_matvec(dev, x, w_chunks, C, V, row0, bf16, kind):
    """logits[V] of row row0 of x[.., C] through ops.matvec.dense_matvec and through
    ops.linear.linear_forward (the kernel it stands in for), over a table in row chunks
    [[v0, Vc, u32 words], ...] (bf16: two values per word, low half first)."""
    from bitlora.model import RowTable
    dtype = "bf16" if bf16 else "f32"
    await dev.prepare(ops.kernel_specs(dtype))
    bx = _buf(dev, "f", x, "x")
    chunks = RowTable([(v0, n, _buf(dev, "I", words, f"w{v0}")) for v0, n, words in w_chunks], dtype)
    out = {}
    with dev.kind_as(kind):
        y = dev.buffer(4 * V, "y")
        matvec.dense_matvec(dev, bx, chunks, y, C, V, row0)
        out["new"] = await _get(dev, y, V)
        y = dev.buffer(4 * V, "y_old")
        linear_forward(dev, bx, chunks, y, 1, C, V, row0, 1)
        out["old"] = await _get(dev, y, V)
    return out


async def case_sample(dev, logits, seed, temperature, top_p, n0=0, steps=1, kind="gpu"):
    """Run sample_token `steps` times on the same logits from state n = n0, with the
    workgroup of device `kind`: the ids (out), tok and the final state."""
    await dev.prepare(sample.kernel_specs())
    V = len(logits)
    lb = _buf(dev, "f", logits, "logits")
    state = dev.buffer(16, "state", data=sample.sampler_state(seed, temperature, top_p, n0))
    tok, out = dev.buffer(4, "tok"), dev.buffer(4 * (n0 + steps), "out")
    with dev.kind_as(kind):
        for _ in range(steps):
            sample.sample_token(dev, lb, state, tok, out, V)
    n, s, t, p = struct.unpack("<IIff", await dev.read(state))
    return {"out": (await _get(dev, out, n0 + steps, "I"))[n0:], "tok": (await _get(dev, tok, 1, "I"))[0], "n": n}


async def case_rope_kv_store(dev, q, k, v, B, T, H, Hkv, D, S, pos0):
    """q after RoPE and both caches, through ops.rope.rope_kv_store and through
    rope_forward (q, k) + ops.attention.kv_store; caches start filled with 7. "buf": the
    new kernel with pos0 from its kv_pos buffer (decoding's), the uniform's 0."""
    from bitlora.ops.attention import kv_store
    from bitlora.ops.rope import rope_forward, rope_kv_store, rope_tables
    await dev.prepare(ops.kernel_specs("f32"))
    cos, sin = rope_tables(pos0 + T, D, 10000.0)
    bc, bs = _buf(dev, "f", cos, "cos"), _buf(dev, "f", sin, "sin")
    W = Hkv * D
    out = {}
    for key in ("new", "old", "buf"):
        bq, bk, bv = _buf(dev, "f", q, "q"), _buf(dev, "f", k, "k"), _buf(dev, "f", v, "v")
        kc, vc = _buf(dev, "f", [7.0] * (B * S * W), "kc"), _buf(dev, "f", [7.0] * (B * S * W), "vc")
        if key == "new":
            rope_kv_store(dev, bq, bk, bv, kc, vc, bc, bs, B, T, H, Hkv, D, S, pos0)
        elif key == "buf":
            rope_kv_store(dev, bq, bk, bv, kc, vc, bc, bs, B, T, H, Hkv, D, S, 0, _buf(dev, "I", [pos0], "kv_pos"))
        else:
            rope_forward(dev, bq, bc, bs, B * T, T, H, D, pos0)
            rope_forward(dev, bk, bc, bs, B * T, T, Hkv, D, pos0)
            kv_store(dev, bk, bv, kc, vc, B, T, S, W, pos0)
        out[key] = {"q": await _get(dev, bq, B * T * H * D), "kc": await _get(dev, kc, B * S * W),
                    "vc": await _get(dev, vc, B * S * W)}
    return out
