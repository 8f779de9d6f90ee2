"""Decoding's one-row kernels (shaders/matvec.wgsl, sample.wgsl) for each device kind,
natively and in Chromium: the fused norm + quantisation and the ternary
matrix-vector product give the same bits as the kernels they stand in for
(rmsnorm_forward, actquant_forward, bitlinear_forward) and numpy's integers; the head's
matrix-vector product matches linear_forward; the GPU sampler picks numpy's argmax
(first among equals), is seeded, and keeps to the top-p set."""
import numpy as np
import pytest

from bitlora.ops import matvec
from test_backward import L, f32, pack_ternary

KINDS = ["gpu", "cpu"]


def unpack_xq(words):
    """matvec.wgsl's packed activations -> q[16 W] (word 4k + m, byte j = column 16k + 4j + m)."""
    b = np.asarray(words, dtype=np.uint32).view(np.int8).reshape(-1, 4, 4)   # [k, m, j]
    return b.transpose(0, 2, 1).reshape(-1).astype(np.int64)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("C,Os,acc", [(128, (128, 64, 64), False), (40, (40,), True), (2560 // 10, (384, 384), False),
                                      (17, (3, 5, 7), False), (384, (128,), True), (1, (1,), False),
                                      (640, (40, 1000), False), (4160, (64, 32), True)])
def test_norm_quant_matvec_same_bits(run_case, C, Os, acc, kind):
    rng = np.random.default_rng(C + sum(Os))
    x = f32(rng.normal(size=C) * 3)
    w = f32(rng.normal(1.0, 0.3, size=C))
    ts = [rng.integers(-1, 2, size=(O, C)) for O in Os]
    parts = [[pack_ternary(t), O, float(f32(0.01 * (j + 1))), L(rng.normal(size=O))] for j, (t, O) in enumerate(zip(ts, Os))]
    r = run_case("decode_cases", "case_norm_quant_matvec", x=L(x), w=L(w), C=C, eps=1e-5, parts=parts,
                 accumulate=acc, kind=kind)
    assert r["y"] == r["old_y"]
    assert ("fused_out" in r) == (kind == "gpu" and C % 64 == 0)
    assert r.get("fused_out", r["out"]) == r["out"]     # norm_matvec (GPU kind, whole vec4 words)
    for key in r:   # ... with matvec.NM_BATCHES row blocks a workgroup
        if key.startswith("fused_batched"):
            assert r[key] == r["out"], key
    assert sum(k.startswith("fused_batched") for k in r) == (len(matvec.NM_BATCHES) if "fused_out" in r else 0)
    y = f32(r["y"])
    s = f32(r["qs"][0])
    assert s == f32(127.0 / max(np.abs(y).max(), 1e-5))
    q = unpack_xq(r["xq"])
    assert not q[C:].any(), "padding columns must be 0"
    q = q[:C]
    assert np.array_equal(q, np.clip(np.round(y * s), -128, 127)), "packed activations"
    assert r["qs"][1] == q.sum()
    for j, (t, (_, O, scale, y0)) in enumerate(zip(ts, parts)):
        got, old = f32(r["out"][j]), f32(r["old_out"][j])
        want = f32(f32((q @ t.T).astype(np.float64) * f32(scale)) / s)
        if acc:
            want = f32(f32(y0) + want)
        assert np.array_equal(got, old), (j, np.abs(got - old).max())
        assert np.array_equal(got, want), (j, np.abs(got - want).max())


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("act", ["relu2", "silu"])
@pytest.mark.parametrize("C", [384, 40, 17, 4160])
def test_gated_norm_quant_same_bits(run_case, C, act, kind):
    """The MLP's gating before the norm of down_proj's input (fused on a GPU): the bits of
    gating_forward, rmsnorm_forward, actquant_forward and bitlinear_forward."""
    rng = np.random.default_rng(C)
    g, u, w = f32(rng.normal(size=C) * 2), f32(rng.normal(size=C)), f32(rng.normal(1.0, 0.3, size=C))
    parts = [[pack_ternary(rng.integers(-1, 2, size=(64, C))), 64, 0.02, L(rng.normal(size=64))]]
    r = run_case("decode_cases", "case_norm_quant_matvec", x=L(g), w=L(w), C=C, eps=1e-5, parts=parts,
                 accumulate=True, kind=kind, act=act, u=L(u))
    assert r["y"] == r["old_y"]
    assert r["out"] == r["old_out"]
    for key in r:   # norm_matvec, with 1 and matvec.NM_BATCHES row blocks a workgroup
        if key.startswith("fused"):
            assert r[key] == r["out"], key


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("C,Os,adapted,R,acc,act", [(128, (128, 64, 64), (True, False, True), 8, False, None),
                                                    (40, (40,), (True,), 3, True, None),
                                                    (384, (96, 384), (False, True), 1, False, None),
                                                    (17, (3, 5, 7), (True, True, True), 2, False, None),
                                                    (1000, (64,), (True,), 4, True, "relu2"),
                                                    (2560 // 4, (48, 16), (True, True), 16, False, "silu")])
def test_matvec_lora_same_bits(run_case, C, Os, adapted, R, acc, act, kind):
    """The LoRA branch folded into decoding (its down half in rmsnorm_quant's dispatch on a
    GPU, then the matvec adds B u as lora_up would) gives the bits of bitlinear_forward +
    lora_forward, and the down half those of lora_down_parts (gated rows too: down_proj)."""
    rng = np.random.default_rng(C * R + sum(Os))
    x, w = f32(rng.normal(size=C) * 3), f32(rng.normal(1.0, 0.3, size=C))
    parts = [[pack_ternary(rng.integers(-1, 2, size=(O, C))), O, 0.02, L(rng.normal(size=O))] for O in Os]
    loras = [[L(rng.uniform(-0.3, 0.3, size=(R, C))), L(rng.normal(size=(O, R)))] if a else None
             for O, a in zip(Os, adapted)]
    gated = {"act": act, "u": L(rng.normal(size=C))} if act else {}
    r = run_case("decode_cases", "case_norm_quant_matvec", x=L(x), w=L(w), C=C, eps=1e-5, parts=parts,
                 accumulate=acc, kind=kind, loras=loras, R=R, lora_scale=2.0, **gated)
    assert r["y"] == r["old_y"]
    assert r["u"] == r["u_apart"]
    assert any(r["u"][j * R:(j + 1) * R] for j, a in enumerate(adapted) if a)
    for j in range(len(Os)):
        got, old = f32(r["out"][j]), f32(r["old_out"][j])
        assert np.array_equal(got, old), (j, np.abs(got - old).max())


def bf16_words(w):
    """w[O, C] f32 -> (its bf16 rounding as f32, u32 words of bf16 pairs, low half first)."""
    bits = (f32(w).view(np.uint32) >> 16).astype(np.uint32)   # truncation: any bf16 will do
    flat = bits.ravel()
    if flat.size % 2:
        flat = np.append(flat, 0)
    words = flat[0::2] | (flat[1::2] << 16)
    return (bits << 16).view(np.float32), words.astype(np.uint32)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("C,V,chunk,row0,bf16", [(128, 1024, 1024, 0, True), (128, 300, 64, 3, False),
                                                 (40, 300, 256, 2, True), (20, 70, 70, 1, False),
                                                 (2560 // 8, 1000, 512, 5, True), (7, 9, 9, 0, False)])
def test_dense_matvec(run_case, C, V, chunk, row0, bf16, kind):
    rng = np.random.default_rng(C + V + row0)
    x = f32(rng.normal(size=(row0 + 1, C)))
    w = f32(rng.normal(size=(V, C)))
    if bf16:
        w, _ = bf16_words(w)
    chunks = []
    for v0 in range(0, V, chunk):
        part = w[v0:v0 + chunk]
        chunks.append([v0, part.shape[0], bf16_words(part)[1].tolist() if bf16 else part.view(np.uint32).ravel().tolist()])
    r = run_case("decode_cases", "case_dense_matvec", x=L(x), w_chunks=chunks, C=C, V=V, row0=row0, bf16=bf16, kind=kind)
    want = w.astype(np.float64) @ x[row0].astype(np.float64)
    for key in ("new", "old"):
        got = np.asarray(r[key])
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), key
    assert np.array_equal(np.argmax(r["new"]), np.argmax(want))


@pytest.mark.parametrize("kind", KINDS)
def test_sample_greedy_first_max(run_case, kind):
    rng = np.random.default_rng(0)
    for V in (1, 7, 300, 1024, 5000):
        logits = f32(rng.normal(size=V))
        r = run_case("decode_cases", "case_sample", logits=L(logits), seed=0, temperature=0.0, top_p=1.0, n0=3,
                     kind=kind)
        assert r["out"] == [int(np.argmax(logits))] and r["tok"] == r["out"][0] and r["n"] == 4
    logits = np.zeros(1000, dtype=np.float32)
    logits[[513, 700, 999]] = 2.0                      # ties: the first index, as torch.argmax
    r = run_case("decode_cases", "case_sample", logits=L(logits), seed=0, temperature=0.0, top_p=1.0, kind=kind)
    assert r["out"] == [513]
    logits = np.zeros(6000, dtype=np.float32)
    logits[[1500, 1756, 5999]] = 2.0                   # ties in one thread's unrolled run of loads, and past it
    r = run_case("decode_cases", "case_sample", logits=L(logits), seed=0, temperature=0.0, top_p=1.0, kind=kind)
    assert r["out"] == [1500]


@pytest.mark.parametrize("kind", KINDS)
def test_sample_seeded_top_p(run_case, kind):
    rng = np.random.default_rng(1)
    V = 3000
    logits = f32(rng.normal(size=V) * 2)
    kw = dict(logits=L(logits), temperature=0.8, top_p=0.9, steps=400, kind=kind)
    a = run_case("decode_cases", "case_sample", seed=5, **kw)
    assert a == run_case("decode_cases", "case_sample", seed=5, **kw)
    assert a["out"] != run_case("decode_cases", "case_sample", seed=6, **kw)["out"]
    p = np.exp((logits - logits.max()) / 0.8)
    p /= p.sum()
    order = np.argsort(-p)
    keep = order[:np.searchsorted(np.cumsum(p[order]), 0.9) + 1]      # the smallest top set reaching 0.9
    assert set(a["out"]) <= set(keep.tolist())
    assert len(set(a["out"])) > 20                        # draws spread over the kept set
    # the draws follow p over the kept set: the most likely tokens come most often
    counts = np.bincount(a["out"], minlength=V)
    assert counts[order[0]] >= counts[order[len(keep) // 2]]
    # top_p tiny: the most likely token only; top_p 1, high temperature: anything
    r = run_case("decode_cases", "case_sample", logits=L(logits), seed=1, temperature=1.0, top_p=1e-6, steps=20,
                     kind=kind)
    assert set(r["out"]) == {int(np.argmax(logits))}
    r = run_case("decode_cases", "case_sample", logits=L(logits[:4]), seed=1, temperature=100.0, top_p=1.0, steps=200,
                     kind=kind)
    assert set(r["out"]) == {0, 1, 2, 3}


@pytest.mark.parametrize("B,T,H,Hkv,D,S,pos0", [(1, 1, 4, 2, 32, 9, 5), (2, 3, 2, 1, 6, 8, 4), (1, 7, 20, 5, 128, 7, 0),
                                               (1, 1, 3, 3, 2, 1, 0)])
def test_rope_kv_store_same_bits(run_case, B, T, H, Hkv, D, S, pos0):
    rng = np.random.default_rng(B + T + H + D)
    q, k, v = (f32(rng.normal(size=(B * T, h * D))) for h in (H, Hkv, Hkv))
    r = run_case("decode_cases", "case_rope_kv_store", q=L(q), k=L(k), v=L(v), B=B, T=T, H=H, Hkv=Hkv, D=D, S=S,
                 pos0=pos0)
    assert r["new"] == r["old"] == r["buf"]
