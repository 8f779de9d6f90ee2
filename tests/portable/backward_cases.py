"""Portable cases for the backward kernels (the *_backward entry points of shaders/,
lora.wgsl, cross_entropy.wgsl): each uploads the inputs it is given (lists of floats / ints),
records the op, and returns the outputs as lists. The pytest side (tests/test_backward.py)
builds the inputs and compares with numpy / torch. Standard library + bitlora only.
"""
import array

from bitlora import ops
from bitlora.ops import attention, bitlinear, linear, lora, relu2, rmsnorm, rope
from bitlora.ops import cross_entropy as ce


def _f32(dev, vals, label):
    return dev.buffer(4 * max(len(vals), 1), label, data=array.array("f", vals) if vals else None)


def _u32(dev, vals, label):
    return dev.buffer(4 * max(len(vals), 1), label, data=array.array("I", vals))


def _i32(dev, vals, label):
    return dev.buffer(4 * max(len(vals), 1), label, data=array.array("i", vals))


async def _prepare(dev):
    """Compile every kernel these cases record (once per device)."""
    await dev.prepare(ops.kernel_specs("f32", training=True) + ops.kernel_specs("bf16", training=True))


async def _get(dev, buf, n):
    out = array.array("f")
    out.frombytes(await dev.read(buf, 0, 4 * n))
    return list(out)


async def case_cross_entropy(dev, logits, targets, N, V, grad_scale, loss_sum0=0.0, kind="gpu"):
    await _prepare(dev)
    lg = _f32(dev, logits, "logits")
    tg = _i32(dev, targets, "targets")
    ls = dev.buffer(4 * N, "losses")
    sm = _f32(dev, [loss_sum0], "loss_sum")
    with dev.kind_as(kind):
        ce.cross_entropy_forward_backward(dev, lg, tg, ls, N, V, grad_scale)
        ce.cross_entropy_sum(dev, ls, sm, N)
    return {"dlogits": await _get(dev, lg, N * V), "losses": await _get(dev, ls, N),
            "loss_sum": (await _get(dev, sm, 1))[0]}


async def case_lora(dev, x, a, b, dy, y0, da0, db0, dx0, N, I, O, R, scale, p=0.0, seed=0, step=0, kind="gpu",
                    plain=False, tq=1, matmuls=True):
    """The LoRA branch forward and backward on a device of `kind`: a GPU kind's split
    matmul for down (lora_down_mm, at every N; unless `matmuls` is False) and tiles
    (lora.wgsl *_tile, lora_up_tile / lora_grad_x_tile with `tq` row blocks a turn) at
    every size, or with `plain` its plain kernels (the tiles' bits)."""
    await _prepare(dev)
    tq0, lora.TQ = lora.TQ, tq
    mm0, lora.MATMULS, lora.MM_MIN_ROWS = (lora.MATMULS, lora.MM_MIN_ROWS), matmuls and not plain, 0
    try:
        await dev.prepare(lora.kernel_specs(training=True, kind="gpu"))
        return await _lora(dev, x, a, b, dy, y0, da0, db0, dx0, N, I, O, R, scale, p, seed, step, kind, plain)
    finally:
        lora.TQ, (lora.MATMULS, lora.MM_MIN_ROWS) = tq0, mm0


async def _lora(dev, x, a, b, dy, y0, da0, db0, dx0, N, I, O, R, scale, p, seed, step, kind, plain):
    s = lora.LoraShape(N, I, O, R, scale, p, seed)
    stream = _u32(dev, [step], "stream")   # the dropout stream's step travels in a buffer
    bx, ba, bb, bdy = _f32(dev, x, "x"), _f32(dev, a, "a"), _f32(dev, b, "b"), _f32(dev, dy, "dy")
    by, bda, bdb, bdx = _f32(dev, y0, "y"), _f32(dev, da0, "da"), _f32(dev, db0, "db"), _f32(dev, dx0, "dx")
    bu, bdu = dev.buffer(4 * N * R, "u"), dev.buffer(4 * N * R, "du")
    with dev.kind_as(kind):
        lora.TILES, min_groups, lora.TILE_MIN_GROUPS = not plain, lora.TILE_MIN_GROUPS, 0
        try:
            lora.lora_forward(dev, s, bx, ba, bb, bu, by, stream)
            lora.lora_backward(dev, s, bdy, bx, ba, bb, bu, bda, bdb, bdu, stream, bdx)
        finally:
            lora.TILES, lora.TILE_MIN_GROUPS = True, min_groups
    return {"y": await _get(dev, by, N * O), "u": await _get(dev, bu, N * R), "da": await _get(dev, bda, R * I),
            "db": await _get(dev, bdb, O * R), "du": await _get(dev, bdu, N * R), "dx": await _get(dev, bdx, N * I)}


async def case_rmsnorm_backward(dev, dy, x, w, rstd, dx0, N, C, accumulate, kind="gpu"):
    await _prepare(dev)
    bdx = _f32(dev, dx0, "dx")
    with dev.kind_as(kind):
        rmsnorm.rmsnorm_backward(dev, _f32(dev, dy, "dy"), _f32(dev, x, "x"), _f32(dev, w, "w"),
                                 _f32(dev, rstd, "rstd"), bdx, N, C, accumulate)
    return await _get(dev, bdx, N * C)


async def case_bitlinear_backward_input(dev, dy, packed, scale, dx0, N, I, O, accumulate, split=None, kind="gpu"):
    """dx under "op" (the op on a device of `kind`) and, for kind "cpu", under each adapter
    name of ops.bitlinear.CPU_TILES and CPU_ALTERNATIVES and "default": bitlinear_matmul_cpu with those constants."""
    await _prepare(dev)
    bdy, bw = _f32(dev, dy, "dy"), _u32(dev, packed, "w_packed")
    out = {}
    bdx = _f32(dev, dx0, "dx")
    with dev.kind_as(kind):
        bitlinear.bitlinear_backward_input(dev, bdy, bw, scale, bdx, N, I, O, accumulate, split=split)
    out["op"] = await _get(dev, bdx, N * I)
    for name, c in ([("default", None)] + list(bitlinear.CPU_TILES + bitlinear.CPU_ALTERNATIVES) if kind == "cpu" else []):
        bdx = _f32(dev, dx0, "dx")
        bitlinear.cpu_matmul(dev, bdy, bdy, bw, scale, bdx, N, O, I, accumulate, divide=False, consts=c or {})
        out[name] = await _get(dev, bdx, N * I)
    return out


async def case_linear_backward_input(dev, dy, w, dx0, N, I, O, scale, accumulate, split=None, kind="gpu"):
    await _prepare(dev)
    bdx = _f32(dev, dx0, "dx")
    with dev.kind_as(kind):
        linear.linear_backward_input(dev, _f32(dev, dy, "dy"), _f32(dev, w, "w"), bdx, N, I, O, scale, accumulate,
                                     split=split)
    return await _get(dev, bdx, N * I)


async def case_relu2_gating_backward(dev, dh, g, u):
    await _prepare(dev)
    n = len(dh)
    bdg, bdu = dev.buffer(4 * n, "dg"), dev.buffer(4 * n, "du")
    relu2.relu2_gating_backward(dev, _f32(dev, dh, "dh"), _f32(dev, g, "g"), _f32(dev, u, "u"), bdg, bdu, n)
    return {"dg": await _get(dev, bdg, n), "du": await _get(dev, bdu, n)}


async def case_gating(dev, act, dh, g, u, kind="gpu"):
    """h of ops.relu2.gating_forward and dg, du of gating_backward for `act` ("relu2"
    or "silu"), recorded with dev.kind = `kind`."""
    await _prepare(dev)
    n = len(dh)
    bh, bdg, bdu = dev.buffer(4 * n, "h"), dev.buffer(4 * n, "dg"), dev.buffer(4 * n, "du")
    bg, bu = _f32(dev, g, "g"), _f32(dev, u, "u")
    with dev.kind_as(kind):
        relu2.gating_forward(dev, act, bg, bu, bh, n)
        relu2.gating_backward(dev, act, _f32(dev, dh, "dh"), bg, bu, bdg, bdu, n)
    return {"h": await _get(dev, bh, n), "dg": await _get(dev, bdg, n), "du": await _get(dev, bdu, n)}


async def case_rope_backward(dev, dy, cos, sin, N, T, H, D, kind="gpu"):
    await _prepare(dev)
    bg = _f32(dev, dy, "g")
    with dev.kind_as(kind):
        rope.rope_backward(dev, bg, _f32(dev, cos, "cos"), _f32(dev, sin, "sin"), N, T, H, D)
    return await _get(dev, bg, N * H * D)


async def case_rope_forward(dev, x, cos, sin, N, T, H, D, pos0, kind="gpu"):
    """x rotated in place at positions pos0 + n % T (cos, sin[P, D/2], P >= pos0 + T)."""
    await _prepare(dev)
    bx = _f32(dev, x, "x")
    with dev.kind_as(kind):
        rope.rope_forward(dev, bx, _f32(dev, cos, "cos"), _f32(dev, sin, "sin"), N, T, H, D, pos0)
    return await _get(dev, bx, N * H * D)


async def case_attention_backward(dev, dout, q, k, v, B, T, H, Hkv, D, kind="gpu"):
    """dq, dk, dv, stats with the kernels of `kind` ("gpu", or "cpu": the CPU variant
    the op picks where D % 4 == 0). With kind "cpu" and D % 4 == 0 also "mixed": dq of
    each CPU variant (_rows; _d32 where D <= 32), and dk, dv of its dkv kernel, each fed
    by the GPU kernels' other half (one stats contract); and "saved": the op given the
    forward's out and lse (attention_backward_dqs on GPUs; on CPUs where D <= 32,
    attention_backward_dq_d32s), as a model runs it."""
    await _prepare(dev)
    N = B * T
    bdq, bdk, bdv = dev.buffer(4 * N * H * D, "dq"), dev.buffer(4 * N * Hkv * D, "dk"), dev.buffer(4 * N * Hkv * D, "dv")
    stats = dev.buffer(4 * N * H * 2, "stats")
    ins = [_f32(dev, dout, "dout"), _f32(dev, q, "q"), _f32(dev, k, "k"), _f32(dev, v, "v")]
    kind0, dev.kind = dev.kind, kind
    try:
        attention.attention_backward(dev, *ins, bdq, bdk, bdv, stats, B, T, H, Hkv, D)
    finally:
        dev.kind = kind0
    out = {"dq": await _get(dev, bdq, N * H * D), "dk": await _get(dev, bdk, N * Hkv * D),
           "dv": await _get(dev, bdv, N * Hkv * D), "stats": await _get(dev, stats, N * H * 2)}
    if kind == "cpu" and D % 4 == 0:
        params = attention.BACKWARD.pack(B, T, H, Hkv, D, D ** -0.5)
        blocks = B * -(-T // 8)
        gpu_dq = ("attention_backward_dq", blocks * H)
        gpu_dkv = ("attention_backward_dkv", blocks * Hkv)
        out["mixed"] = []
        for variant in ("_rows", "_d32") if D <= 32 else ("_rows",):
            cpu_dq = ("attention_backward_dq" + variant, attention._groups(variant, B, T, H))
            cpu_dkv = ("attention_backward_dkv" + variant, attention._groups(variant, B, T, Hkv))
            for (eq, gq), (ek, gk) in ((gpu_dq, cpu_dkv), (cpu_dq, gpu_dkv)):
                dev.clear(stats)
                dev.dispatch(dev.prepared(attention.SHADER, eq), ins + [bdq, stats], groups=gq, params=params)
                dev.dispatch(dev.prepared(attention.SHADER, ek), ins + [stats, bdk, bdv], groups=gk, params=params)
                out["mixed"].append({"dq": await _get(dev, bdq, N * H * D), "dk": await _get(dev, bdk, N * Hkv * D),
                                     "dv": await _get(dev, bdv, N * Hkv * D)})
    if kind == "gpu" or (D % 4 == 0 and D <= 32):   # as a model runs it: with the forward's out and lse
        att, lse = dev.buffer(4 * N * H * D, "out"), dev.buffer(4 * N * H, "lse")
        kind0, dev.kind = dev.kind, kind
        try:
            attention.attention_forward(dev, ins[1], ins[2], ins[3], att, lse, B, T, H, Hkv, D, T)
            attention.attention_backward(dev, *ins, bdq, bdk, bdv, stats, B, T, H, Hkv, D, out=att, lse=lse)
        finally:
            dev.kind = kind0
        out["saved"] = {"dq": await _get(dev, bdq, N * H * D), "dk": await _get(dev, bdk, N * Hkv * D),
                        "dv": await _get(dev, bdv, N * Hkv * D)}
    return out


async def case_layer_backward(dev, dims, saved, weights, lora_cfg, dh_out):
    """One BitNet decoder layer with LoRA on q and v, backward by chaining the kernels.

    dims: B, T, C, H, Hkv, D, F, R. saved (lists, from the caller's forward): h_in, n1,
    rstd1, q, k, v (post-RoPE), attn (pre sub-norm), rstd_as, h_mid, n2, rstd2,
    g, u, hg (relu(g)^2 u), rstd_fs, uq, uv (LoRA u of q and v), cos, sin.
    weights: w_in, w_asn, w_post, w_fsn (norms) and packed/scale of q, k, v, o, gate,
    up, down; a_q, b_q, a_v, b_v. lora_cfg: scale, p, seed_q, seed_v, step.
    Returns dh_in and the four LoRA gradients. One submit for the whole chain."""
    await _prepare(dev)
    B, T, C, H, Hkv, D, F, R = (dims[k] for k in ("B", "T", "C", "H", "Hkv", "D", "F", "R"))
    N = B * T
    S = {k: _f32(dev, v, k) for k, v in saved.items()}
    Wt = {}
    for k, v in weights.items():
        Wt[k] = _u32(dev, v, k) if k.endswith("_packed") else (v if k.endswith("_scale") else _f32(dev, v, k))
    buf = lambda n, name: dev.buffer(4 * n, name)
    dh = _f32(dev, dh_out, "dh")                   # residual-stream gradient, accumulates
    d_c, d_f, d_g, d_u, d_n = buf(N * C, "d_c"), buf(N * F, "d_f"), buf(N * F, "d_g"), buf(N * F, "d_u"), buf(N * C, "d_n")
    dq, dk, dv, stats = buf(N * H * D, "dq"), buf(N * Hkv * D, "dk"), buf(N * Hkv * D, "dv"), buf(N * H * 2, "stats")
    da_q, db_q, da_v, db_v = buf(R * C, "da_q"), buf(H * D * R, "db_q"), buf(R * C, "da_v"), buf(Hkv * D * R, "db_v")
    du_l = buf(N * R, "du_lora")

    # FFN: h_out = h_mid + down(ffn_sub_norm(relu(gate(n2))^2 * up(n2)))
    bitlinear.bitlinear_backward_input(dev, dh, Wt["down_packed"], Wt["down_scale"], d_f, N, F, C)
    rmsnorm.rmsnorm_backward(dev, d_f, S["hg"], Wt["w_fsn"], S["rstd_fs"], d_g, N, F)
    relu2.relu2_gating_backward(dev, d_g, S["g"], S["u"], d_f, d_u, N * F)   # d_f <- dgate
    bitlinear.bitlinear_backward_input(dev, d_f, Wt["gate_packed"], Wt["gate_scale"], d_n, N, C, F)
    bitlinear.bitlinear_backward_input(dev, d_u, Wt["up_packed"], Wt["up_scale"], d_n, N, C, F, accumulate=True)
    rmsnorm.rmsnorm_backward(dev, d_n, S["h_mid"], Wt["w_post"], S["rstd2"], dh, N, C, accumulate=True)

    # attention: h_mid = h_in + o(attn_sub_norm(attention(rope(q(n1)), rope(k(n1)), v(n1))))
    bitlinear.bitlinear_backward_input(dev, dh, Wt["o_packed"], Wt["o_scale"], d_c, N, C, C)
    rmsnorm.rmsnorm_backward(dev, d_c, S["attn"], Wt["w_asn"], S["rstd_as"], d_n, N, C)
    attention.attention_backward(dev, d_n, S["q"], S["k"], S["v"], dq, dk, dv, stats, B, T, H, Hkv, D)
    rope.rope_backward(dev, dq, S["cos"], S["sin"], N, T, H, D)
    rope.rope_backward(dev, dk, S["cos"], S["sin"], N, T, Hkv, D)
    bitlinear.bitlinear_backward_input(dev, dq, Wt["q_packed"], Wt["q_scale"], d_c, N, C, H * D)
    bitlinear.bitlinear_backward_input(dev, dk, Wt["k_packed"], Wt["k_scale"], d_c, N, C, Hkv * D, accumulate=True)
    bitlinear.bitlinear_backward_input(dev, dv, Wt["v_packed"], Wt["v_scale"], d_c, N, C, Hkv * D, accumulate=True)
    sq = lora.LoraShape(N, C, H * D, R, lora_cfg["scale"], lora_cfg["p"], lora_cfg["seed_q"])
    sv = lora.LoraShape(N, C, Hkv * D, R, lora_cfg["scale"], lora_cfg["p"], lora_cfg["seed_v"])
    stream = _u32(dev, [lora_cfg["step"]], "stream")
    lora.lora_backward(dev, sq, dq, S["n1"], Wt["a_q"], Wt["b_q"], S["uq"], da_q, db_q, du_l, stream, d_c)
    lora.lora_backward(dev, sv, dv, S["n1"], Wt["a_v"], Wt["b_v"], S["uv"], da_v, db_v, du_l, stream, d_c)
    rmsnorm.rmsnorm_backward(dev, d_c, S["h_in"], Wt["w_in"], S["rstd1"], dh, N, C, accumulate=True)
    return {"dh_in": await _get(dev, dh, N * C), "da_q": await _get(dev, da_q, R * C),
            "db_q": await _get(dev, db_q, H * D * R), "da_v": await _get(dev, da_v, R * C),
            "db_v": await _get(dev, db_v, Hkv * D * R)}


async def case_head_backward(dev, logits, targets, h, w_norm, rstd, emb, N, C, V, grad_scale, kind="gpu"):
    """The model's head backward: cross-entropy -> lm_head (dense, e.g. the tied
    embedding E[V, C]) -> final RMSNorm, chained. Returns dh[N, C] and the loss sum."""
    await _prepare(dev)
    lg, tg, ls = _f32(dev, logits, "logits"), _i32(dev, targets, "targets"), dev.buffer(4 * N, "losses")
    total = dev.buffer(4, "loss_sum")
    d_hn, dh = dev.buffer(4 * N * C, "d_hn"), dev.buffer(4 * N * C, "dh")
    with dev.kind_as(kind):
        ce.cross_entropy_forward_backward(dev, lg, tg, ls, N, V, grad_scale)
        ce.cross_entropy_sum(dev, ls, total, N)
        linear.linear_backward_input(dev, lg, _f32(dev, emb, "emb"), d_hn, N, C, V)
        rmsnorm.rmsnorm_backward(dev, d_hn, _f32(dev, h, "h"), _f32(dev, w_norm, "w_norm"),
                                 _f32(dev, rstd, "rstd"), dh, N, C)
    return {"dh": await _get(dev, dh, N * C), "loss_sum": (await _get(dev, total, 1))[0]}


async def case_linear_backward_chunked(dev, dy, w_words, N, I, O, chunk, w_dtype, kind="gpu"):
    """dx = dy w over vocabulary chunks of `chunk` rows (a multiple of 64), each bound
    as a view of the full dy[N, O] and w[O, I] buffers (f32 or bf16 pairs), with the
    variant of device `kind`."""
    await _prepare(dev)
    bdy, bw_, bdx = _f32(dev, dy, "dy"), _u32(dev, w_words, "w"), dev.buffer(4 * N * I, "dx")
    row_bytes = I * (4 if w_dtype == "f32" else 2)
    for v0 in range(0, O, chunk):
        oc = min(chunk, O - v0)
        dyv = bdy.view(4 * v0, 4 * ((N - 1) * O + oc))
        wv = bw_.view(v0 * row_bytes, -(-oc * row_bytes // 4) * 4)
        with dev.kind_as(kind):
            linear.linear_backward_input(dev, dyv, wv, bdx, N, I, oc, 1.0, accumulate=v0 > 0, ld_dy=O,
                                         w_dtype=w_dtype)
    return await _get(dev, bdx, N * I)


async def case_norm_backward_after_split(dev, dy, packed, scale, x, w, rstd, dx0, N, I, O, accumulate, split=3,
                                         d0=None):
    """The ternary input gradient d[N, I] of dy[N, O] split in `split` slices, then
    ops.rmsnorm.rmsnorm_backward of d (x, w, rstd the norm's; dx0 what dx holds before),
    on a GPU kind, as the model's down_proj and ffn_sub_norm (with d0: the product added
    into d = d0, as up_proj's into gate_proj's): "fused" with the reduce
    deferred into the norm's backward, "apart" with its own dispatch. Each: d, dx and the
    dispatches recorded; "deferred" whether the fused run's reduce was left to the norm."""
    await _prepare(dev)
    bdy, bw, bnw = _f32(dev, dy, "dy"), _u32(dev, packed, "w_packed"), _f32(dev, w, "norm_w")
    bx, brstd = _f32(dev, x, "x"), _f32(dev, rstd, "rstd")
    out = {}
    with dev.kind_as("gpu"):
        for key in ("fused", "apart"):
            bd = dev.buffer(4 * N * I, "d", data=None if d0 is None else array.array("f", d0))
            bdx = _f32(dev, dx0, "dx")
            before = dev.dispatches
            sums = bitlinear.bitlinear_backward_input(dev, bdy, bw, scale, bd, N, I, O, d0 is not None, split=split,
                                                      defer=key == "fused")
            out["deferred" if key == "fused" else "apart_deferred"] = sums is not None
            rmsnorm.rmsnorm_backward(dev, bd, bx, bnw, brstd, bdx, N, I, accumulate, sums=sums)
            out[key] = {"d": await _get(dev, bd, N * I), "dx": await _get(dev, bdx, N * I),
                        "dispatches": dev.dispatches - before}
    return out
