"""Backward kernels (the *_backward entry points in shaders/, lora.wgsl, cross_entropy.wgsl) against
numpy references over awkward shapes; each numpy reference against torch float64
autograd; and one whole BitNet decoder layer with LoRA on q and v (torch float64,
HF's quantisers with the straight-through estimator) whose input and LoRA gradients
the kernels reproduce when chained. Native-only helpers (numpy, torch) live here.
"""
import subprocess
import sys

import numpy as np
import pytest
import torch

from bitlora.ops import bitlinear

M32 = 0xFFFFFFFF


# ----------------------------------------------------------------------------- helpers
def assert_close(got, want, rtol=1e-5, what="", scale=None):
    """max|got - want| <= rtol * max|want| (or rtol * scale, for outputs that are a
    cancellation of larger terms)."""
    got = np.asarray(got, dtype=np.float64).ravel()
    want = np.asarray(want, dtype=np.float64).ravel()
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    scale = max(np.abs(want).max(initial=0.0), 1e-30) if scale is None else scale
    diff = np.abs(got - want)
    worst = int(diff.argmax()) if diff.size else 0
    rel = diff.max(initial=0.0) / scale
    assert rel <= rtol, (f"{what}: max diff {diff.max():.3e} = {rel:.2e} of max|want| {scale:.3e} at {worst}: "
                         f"got {got[worst]!r} want {want[worst]!r}; first pairs "
                         f"{list(zip(got[:4].tolist(), want[:4].tolist()))}")


def f32(a):
    return np.asarray(a, dtype=np.float32)


def L(a):
    return f32(a).ravel().tolist()


def pack_ternary(t):
    """t[O, I] in {-1, 0, 1} -> w_packed[O, ceil(I/16)] u32 (formats/tensors.py layout)."""
    O, I = t.shape
    W = -(-I // 16)
    codes = np.ones((O, W * 16), dtype=np.uint64)
    codes[:, :I] = (t + 1).astype(np.uint64)
    shifts = (2 * np.arange(16, dtype=np.uint64))
    words = (codes.reshape(O, W, 16) << shifts).sum(axis=2)
    return words.astype(np.uint64).ravel().tolist()


def pcg(v):
    v = np.asarray(v, dtype=np.uint64) & M32
    s = (v * 747796405 + 2891336453) & M32
    w = (((s >> ((s >> 28) + 4)) ^ s) * 277803737) & M32
    return (w >> 22) ^ w


def dropout_factor(seed, step, p, shape):
    """The lora.wgsl mask times 1/(1-p): 0 or keep_scale per element of x[N, I]."""
    if p == 0.0:
        return np.ones(shape)
    thr = min(int(p * 4294967296.0), M32)
    idx = np.arange(int(np.prod(shape)), dtype=np.uint64)
    h = pcg(idx ^ pcg(np.uint64(seed & M32) ^ pcg(np.uint64(step & M32))))
    return np.where(h >= thr, float(np.float32(1.0 / (1.0 - p))), 0.0).reshape(shape)


def rope_tables(T, D, theta=10000.0):
    """cos, sin[T, D/2] in f32 (HF default RoPE: inv_freq_j = theta^(-2j/D), angle = t * inv_freq)."""
    inv = 1.0 / theta ** (np.arange(0, D, 2, dtype=np.float64) / D)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv[None, :]
    return f32(np.cos(ang)), f32(np.sin(ang))


# ----------------------------------------------------------------------------- numpy references
def ce_ref(logits, targets, grad_scale):
    z = logits.astype(np.float64)
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    valid = (targets >= 0) & (targets < z.shape[1])
    tsafe = np.where(valid, targets, 0)
    losses = np.where(valid, lse - z[np.arange(len(z)), tsafe], 0.0)
    d = np.exp(z - lse[:, None])
    d[np.arange(len(z)), tsafe] -= valid
    d *= grad_scale * valid[:, None]
    return losses, d


def rmsnorm_backward_ref(dy, x, w, rstd):
    r = rstd[:, None]
    dot = (w * dy * x).sum(axis=1, keepdims=True)
    return r * (w * dy - x * r * r * dot / x.shape[1])


def relu2_backward_ref(dh, g, u):
    a = np.maximum(g, 0.0)
    return 2 * a * u * dh, a * a * dh


def silu_gating_ref(g, u):
    return g / (1 + np.exp(-g)) * u


def silu_backward_ref(dh, g, u):
    sg = 1 / (1 + np.exp(-g))
    return u * dh * sg * (1 + g * (1 - sg)), g * sg * dh


def rope_backward_ref(dy, cos, sin, T, H, D):
    N = dy.shape[0]
    g = dy.reshape(N, H, D)
    c = np.tile(cos, (N // T, 1))[:, None, :]
    s = np.tile(sin, (N // T, 1))[:, None, :]
    a, b = g[..., :D // 2], g[..., D // 2:]
    return np.concatenate([a * c + b * s, b * c - a * s], axis=-1).reshape(N, H * D)


def attention_backward_ref(dout, q, k, v, B, T, H, Hkv, D):
    rep = H // Hkv
    q4 = q.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    k4 = np.repeat(k.reshape(B, T, Hkv, D).transpose(0, 2, 1, 3), rep, axis=1)
    v4 = np.repeat(v.reshape(B, T, Hkv, D).transpose(0, 2, 1, 3), rep, axis=1)
    do4 = dout.reshape(B, T, H, D).transpose(0, 2, 1, 3)
    s = q4 @ k4.transpose(0, 1, 3, 2) / np.sqrt(D)
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    P = np.exp(s - s.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    dP = do4 @ v4.transpose(0, 1, 3, 2)
    dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    dq = dS @ k4 / np.sqrt(D)
    dk = (dS.transpose(0, 1, 3, 2) @ q4 / np.sqrt(D)).reshape(B, Hkv, rep, T, D).sum(2)
    dv = (P.transpose(0, 1, 3, 2) @ do4).reshape(B, Hkv, rep, T, D).sum(2)
    back = lambda t, h: t.transpose(0, 2, 1, 3).reshape(B * T, h * D)
    return back(dq, H), back(dk, Hkv), back(dv, Hkv)


def lora_ref(x, a, b, dy, scale, keep):
    xd = x * keep
    u = xd @ a.T
    y = scale * u @ b.T
    db = scale * dy.T @ u
    du = scale * dy @ b
    da = du.T @ xd
    dx = (du @ a) * keep
    return u, y, da, db, du, dx


# ----------------------------------------------------------------------------- torch float64 ops (the truth)
def t64(a, grad=True):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=grad)


def torch_rmsnorm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def torch_rope(x, cos, sin, B, T, H, D):
    x4 = x.reshape(B, T, H, D)
    c = torch.cat([cos, cos], -1)[None, :, None, :]
    s = torch.cat([sin, sin], -1)[None, :, None, :]
    rot = torch.cat([-x4[..., D // 2:], x4[..., :D // 2]], -1)
    return (x4 * c + rot * s).reshape(B * T, H * D)


def torch_attention(q, k, v, B, T, H, Hkv, D):
    rep = H // Hkv
    q4 = q.reshape(B, T, H, D).transpose(1, 2)
    k4 = k.reshape(B, T, Hkv, D).transpose(1, 2).repeat_interleave(rep, dim=1)
    v4 = v.reshape(B, T, Hkv, D).transpose(1, 2).repeat_interleave(rep, dim=1)
    s = q4 @ k4.transpose(2, 3) * D ** -0.5
    s = s.masked_fill(~torch.tril(torch.ones(T, T, dtype=torch.bool)), float("-inf"))
    o = torch.softmax(s, dim=-1) @ v4
    return o.transpose(1, 2).reshape(B * T, H * D)


class ActQuantSTE(torch.autograd.Function):
    """HF integrations/bitnet.py ActQuant: per-row absmax int8, identity backward."""
    @staticmethod
    def forward(ctx, x):
        s = 127 / x.abs().max(dim=-1, keepdim=True).values.clamp(min=1e-5)
        return (x * s).round().clamp(-128, 127) / s

    @staticmethod
    def backward(ctx, g):
        return g


def weight_quant(w):
    """HF WeightQuant forward: t * scale with t ternary, scale = mean|W| (clamped)."""
    s = 1.0 / w.abs().mean().clamp(min=1e-5)
    t = (w * s).round().clamp(-1, 1)
    return t, float(1.0 / s)


# ----------------------------------------------------------------------------- numpy refs vs torch
def test_refs_match_torch_autograd():
    rng = np.random.default_rng(0)
    N, C, B, T, H, Hkv, D = 6, 7, 2, 3, 4, 2, 6
    # rmsnorm
    x, w, dy = rng.normal(size=(N, C)), rng.normal(size=C), rng.normal(size=(N, C))
    tx = t64(x)
    torch_rmsnorm(tx, t64(w, False), 1e-5).backward(t64(dy, False))
    rstd = 1 / np.sqrt((x * x).mean(1) + 1e-5)
    assert_close(rmsnorm_backward_ref(dy, x, w, rstd), tx.grad.numpy(), 1e-12, "rmsnorm")
    # relu^2 gating
    g, u, dh = rng.normal(size=(N, C)), rng.normal(size=(N, C)), rng.normal(size=(N, C))
    tg, tu = t64(g), t64(u)
    (torch.relu(tg) ** 2 * tu).backward(t64(dh, False))
    dg, du = relu2_backward_ref(dh, g, u)
    assert_close(dg, tg.grad.numpy(), 1e-12, "dg")
    assert_close(du, tu.grad.numpy(), 1e-12, "du")
    # rope
    cos, sin = rope_tables(T, D)
    xr, dyr = rng.normal(size=(B * T, H * D)), rng.normal(size=(B * T, H * D))
    txr = t64(xr)
    torch_rope(txr, t64(cos, False), t64(sin, False), B, T, H, D).backward(t64(dyr, False))
    assert_close(rope_backward_ref(dyr, cos.astype(np.float64), sin.astype(np.float64), T, H, D),
                 txr.grad.numpy(), 1e-12, "rope")
    # attention
    q, k, v = rng.normal(size=(B * T, H * D)), rng.normal(size=(B * T, Hkv * D)), rng.normal(size=(B * T, Hkv * D))
    do = rng.normal(size=(B * T, H * D))
    tq, tk, tv = t64(q), t64(k), t64(v)
    torch_attention(tq, tk, tv, B, T, H, Hkv, D).backward(t64(do, False))
    for got, want, name in zip(attention_backward_ref(do, q, k, v, B, T, H, Hkv, D), (tq, tk, tv), "qkv"):
        assert_close(got, want.grad.numpy(), 1e-12, "attention d" + name)
    # cross-entropy (mean over target rows, ignore_index -100)
    V = 11
    z, tgt = rng.normal(size=(N, V)), np.array([3, -100, 0, 10, -100, 5])
    tz = t64(z)
    loss = torch.nn.functional.cross_entropy(tz, torch.tensor(tgt), ignore_index=-100, reduction="sum")
    (loss / 4).backward()
    losses, d = ce_ref(z, tgt, 0.25)
    assert abs(losses.sum() - loss.item()) < 1e-12
    assert_close(d, tz.grad.numpy(), 1e-12, "dlogits")
    # lora with dropout (PEFT: dropout on the branch input only)
    I, O, R, scale = 9, 5, 3, 2.0
    x, a, b, dy = rng.normal(size=(N, I)), rng.normal(size=(R, I)), rng.normal(size=(O, R)), rng.normal(size=(N, O))
    keep = dropout_factor(7, 1, 0.3, (N, I))
    tx, ta, tb = t64(x), t64(a), t64(b)
    (scale * ((tx * t64(keep, False)) @ ta.T) @ tb.T).backward(t64(dy, False))
    u, y, da, db, du, dx = lora_ref(x, a, b, dy, scale, keep)
    assert_close(da, ta.grad.numpy(), 1e-12, "da")
    assert_close(db, tb.grad.numpy(), 1e-12, "db")
    assert_close(dx, tx.grad.numpy(), 1e-12, "dx")
    # bitlinear: STE through both quantisers -> dx = dy Wq
    Wm, xb, dyb = rng.normal(size=(O, I)), rng.normal(size=(N, I)), rng.normal(size=(N, O))
    tW, txb = t64(Wm), t64(xb)
    s = 1.0 / tW.abs().mean().clamp(min=1e-5)
    Wq = tW + ((tW * s).round().clamp(-1, 1) / s - tW).detach()   # HF's x + (q(x) - x).detach() form
    (ActQuantSTE.apply(txb) @ Wq.T).backward(t64(dyb, False))
    t, sc = weight_quant(t64(Wm, False))
    assert_close(dyb @ (t.numpy() * sc), txb.grad.numpy(), 1e-12, "bitlinear dx")


def test_dropout_mask_rate():
    keep = dropout_factor(123, 4, 0.25, (64, 100))
    assert abs((keep > 0).mean() - 0.75) < 0.02
    assert not np.array_equal(keep, dropout_factor(123, 5, 0.25, (64, 100)))


# ----------------------------------------------------------------------------- kernels vs numpy
KINDS = ["gpu", "cpu"]   # the kernel variants (Device.kind); the CPU ones need widths % 4 == 0, else fall back


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,V", [(3, 1), (5, 300), (2, 1029), (2, 128256), (17, 8), (1, 4), (40, 516)])
def test_cross_entropy(run_case, N, V, kind):
    rng = np.random.default_rng(N * V)
    z = f32(rng.normal(size=(N, V)) * 3)
    tgt = rng.integers(0, V, size=N)
    tgt[1 % N] = -100
    r = run_case("backward_cases", "case_cross_entropy", logits=L(z), targets=tgt.tolist(), N=N, V=V,
                 grad_scale=0.125, loss_sum0=1.5, kind=kind)
    losses, d = ce_ref(z, tgt, 0.125)
    assert_close(r["losses"], losses, 1e-5, "losses")
    assert_close(r["dlogits"], d, 1e-5, "dlogits")
    assert abs(r["loss_sum"] - (1.5 + losses.sum())) <= 1e-5 * (1.5 + losses.sum())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,I,O,R,p", [(1, 5, 3, 1, 0.0), (7, 70, 33, 4, 0.0), (6, 300, 17, 8, 0.4),
                                        (17, 12, 8, 3, 0.2), (33, 64, 20, 1, 0.0), (1, 4, 4, 1, 0.0),
                                        (19, 36, 60, 8, 0.0), (13, 40, 24, 4, 0.3), (9, 128, 64, 16, 0.05),
                                        (70, 36, 44, 12, 0.1), (97, 30, 21, 5, 0.0),   # split over N
                                        (40, 96, 68, 20, 0.1)])   # two rank blocks of lora_down_mm
def test_lora(run_case, N, I, O, R, p, kind):
    rng = np.random.default_rng(N + I + O + R)
    x, a, b, dy = (f32(rng.normal(size=s)) for s in ((N, I), (R, I), (O, R), (N, O)))
    y0, da0, db0, dx0 = (f32(rng.normal(size=s)) for s in ((N, O), (R, I), (O, R), (N, I)))
    scale = 16.0 / R
    r = run_case("backward_cases", "case_lora", x=L(x), a=L(a), b=L(b), dy=L(dy), y0=L(y0), da0=L(da0),
                 db0=L(db0), dx0=L(dx0), N=N, I=I, O=O, R=R, scale=scale, p=p, seed=99, step=3, kind=kind)
    keep = dropout_factor(99, 3, p, (N, I))
    u, y, da, db, du, dx = lora_ref(x.astype(np.float64), a, b, dy, scale, keep)
    assert_close(r["u"], u, 1e-5, "u")
    assert_close(np.array(r["y"]) - y0.ravel(), y, 1e-5, "y")
    assert_close(r["du"], du, 1e-5, "du")
    assert_close(np.array(r["db"]) - db0.ravel(), db, 1e-5, "db (accumulated)")
    assert_close(np.array(r["da"]) - da0.ravel(), da, 1e-5, "da (accumulated)")
    assert_close(np.array(r["dx"]) - dx0.ravel(), dx, 1e-5, "dx (accumulated)")
    if p:
        assert (np.array(r["dx"]) == dx0.ravel()).any()   # dropped elements get nothing


@pytest.mark.parametrize("N,I,O,R,p", [(6, 300, 17, 8, 0.4), (19, 36, 60, 8, 0.0), (9, 128, 64, 16, 0.05),
                                        (13, 40, 24, 20, 0.3), (5, 70, 33, 3, 0.2), (33, 256, 128, 4, 0.1),
                                        (1, 4, 4, 4, 0.0)])
@pytest.mark.parametrize("tq", [1, 3])
def test_lora_tiles_same_bits(run_case, N, I, O, R, p, tq):
    """The GPU tiles (lora.wgsl *_tile) give the plain GPU kernels' bits: the same sums in
    the same order (rows past N, ranks past R, rank blocks of TK, widths without a tile,
    row blocks of lora_up_tile / lora_grad_x_tile one or TQ = 3 a turn)."""
    rng = np.random.default_rng(N * I + O + R)
    x, a, b, dy = (f32(rng.normal(size=s)) for s in ((N, I), (R, I), (O, R), (N, O)))
    y0, da0, db0, dx0 = (f32(rng.normal(size=s)) for s in ((N, O), (R, I), (O, R), (N, I)))
    args = dict(x=L(x), a=L(a), b=L(b), dy=L(dy), y0=L(y0), da0=L(da0), db0=L(db0), dx0=L(dx0), N=N, I=I, O=O,
                R=R, scale=2.0, p=p, seed=5, step=2, kind="gpu")
    tiled = run_case("backward_cases", "case_lora", tq=tq, matmuls=False, **args)
    plain = run_case("backward_cases", "case_lora", plain=True, **args)
    for key in ("u", "y", "du", "db", "da", "dx"):
        assert np.array_equal(np.array(tiled[key]), np.array(plain[key])), key


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,C,acc", [(1, 1, False), (3, 257, True), (4, 600, False), (1, 4, True),
                                      (17, 12, False), (40, 128, True)])
def test_rmsnorm_backward(run_case, N, C, acc, kind):
    rng = np.random.default_rng(C)
    dy, x, dx0 = (f32(rng.normal(size=(N, C))) for _ in range(3))
    w = f32(rng.normal(size=C))
    rstd = f32(1 / np.sqrt((x.astype(np.float64) ** 2).mean(1) + 1e-5))
    r = run_case("backward_cases", "case_rmsnorm_backward", dy=L(dy), x=L(x), w=L(w), rstd=L(rstd), dx0=L(dx0),
                 N=N, C=C, accumulate=acc, kind=kind)
    want = rmsnorm_backward_ref(dy.astype(np.float64), x, w, rstd.astype(np.float64))
    terms = np.abs(rstd[:, None] * w * dy).max()   # C = 1: dx is a cancellation, ~eps/x^2 of the terms
    assert_close(np.array(r) - (dx0.ravel() if acc else 0), want, 1e-5, "rmsnorm dx", scale=terms)


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("N,I,O,acc,split", [(1, 1, 1, False, None), (17, 33, 40, True, None),
                                              (5, 300, 19, False, None), (70, 270, 21, True, None),
                                              (17, 33, 40, True, 3), (70, 270, 100, False, 4),
                                              (9, 15, 7, True, None), (4, 2100, 3, False, None),
                                              (13, 70, 36, True, None), (9, 300, 8, False, None),
                                              (20, 17, 4, True, None), (65, 48, 132, False, None),
                                              (150, 130, 40, True, 2)])
def test_bitlinear_backward_input(run_case, N, I, O, acc, split, kind):
    rng = np.random.default_rng(N * I * O)
    t = rng.integers(-1, 2, size=(O, I))
    dy, dx0, scale = f32(rng.normal(size=(N, O))), f32(rng.normal(size=(N, I))), 0.037
    r = run_case("backward_cases", "case_bitlinear_backward_input", dy=L(dy), packed=pack_ternary(t), scale=scale,
                 dx0=L(dx0), N=N, I=I, O=O, accumulate=acc, split=split, kind=kind)
    want = dy.astype(np.float64) @ (t * np.float64(np.float32(scale)))
    assert len(r) == (2 + len(bitlinear.CPU_TILES + bitlinear.CPU_ALTERNATIVES) if kind == "cpu" else 1), sorted(r)
    for entry, dx in r.items():   # the op, and on kind "cpu" every adapter's constants
        assert_close(np.array(dx) - (dx0.ravel() if acc else 0), want, 1e-5, f"bitlinear dx ({entry})")


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("N,I,O,acc,split", [(1, 1, 1, False, None), (19, 21, 35, True, None),
                                              (70, 130, 33, False, None), (19, 21, 35, True, 3),
                                              (70, 130, 100, False, 5), (3, 150, 2, True, None),
                                              (41, 68, 9, True, None), (66, 132, 100, True, 3),
                                              (9, 68, 40, False, None)])
def test_linear_backward_input(run_case, N, I, O, acc, split, kind):
    rng = np.random.default_rng(N + I + O)
    dy, w, dx0 = f32(rng.normal(size=(N, O))), f32(rng.normal(size=(O, I))), f32(rng.normal(size=(N, I)))
    r = run_case("backward_cases", "case_linear_backward_input", dy=L(dy), w=L(w), dx0=L(dx0), N=N, I=I, O=O,
                 scale=0.5, accumulate=acc, split=split, kind=kind)
    assert_close(np.array(r) - (dx0.ravel() if acc else 0), 0.5 * dy.astype(np.float64) @ w, 1e-5, "linear dx")


def test_relu2_gating_backward(run_case):
    rng = np.random.default_rng(5)
    dh, g, u = (f32(rng.normal(size=(3, 301))) for _ in range(3))
    r = run_case("backward_cases", "case_relu2_gating_backward", dh=L(dh), g=L(g), u=L(u))
    dg, du = relu2_backward_ref(dh.astype(np.float64), g, u)
    assert_close(r["dg"], dg, 1e-6, "dg")
    assert_close(r["du"], du, 1e-6, "du")


def test_silu_backward_ref_finite_differences():
    rng = np.random.default_rng(7)
    g, u, dh = rng.normal(size=50) * 4, rng.normal(size=50), rng.normal(size=50)
    dg, du = silu_backward_ref(dh, g, u)
    e = 1e-6
    fd_g = ((silu_gating_ref(g + e, u) - silu_gating_ref(g - e, u)) / (2 * e)) * dh
    fd_u = ((silu_gating_ref(g, u + e) - silu_gating_ref(g, u - e)) / (2 * e)) * dh
    assert_close(dg, fd_g, 1e-7, "dg vs finite differences")
    assert_close(du, fd_u, 1e-7, "du vs finite differences")


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("act", ["relu2", "silu"])
@pytest.mark.parametrize("shape", [(3, 301), (5, 412)])
def test_gating_forward_backward(run_case, act, shape, kind):
    """Both FFN gatings (hidden_act relu2 and silu), forward and backward, on each device
    kind's kernels (cpu: the vec4 variant where count % 4 == 0, the GPU one otherwise);
    g spans saturated sigmoids (|g| up to ~40) and count % 256 != 0."""
    rng = np.random.default_rng(11)
    dh, u = f32(rng.normal(size=shape)), f32(rng.normal(size=shape))
    g = f32(rng.normal(size=shape) * np.where(rng.random(shape) < 0.05, 10.0, 2.0))
    r = run_case("backward_cases", "case_gating", act=act, dh=L(dh), g=L(g), u=L(u), kind=kind)
    g64, u64, dh64 = (a.astype(np.float64) for a in (g, u, dh))
    if act == "silu":
        h, (dg, du) = silu_gating_ref(g64, u64), silu_backward_ref(dh64, g64, u64)
    else:
        h, (dg, du) = np.maximum(g64, 0) ** 2 * u64, relu2_backward_ref(dh64, g64, u64)
    assert_close(r["h"], h, 1e-6, f"{act} h")
    assert_close(r["dg"], dg, 1e-6, f"{act} dg")
    assert_close(r["du"], du, 1e-6, f"{act} du")


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("B,T,H,D", [(1, 1, 1, 2), (2, 5, 3, 6), (3, 7, 2, 8), (2, 9, 3, 24)])
def test_rope_backward(run_case, B, T, H, D, kind):
    """kind "cpu": the vec4 variant where D % 8 == 0, the GPU kernel otherwise."""
    rng = np.random.default_rng(T * D)
    cos, sin = rope_tables(T, D)
    dy = f32(rng.normal(size=(B * T, H * D)))
    r = run_case("backward_cases", "case_rope_backward", dy=L(dy), cos=L(cos), sin=L(sin), N=B * T, T=T, H=H, D=D,
                 kind=kind)
    assert_close(r, rope_backward_ref(dy.astype(np.float64), cos, sin, T, H, D), 1e-6, "rope dx")


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("B,T,H,D,pos0", [(2, 5, 3, 6, 0), (3, 7, 2, 8, 0), (2, 1, 3, 24, 11)])
def test_rope_forward(run_case, B, T, H, D, pos0, kind):
    """Rows at positions pos0 + t (pos0 > 0: a decoding step over a KV cache), against
    the rotation written out in float64; kind "cpu": the vec4 variant where D % 8 == 0."""
    rng = np.random.default_rng(T * D + pos0)
    cos, sin = rope_tables(pos0 + T, D)
    x = f32(rng.normal(size=(B * T, H * D)))
    r = run_case("backward_cases", "case_rope_forward", x=L(x), cos=L(cos), sin=L(sin), N=B * T, T=T, H=H, D=D,
                 pos0=pos0, kind=kind)
    half = D // 2
    pos = pos0 + np.arange(B * T) % T
    c, s = cos.astype(np.float64).reshape(-1, half)[pos][:, None], sin.astype(np.float64).reshape(-1, half)[pos][:, None]
    x3 = x.astype(np.float64).reshape(B * T, H, D)
    want = np.concatenate([x3[..., :half] * c - x3[..., half:] * s, x3[..., half:] * c + x3[..., :half] * s], -1)
    assert_close(r, want.reshape(B * T, H * D), 1e-6, "rope y")


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("B,T,H,Hkv,D", [(1, 1, 1, 1, 4), (2, 5, 4, 4, 8), (1, 70, 4, 2, 6), (2, 3, 4, 1, 130),
                                         (1, 4, 2, 1, 200), (3, 33, 6, 3, 3), (2, 20, 2, 2, 256),
                                         (4, 37, 4, 2, 32), (1, 9, 2, 1, 128), (3, 1, 3, 1, 4),
                                         (2, 9, 6, 2, 12), (1, 16, 4, 1, 28), (2, 70, 4, 1, 64)])
def test_attention_backward(run_case, B, T, H, Hkv, D, kind):
    """kind "cpu": the CPU kernels where D % 4 == 0 (D <= 32: blocks of 4 rows, T not a
    multiple of 4, D/4 odd; N*H, N*Hkv not multiples of the 16-invocation workgroups),
    and each CPU variant's dq and dkv fed by the GPU kernels' other half; with D <= 32 also
    the op given the forward's out and lse (as the model runs it); kind "gpu": the GPU
    kernels, with and without the forward's out and lse."""
    rng = np.random.default_rng(B * T * H * D)
    N = B * T
    q, do = f32(rng.normal(size=(N, H * D))), f32(rng.normal(size=(N, H * D)))
    k, v = f32(rng.normal(size=(N, Hkv * D))), f32(rng.normal(size=(N, Hkv * D)))
    r = run_case("backward_cases", "case_attention_backward", dout=L(do), q=L(q), k=L(k), v=L(v),
                 B=B, T=T, H=H, Hkv=Hkv, D=D, kind=kind)
    dq, dk, dv = attention_backward_ref(*(a.astype(np.float64) for a in (do, q, k, v)), B, T, H, Hkv, D)
    assert_close(r["dq"], dq, 1e-5, "dq")
    assert_close(r["dk"], dk, 1e-5, "dk")
    assert_close(r["dv"], dv, 1e-5, "dv")
    assert (kind == "cpu" and D % 4 == 0) == ("mixed" in r)
    assert (kind == "gpu" or (D % 4 == 0 and D <= 32)) == ("saved" in r)
    for i, m in enumerate(r.get("mixed", []) + ([r["saved"]] if "saved" in r else [])):
        assert_close(m["dq"], dq, 1e-5, f"dq (mixed {i})")
        assert_close(m["dk"], dk, 1e-5, f"dk (mixed {i})")
        assert_close(m["dv"], dv, 1e-5, f"dv (mixed {i})")


# ----------------------------------------------------------------------------- one whole decoder layer
def bitnet_layer_torch(dims, Wf, lora_cfg, rng):
    """One BitNet decoder layer with LoRA (PEFT form, dropout on the branch input) on
    q_proj and v_proj, in torch float64 with HF's quantisers and STE. Returns the
    saved activations (f32 lists, the kernels' inputs) and the autograd gradients."""
    B, T, C, H, Hkv, D, F, R = (dims[k] for k in ("B", "T", "C", "H", "Hkv", "D", "F", "R"))
    N, eps = B * T, 1e-5
    cos, sin = rope_tables(T, D)
    tcos, tsin = t64(cos, False), t64(sin, False)
    quant = {k: weight_quant(t64(Wf[k], False)) for k in ("q", "k", "v", "o", "gate", "up", "down")}
    lin = lambda x, name: ActQuantSTE.apply(x) @ (quant[name][0] * quant[name][1]).T
    norm_w = {k: t64(f32(rng.normal(1.0, 0.3, size=n)), False)
              for k, n in (("w_in", C), ("w_asn", C), ("w_post", C), ("w_fsn", F))}
    lw = {k: t64(f32(rng.normal(size=s) * 0.3)) for k, s in (("a_q", (R, C)), ("b_q", (H * D, R)),
                                                               ("a_v", (R, C)), ("b_v", (Hkv * D, R)))}
    keep_q = t64(dropout_factor(lora_cfg["seed_q"], lora_cfg["step"], lora_cfg["p"], (N, C)), False)
    keep_v = t64(dropout_factor(lora_cfg["seed_v"], lora_cfg["step"], lora_cfg["p"], (N, C)), False)
    sc = lora_cfg["scale"]
    rstd = lambda x: torch.rsqrt(x.pow(2).mean(-1) + eps)

    h_in = t64(f32(rng.normal(size=(N, C))))
    n1 = torch_rmsnorm(h_in, norm_w["w_in"], eps)
    uq, uv = (n1 * keep_q) @ lw["a_q"].T, (n1 * keep_v) @ lw["a_v"].T
    q = lin(n1, "q") + sc * uq @ lw["b_q"].T
    k = lin(n1, "k")
    v = lin(n1, "v") + sc * uv @ lw["b_v"].T
    qr, kr = torch_rope(q, tcos, tsin, B, T, H, D), torch_rope(k, tcos, tsin, B, T, Hkv, D)
    att = torch_attention(qr, kr, v, B, T, H, Hkv, D)
    h_mid = h_in + lin(torch_rmsnorm(att, norm_w["w_asn"], eps), "o")
    n2 = torch_rmsnorm(h_mid, norm_w["w_post"], eps)
    g, u = lin(n2, "gate"), lin(n2, "up")
    hg = torch.relu(g) ** 2 * u
    h_out = h_mid + lin(torch_rmsnorm(hg, norm_w["w_fsn"], eps), "down")
    dh_out = f32(rng.normal(size=(N, C)))
    h_out.backward(t64(dh_out, False))

    saved = {"h_in": h_in, "n1": n1, "rstd1": rstd(h_in), "q": qr, "k": kr, "v": v, "attn": att,
             "rstd_as": rstd(att), "h_mid": h_mid, "n2": n2, "rstd2": rstd(h_mid), "g": g, "u": u, "hg": hg,
             "rstd_fs": rstd(hg), "uq": uq, "uv": uv}
    saved = {k: L(v.detach().numpy()) for k, v in saved.items()}
    saved["cos"], saved["sin"] = L(cos), L(sin)
    weights = {k: L(v.detach().numpy()) for k, v in {**norm_w, **lw}.items()}
    for name, (t, s) in quant.items():
        weights[name + "_packed"] = pack_ternary(t.numpy().astype(np.int64))
        weights[name + "_scale"] = s
    grads = {"dh_in": h_in.grad.numpy(), "da_q": lw["a_q"].grad.numpy(), "db_q": lw["b_q"].grad.numpy(),
             "da_v": lw["a_v"].grad.numpy(), "db_v": lw["b_v"].grad.numpy()}
    return saved, weights, L(dh_out), grads


@pytest.mark.parametrize("B,T,H,Hkv,D,p", [(2, 5, 4, 2, 6, 0.0), (1, 7, 4, 1, 8, 0.3), (2, 1, 2, 2, 4, 0.1)])
def test_decoder_layer_backward_composes(run_case, B, T, H, Hkv, D, p):
    rng = np.random.default_rng(T * H + D)
    C = H * D
    dims = {"B": B, "T": T, "C": C, "H": H, "Hkv": Hkv, "D": D, "F": 2 * C + 3, "R": 3}
    Wf = {k: f32(rng.normal(size=s) * 0.5) for k, s in (
        ("q", (H * D, C)), ("k", (Hkv * D, C)), ("v", (Hkv * D, C)), ("o", (C, C)),
        ("gate", (dims["F"], C)), ("up", (dims["F"], C)), ("down", (C, dims["F"])))}
    lora_cfg = {"scale": 16 / 3, "p": p, "seed_q": 11, "seed_v": 12, "step": 5}
    saved, weights, dh_out, want = bitnet_layer_torch(dims, Wf, lora_cfg, rng)
    got = run_case("backward_cases", "case_layer_backward", dims=dims, saved=saved, weights=weights,
                   lora_cfg=lora_cfg, dh_out=dh_out)
    for name in ("dh_in", "da_q", "db_q", "da_v", "db_v"):
        assert_close(got[name], want[name], 1e-5, name)


@pytest.mark.parametrize("kind", KINDS)
def test_head_backward_composes(run_case, kind):
    """final norm -> lm_head (tied embedding) -> masked mean cross-entropy, vs torch."""
    rng = np.random.default_rng(3)
    N, C, V = 10, 24, 517
    h = t64(f32(rng.normal(size=(N, C))))
    w, emb = f32(rng.normal(1.0, 0.3, size=C)), f32(rng.normal(size=(V, C)) * 0.2)
    tgt = rng.integers(0, V, size=N)
    tgt[[0, 1, 7]] = -100
    n_valid = int((tgt >= 0).sum())
    logits = torch_rmsnorm(h, t64(w, False), 1e-5) @ t64(emb, False).T
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor(tgt), ignore_index=-100, reduction="sum")
    (loss / n_valid).backward()
    rstd = torch.rsqrt(h.detach().pow(2).mean(-1) + 1e-5)
    r = run_case("backward_cases", "case_head_backward", logits=L(logits.detach().numpy()), targets=tgt.tolist(),
                 h=L(h.detach().numpy()), w_norm=L(w), rstd=L(rstd.numpy()), emb=L(emb), N=N, C=C, V=V,
                 grad_scale=1.0 / n_valid, kind=kind)
    assert abs(r["loss_sum"] - loss.item()) <= 1e-5 * loss.item()
    assert_close(r["dh"], h.grad.numpy(), 1e-5, "dh")


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("w_dtype", ["f32", "bf16"])
@pytest.mark.parametrize("N,I,O", [(5, 10, 150), (13, 36, 200)])
def test_linear_backward_vocab_chunks(run_case, w_dtype, N, I, O, kind):
    """The lm_head backward over vocabulary chunks bound as views (ld_dy = V), with the
    embedding in f32 or as the checkpoint's bf16."""
    rng = np.random.default_rng(11)
    dy, w = f32(rng.normal(size=(N, O))), f32(rng.normal(size=(O, I)))
    if w_dtype == "bf16":
        bits = (w.view(np.uint32) >> 16).astype(np.uint32).ravel()      # truncate to bf16
        w = (bits << 16).view(np.float32).reshape(O, I)
        words = (bits[0::2] | (bits[1::2] << 16)).tolist()
    else:
        words = w.view(np.uint32).ravel().tolist()
    r = run_case("backward_cases", "case_linear_backward_chunked", dy=L(dy), w_words=words, N=N, I=I, O=O,
                 chunk=64, w_dtype=w_dtype, kind=kind)
    assert_close(r, dy.astype(np.float64) @ w, 1e-5, "chunked dx")


def test_bench_backward_variants_give_the_kept_kernels_bits():
    """bench/bwd_variants.wgsl's candidates (timed on GPUs with `bench matmul --variants`)
    claim the kept bitlinear_backward_input's order of sums; the bench compares each one's
    dx with the kept kernel's at the same split-K plan ("bits =") and with numpy (err). The
    widths are not multiples of the tiles, so the edges' zero padding is exercised too."""
    import pathlib
    wgsl = pathlib.Path(__file__).resolve().parent.parent / "bench" / "bwd_variants.wgsl"
    variants = "bwd_k32_v4:64:128:32,bwd_2s_v4:64:128:16"
    out = subprocess.run([sys.executable, "-m", "bitlora.bench.matmul", "--shapes", "72x160x200,64x48x36",
                          "--kernels", "bwd", "--splits", "1,4", "--reps", "1", "--variants",
                          str(wgsl), "--bwd-variants", variants],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    rows = [line for line in out.splitlines() if " bwd " in line]
    for entry in ("bwd_k32_v4", "bwd_2s_v4"):
        mine = [line for line in rows if f" {entry} " in line]
        assert len(mine) == 4, (entry, out)
        for line in mine:
            assert float(line.split("err ")[1].split()[0]) < 1e-5, line
        assert any("bits = bitlinear_backward_input's" in line for line in mine), (entry, out)
        assert not any("bits !=" in line for line in mine), (entry, out)


def test_bench_attention_times_the_steps_kernels():
    """`bench attention --step` times what ops.attention records for a training step
    (on GPUs the 32-row kernels, dk and dv of shared KV heads reduced after) and checks
    its dq, dk, dv against float64; a kernel left out or a wrong sum fails here."""
    out = subprocess.run([sys.executable, "-m", "bitlora.bench.attention", "--shapes", "2x40x4x2x128",
                          "--kinds", "gpu,cpu", "--step", "--reps", "1"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    steps = {line.split(" step ")[1].split(":")[0]: line for line in out.splitlines() if " step " in line}
    assert set(steps) == {"gpu", "cpu"}, out
    assert "attention_forward_q32 attention_backward_dqs_q32 attention_backward_dkv_q32 splitk_reduce" in steps["gpu"]
    for line in steps.values():
        errs = line.split("max rel err ")[1].split()
        assert len(errs) == 3 and all(float(e.split("=")[1]) < 1e-5 for e in errs), line


@pytest.mark.parametrize("N,I,O,acc,added", [(20, 300, 1536, False, False), (9, 2560, 1100, True, False),
                                              (12, 640, 1024, True, True)])
def test_norm_backward_after_split(run_case, N, I, O, acc, added):
    """A split ternary input gradient whose reduce the norm's backward after it does
    (down_proj and ffn_sub_norm, o_proj and attn_sub_norm; `added`: added into d as
    up_proj's into gate_proj's, before post_attention_layernorm): d (the reduce's output,
    still written) and dx have the same bits as with the reduce its own dispatch, one dispatch
    fewer; dx is the reference norm backward of numpy's product."""
    rng = np.random.default_rng(N + I + O)
    t = rng.integers(-1, 2, size=(O, I))
    dy, x, dx0 = f32(rng.normal(size=(N, O))), f32(rng.normal(size=(N, I))), f32(rng.normal(size=(N, I)))
    w = f32(rng.normal(size=I))
    rstd = f32(1 / np.sqrt((x.astype(np.float64) ** 2).mean(1) + 1e-5))
    d0 = f32(rng.normal(size=(N, I))) if added else None
    r = run_case("backward_cases", "case_norm_backward_after_split", dy=L(dy), packed=pack_ternary(t), scale=0.037,
                 x=L(x), w=L(w), rstd=L(rstd), dx0=L(dx0), N=N, I=I, O=O, accumulate=acc,
                 d0=None if d0 is None else L(d0))
    assert r["deferred"] and not r["apart_deferred"]
    fused, apart = r["fused"], r["apart"]
    assert fused.pop("dispatches") == apart.pop("dispatches") - 1
    assert fused == apart
    d = dy.astype(np.float64) @ (t * np.float64(np.float32(0.037))) + (d0 if added else 0)
    assert_close(fused["d"], d, 1e-5, "d")
    want = rmsnorm_backward_ref(d, x, w, rstd.astype(np.float64))
    assert_close(np.array(fused["dx"]) - (dx0.ravel() if acc else 0), want, 1e-4, "dx",
                 scale=np.abs(rstd[:, None] * w * d).max())
