"""The forward matmuls (shaders/bitlinear.wgsl, linear.wgsl) on awkward shapes, for
each device kind: the entry points of each (64 x 64 register tiles for "gpu", 8 x 32
per invocation for "cpu" where I % 4 == 0, and the few-rows kernel used for decoding), and the ternary
one with its reduction split over workgroups (splitk.wgsl), against numpy, natively
and in Chromium. The ternary matmul sums integers, which f32 holds exactly, so its
kernels must agree bit for bit with each other and with float64 numpy up to the
final scaling; that holds for the int8 kernel (bitlinear_i8.wgsl, packed activations,
dot4I8Packed) too, on every device that has it. Also the row-wise forward kernels
(rmsnorm.wgsl, bitlinear.wgsl's actquant, and the two fused), each variant."""
import numpy as np
import pytest

from bitlora.ops import bitlinear
from test_backward import L, assert_close, f32, pack_ternary


def test_int8_dot_flag(run_case):
    """Device.int8_dot is true exactly where dot4I8Packed compiles, and it computes
    signed byte dot products (lane 0 lowest)."""
    r = run_case("forward_cases", "case_int8_dot")
    assert r["int8_dot"] == r["compiles"], r
    if r["compiles"]:
        assert r["values"] == [4 * 1 + 3 * -128 + 2 * 127 + 1 * -1, 4 * -128 * -127], r


def check_bitlinear_forward(r, xq, s, t, y0, scale, acc):
    """Every entry of case_bitlinear_forward's answer equals float64 numpy's integer sums
    with the kernel's two roundings, bit for bit."""
    N, O = xq.shape[0], t.shape[0]
    dots = xq.astype(np.float64) @ t.T.astype(np.float64)            # exact integers
    want = f32(f32(dots * f32(scale)) / s[:, None])                    # the kernel's two roundings
    if acc:
        want = f32(y0 + want)
    for entry in r:
        if entry != "int8":
            got = f32(r[entry]).reshape(N, O)
            assert np.array_equal(got, want), (entry, np.abs(got - want).max())


@pytest.mark.parametrize("kind,int8", [("gpu", True), ("gpu", False), ("cpu", True)])
@pytest.mark.parametrize("N,I,O,acc", [(1, 1, 1, False), (7, 16, 64, True), (65, 33, 70, False),
                                        (130, 385, 129, True), (64, 64, 64, False), (20, 200, 30, True),
                                        (9, 17, 129, False), (300, 130, 260, True), (70, 150, 65, False),
                                        (65, 36, 70, False), (13, 388, 33, True), (9, 4, 1, False),
                                        (41, 132, 97, True), (32, 160, 50, True)])
def test_bitlinear_forward(run_case, N, I, O, acc, kind, int8):
    """kind "gpu" with int8: the op runs bitlinear_forward_i8 where the device has it (N > 8),
    int8 False: the f32 kernel, as on a device without dot4I8Packed."""
    rng = np.random.default_rng(N * 1000 + I + O)
    xq = rng.integers(-128, 128, size=(N, I)).astype(np.float32)
    s = f32(rng.uniform(0.1, 300.0, size=N))
    t = rng.integers(-1, 2, size=(O, I))
    y0, scale = f32(rng.normal(size=(N, O))), 0.0421
    r = run_case("forward_cases", "case_bitlinear_forward", xq=L(xq), s=L(s), packed=pack_ternary(t), scale=scale,
                 y0=L(y0), N=N, I=I, O=O, accumulate=acc, kind=kind, int8=int8)
    has_i8 = "bitlinear_forward_i8" in r
    assert r["int8"] == (kind == "gpu" and int8 and has_i8 and N > bitlinear.ROWS_KERNEL_MAX_N), r["int8"]
    cpu_runs = (I % 4 == 0) + 2 + len(bitlinear.CPU_TILES + bitlinear.CPU_ALTERNATIVES) if kind == "cpu" else 0
    assert len(r) == (6 + 2 * has_i8 if kind == "gpu" else 5 + cpu_runs), sorted(r)
    check_bitlinear_forward(r, xq, s, t, y0, scale, acc)


@pytest.mark.parametrize("kind,int8", [("gpu", True), ("gpu", False), ("cpu", True)])
@pytest.mark.parametrize("N,I,Os,acc", [(32, 160, (70, 33, 129), False), (65, 48, (64, 64), True),
                                        (20, 2560 // 10, (256, 64, 64), True), (200, 33, (5,), False),
                                        (9, 17, (1, 130), False), (130, 400, (96, 200, 64), True)])
def test_bitlinear_forward_parts(run_case, N, I, Os, acc, kind, int8):
    """A group of projections of one input (q, k, v; gate, up) in one int8 dispatch where
    the activations are packed (split or not: splitk_reduce_parts), each part apart
    elsewhere: numpy's integer sums with the kernels' two roundings, bit for bit."""
    rng = np.random.default_rng(N + I + sum(Os))
    xq = rng.integers(-128, 128, size=(N, I)).astype(np.float32)
    s = f32(rng.uniform(0.1, 300.0, size=N))
    ts = [rng.integers(-1, 2, size=(O, I)) for O in Os]
    y0s = [f32(rng.normal(size=(N, O))) for O in Os]
    scales = [float(f32(0.01 * (j + 3))) for j in range(len(Os))]
    parts = [[pack_ternary(t), O, sc, L(y0)] for t, O, sc, y0 in zip(ts, Os, scales, y0s)]
    r = run_case("forward_cases", "case_bitlinear_forward_parts", xq=L(xq), s=L(s), parts=parts, N=N, I=I,
                 accumulate=acc, kind=kind, int8=int8)
    packed = r.pop("int8")
    assert not packed or (kind == "gpu" and int8 and N > bitlinear.ROWS_KERNEL_MAX_N), packed
    assert sorted(r) == ["apart", "op", "split2", "split3"]
    for j, (t, sc, y0) in enumerate(zip(ts, scales, y0s)):
        check_bitlinear_forward({k: r[k][j] for k in r}, xq, s, t, y0, sc, acc)


@pytest.mark.parametrize("N,I,O", [(16, 6912, 70), (40, 2560, 96)])
def test_bitlinear_forward_int8_extremes(run_case, N, I, O):
    """The largest integer sums a 2B-4T projection can make (|xq| = 128 against whole rows
    of -1 or +1: 884736 at I = 6912) and random ones, in every kernel: exact everywhere."""
    rng = np.random.default_rng(I + O)
    xq = rng.integers(-128, 128, size=(N, I)).astype(np.float32)
    xq[0], xq[1], xq[2] = -128.0, 127.0, np.where(np.arange(I) % 2, -128.0, 127.0)
    t = rng.integers(-1, 2, size=(O, I))
    t[0], t[1], t[2] = -1, 1, np.where(np.arange(I) % 3, 1, -1)
    s = f32(rng.uniform(0.1, 300.0, size=N))
    y0 = f32(rng.normal(size=(N, O)))
    r = run_case("forward_cases", "case_bitlinear_forward", xq=L(xq), s=L(s), packed=pack_ternary(t), scale=0.5,
                 y0=L(y0), N=N, I=I, O=O, accumulate=False, kind="gpu", splits=(5,))
    check_bitlinear_forward(r, xq, s, t, y0, 0.5, False)


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("N,I,O,chunk,row0,step", [(1, 1, 1, 1, 0, 1), (9, 33, 70, 64, 0, 1),
                                                    (66, 130, 200, 77, 0, 1), (3, 40, 50, 50, 5, 7),
                                                    (12, 7, 300, 256, 2, 3), (20, 130, 150, 150, 0, 1),
                                                    (66, 132, 200, 77, 0, 1), (21, 36, 70, 64, 3, 2)])
@pytest.mark.parametrize("w_dtype", ["f32", "bf16"])
def test_linear_forward(run_case, N, I, O, chunk, row0, step, kind, w_dtype):
    """W in f32 or as the checkpoint's bf16 pairs (odd rows straddle words when I is odd)."""
    rng = np.random.default_rng(N + I + O)
    rows = row0 + (N - 1) * step + 1
    x, w = f32(rng.normal(size=(rows, I))), f32(rng.normal(size=(O, I)))
    if w_dtype == "bf16":
        bits = (w.view(np.uint32) >> 16).astype(np.uint32)                 # truncate to bf16
        w = (bits << 16).view(np.float32)

        def words(b):
            b = np.append(b.ravel(), np.uint32(0)) if b.size % 2 else b.ravel()
            return (b[0::2] | (b[1::2] << 16)).tolist()
        chunks = [[v0, min(chunk, O - v0), words(bits[v0:v0 + chunk])] for v0 in range(0, O, chunk)]
    else:
        chunks = [[v0, min(chunk, O - v0), L(w[v0:v0 + chunk])] for v0 in range(0, O, chunk)]
    r = run_case("forward_cases", "case_linear_forward", x=L(x), w_chunks=chunks, N=N, I=I, O=O,
                 x_row0=row0, x_step=step, kind=kind, w_dtype=w_dtype)
    want = x[row0::step][:N].astype(np.float64) @ w.T.astype(np.float64)
    assert len(r) == (2 if kind == "cpu" and I % 4 else 3), sorted(r)
    for entry in r:
        assert_close(r[entry], want, 1e-5, entry)


@pytest.mark.parametrize("kind", ["gpu", "cpu"])
@pytest.mark.parametrize("B,T,H,Hkv,D,pos0,S", [(1, 1, 1, 1, 4, 0, 1), (2, 70, 4, 2, 6, 0, 70),
                                                (1, 5, 2, 1, 130, 0, 5), (2, 3, 2, 1, 256, 0, 3),
                                                (3, 17, 4, 2, 32, 0, 17), (1, 70, 6, 3, 128, 0, 70),
                                                (2, 9, 3, 1, 4, 0, 9), (2, 11, 6, 2, 12, 0, 11),
                                                (2, 1, 4, 2, 32, 37, 50), (1, 5, 2, 1, 16, 9, 20),
                                                (2, 3, 4, 2, 128, 4, 8), (1, 10, 3, 3, 8, 6, 16),
                                                (1, 41, 2, 1, 200, 30, 75), (2, 1, 4, 2, 256, 90, 100),
                                                (2, 41, 4, 1, 64, 30, 75)])
def test_attention_forward(run_case, B, T, H, Hkv, D, pos0, S, kind):
    """GPU kernels: T = 1 one workgroup per query row (every head dim a thread may own,
    lid + 64e, e < 4; keys in chunks of 64); T > 1 blocks of 8 query rows (T not a
    multiple of 8, dims 4s + 128e, keys in several blocks of 32, after pos0 cached
    ones). CPU kind: the CPU kernels where D % 4 == 0 (D <= 32: blocks of 4 query
    rows, T not a multiple of 4; N*H not a multiple of the 16-invocation workgroup), the
    GPU one otherwise. pos0 > 0: T new tokens over a KV cache of S positions whose
    entries past pos0 + T - 1 must be ignored (decoding)."""
    rng = np.random.default_rng(T * D + pos0)
    N = B * T
    q = f32(rng.normal(size=(N, H * D)))
    k, v = f32(rng.normal(size=(B * S, Hkv * D))), f32(rng.normal(size=(B * S, Hkv * D)))
    r = run_case("forward_cases", "case_attention_forward", q=L(q), k=L(k), v=L(v), B=B, T=T, H=H, Hkv=Hkv, D=D,
                 kind=kind, pos0=pos0, S=S)
    P = pos0 + T                                   # cache positions in use
    q4 = q.astype(np.float64).reshape(B, T, H, D)
    k4 = np.repeat(k.astype(np.float64).reshape(B, S, Hkv, D)[:, :P], H // Hkv, axis=2)
    v4 = np.repeat(v.astype(np.float64).reshape(B, S, Hkv, D)[:, :P], H // Hkv, axis=2)
    s = np.einsum("bthd,bshd->bhts", q4, k4) / np.sqrt(D)
    s = np.where(np.arange(P)[None, :] <= pos0 + np.arange(T)[:, None], s, -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    out = np.einsum("bhts,bshd->bthd", np.exp(s - lse[..., None]), v4)
    assert_close(r["out"], out.reshape(N, H * D), 1e-5, "out")
    assert_close(r["lse"], lse.transpose(0, 2, 1).reshape(N, H), 1e-5, "lse")


KINDS = ["gpu", "cpu"]   # the kernel variants (Device.kind); the CPU ones need widths % 4 == 0, else fall back


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,C", [(1, 1), (3, 257), (1, 4), (17, 12), (40, 128), (5, 600)])
def test_rmsnorm_forward(run_case, N, C, kind):
    rng = np.random.default_rng(N + C)
    x, w = f32(rng.normal(size=(N, C)) * 3), f32(rng.normal(1.0, 0.3, size=C))
    r = run_case("forward_cases", "case_rmsnorm_forward", x=L(x), w=L(w), N=N, C=C, eps=1e-5, kind=kind)
    rstd = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(1) + 1e-5)
    assert_close(r["rstd"], rstd, 1e-6, "rstd")
    assert_close(r["y"], w * (x * rstd[:, None]), 1e-6, "y")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("N,I", [(1, 1), (3, 257), (1, 4), (17, 12), (40, 128), (5, 600)])
def test_actquant_forward(run_case, N, I, kind):
    rng = np.random.default_rng(N * I)
    x = f32(rng.normal(size=(N, I)) * rng.uniform(0.01, 10.0, size=(N, 1)))
    if N > 2:
        x[0, :] = 0.0                                # an all-zero row: s = 127 / 1e-5
    r = run_case("forward_cases", "case_actquant_forward", x=L(x), N=N, I=I, kind=kind)
    s = f32(r["s"])
    assert_close(s, 127.0 / np.maximum(np.abs(x.astype(np.float64)).max(1), 1e-5), 1e-6, "s")
    want = np.clip(np.round(f32(x * s[:, None])), -128, 127)   # round half to even, from the kernel's s
    assert np.array_equal(f32(r["xq"]).reshape(N, I), want), np.abs(f32(r["xq"]).reshape(N, I) - want).max()


@pytest.mark.parametrize("kind,int8", [("gpu", True), ("gpu", False), ("cpu", True)])
@pytest.mark.parametrize("N,C", [(1, 1), (3, 257), (17, 12), (40, 128), (9, 600), (12, 2560), (2, 4500),
                                 (10, 6916), (9, 9000), (9, 9300)])
def test_rmsnorm_quant_forward(run_case, N, C, kind, int8):
    """RMSNorm + activation quantisation in one dispatch (GPU; packed int8 where the device
    has dot4I8Packed and N > 8) gives the same bits as the two ops, and the references."""
    rng = np.random.default_rng(N + C)
    x, w = f32(rng.normal(size=(N, C)) * 3), f32(rng.normal(1.0, 0.3, size=C))
    if N > 2:
        x[1, :] = 0.0                                # an all-zero row: s = 127 / 1e-5
    r = run_case("forward_cases", "case_rmsnorm_quant_forward", x=L(x), w=L(w), N=N, C=C, eps=1e-5, kind=kind,
                 int8=int8)
    assert r["fused"] == r["two_ops"]
    got = r["fused"]
    rstd = 1 / np.sqrt((x.astype(np.float64) ** 2).mean(1) + 1e-5)
    assert_close(got["rstd"], rstd, 1e-6, "rstd")
    y = f32(got["y"]).reshape(N, C)
    assert np.array_equal(y, f32(w * f32(x * f32(got["rstd"])[:, None]))), "y"
    s = f32(got["s"])
    assert np.array_equal(s, f32(127.0 / np.maximum(np.abs(y).max(1), f32(1e-5)))), "s"
    assert np.array_equal(f32(got["xq"]).reshape(N, C), np.clip(np.round(f32(y * s[:, None])), -128, 127))


@pytest.mark.parametrize("B,T,H,Hkv,D,S,pos0,I", [(1, 12, 4, 2, 16, 20, 3, 1100), (2, 9, 2, 2, 8, 12, 0, 1536)])
def test_rope_after_split(run_case, B, T, H, Hkv, D, S, pos0, I):
    """A split int8 forward of q, k, v whose reduce rope_kv_store does (the prompt over a
    KV cache): q and both caches have the same bits as with the reduce its own dispatch,
    and q is numpy's rotation of the exact sums."""
    rng = np.random.default_rng(B + T + I)
    N = B * T
    xq = rng.integers(-128, 128, size=(N, I)).astype(np.float32)
    s = f32(rng.uniform(0.1, 300.0, size=N))
    ts = [rng.integers(-1, 2, size=(h * D, I)) for h in (H, Hkv, Hkv)]
    parts = [[pack_ternary(t), t.shape[0], float(f32(0.03 * (j + 1))), []] for j, t in enumerate(ts)]
    r = run_case("forward_cases", "case_rope_after_split", xq=L(xq), s=L(s), parts=parts, I=I, B=B, T=T, H=H,
                 Hkv=Hkv, D=D, S=S, pos0=pos0)
    if not r["int8"]:
        assert not r["fused_deferred"]
        pytest.skip("no dot4I8Packed here: no int8 forward to split")
    assert r["fused_deferred"] and not r["apart_deferred"]
    assert r["fused"] == r["apart"]
    q = f32(f32(xq.astype(np.float64) @ ts[0].T.astype(np.float64) * f32(parts[0][2])) / s[:, None])
    pos = pos0 + np.arange(N) % T
    inv = 1.0 / (10000.0 ** (np.arange(0, D, 2) / D))
    ang = pos[:, None] * inv[None, :]
    c, sn = np.tile(np.cos(ang), (1, H)), np.tile(np.sin(ang), (1, H))
    qh = q.reshape(N, H, D)
    x1, x2 = qh[:, :, : D // 2].reshape(N, -1), qh[:, :, D // 2:].reshape(N, -1)
    want = np.concatenate([(x1 * c - x2 * sn).reshape(N, H, D // 2), (x2 * c + x1 * sn).reshape(N, H, D // 2)], 2)
    assert_close(r["fused"]["q"], want.reshape(-1), 1e-5, "q")


@pytest.mark.parametrize("N,F,I,act", [(20, 96, 1536, "relu2"), (33, 70, 1100, "silu"), (9, 300, 2048, "relu2")])
def test_forward_gated(run_case, N, F, I, act):
    """The gate and up projections with their gating in the split product's reduce
    (splitk_reduce_gated): g, u and h have the same bits as the reduce and the gating as
    their own dispatches, and as the unsplit product; h is numpy's gating of the exact sums."""
    rng = np.random.default_rng(N + F + I)
    xq = rng.integers(-128, 128, size=(N, I)).astype(np.float32)
    s = f32(rng.uniform(0.1, 300.0, size=N))
    ts = [rng.integers(-1, 2, size=(F, I)) for _ in range(2)]
    parts = [[pack_ternary(t), F, float(f32(0.02 * (j + 1))), []] for j, t in enumerate(ts)]
    r = run_case("forward_cases", "case_forward_gated", xq=L(xq), s=L(s), parts=parts, N=N, I=I, act=act)
    assert r.pop("int8") in (True, False)
    assert r["split3"] == r["apart3"] == r["split1"] == r["apart1"]
    g, u, h = (f32(v).reshape(N, F) for v in r["split3"])
    for got, t, (_, _, sc, _) in zip((g, u), ts, parts):
        assert np.array_equal(got, f32(f32(xq.astype(np.float64) @ t.T.astype(np.float64) * f32(sc)) / s[:, None]))
    want = f32(f32(np.maximum(g, 0) ** 2) * u) if act == "relu2" else g * (1 / (1 + np.exp(-g.astype(np.float64)))) * u
    assert_close(h, want, 1e-6, "h")


def test_forward_gated_checks():
    """gate takes exactly two parts of one width, written, and a known activation."""
    with pytest.raises(ValueError, match="two parts of one width"):
        bitlinear.bitlinear_forward_parts(None, None, None, None, [(0, 4, 1.0, None)], 9, 16, gate=("relu2", None))
    with pytest.raises(ValueError, match="not one of"):
        bitlinear.bitlinear_forward_parts(None, None, None, None, [(0, 4, 1.0, None)] * 2, 9, 16, gate=("gelu", None))

