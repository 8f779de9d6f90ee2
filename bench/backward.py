"""Times the backward kernels (and the LoRA forward) at BitNet b1.58 2B-4T shapes on
the native wgpu device. Native-only (numpy). Random data: this measures speed, not
numerics (tests/test_backward.py does those).

    python -m bitlora.bench.backward [--B 2] [--T 256] [--reps 10]

Prints ms per call and GFLOP/s of each kernel; docs/PERFORMANCE.md has measured figures.
"""
import argparse
import struct
import time

import numpy as np

from bitlora import gpu, ops
from bitlora.bitnet import CONFIG_2B4T, head_dim
from bitlora.ops import attention, bitlinear, linear, relu2, rmsnorm, rope
from bitlora.ops import cross_entropy as ce
from bitlora.ops import lora


async def main(B, T, reps):
    dev = await gpu.get_device("native")
    print(dev.describe())
    await dev.prepare(ops.kernel_specs("bf16", training=True))
    c = CONFIG_2B4T
    C, F, H, Hkv, V = (c[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads",
                                      "num_key_value_heads", "vocab_size"))
    D, R = head_dim(c), 8
    N = B * T
    rng = np.random.default_rng(0)

    def f32(*shape, s=1.0):
        return dev.buffer(4 * int(np.prod(shape)), "x", data=(rng.standard_normal(shape, dtype=np.float32) * s))

    def packed(O, I):
        return dev.buffer(4 * O * -(-I // 16), "w", data=rng.integers(0, 2**32, O * -(-I // 16), dtype=np.uint32))

    x_c, dy_c, dx_c = f32(N, C), f32(N, C), f32(N, C)
    x_f, dy_f, dx_f, g_f, u_f = f32(N, F), f32(N, F), f32(N, F), f32(N, F), f32(N, F)
    w_c, rstd = f32(C), f32(N)
    wq, wgate, wdown = packed(C, C), packed(F, C), packed(C, F)
    emb = dev.buffer(2 * V * C, "emb_bf16", data=rng.integers(0, 2**32, V * C // 2, dtype=np.uint32) & 0x3C003C00)
    logits = f32(N, V)
    VC = 16384  # vocabulary rows per lm_head chunk (bindings stay under the device limits)

    def lm_head():
        for v0 in range(0, V, VC):
            oc = min(VC, V - v0)
            linear.linear_backward_input(dev, logits.view(4 * v0, 4 * ((N - 1) * V + oc)),
                                         emb.view(2 * v0 * C, 2 * oc * C), dx_c, N, C, oc, 1.0,
                                         accumulate=v0 > 0, ld_dy=V, w_dtype="bf16")
    tg = dev.buffer(4 * N, "t", data=rng.integers(0, V, N, dtype=np.int32))
    losses, lsum = dev.buffer(4 * N), dev.buffer(4)
    q, do, dq, k, v, dk, dv = (f32(N, H * D), f32(N, H * D), f32(N, H * D), f32(N, Hkv * D), f32(N, Hkv * D),
                               f32(N, Hkv * D), f32(N, Hkv * D))
    stats, cos, sin = f32(N, H, 2), f32(T, D // 2), f32(T, D // 2)
    a, b, da, db, u, du = f32(R, C), f32(C, R), f32(R, C), f32(C, R), f32(N, R), f32(N, R)
    sl = lora.LoraShape(N, C, C, R, 2.0, 0.05, 1)
    stream = dev.buffer(4, "stream", data=struct.pack("<I", 1))

    ops = {
        "cross_entropy N x V": (lambda: ce.cross_entropy_forward_backward(dev, logits, tg, losses, N, V, 1e-3),
                                4.0 * N * V * 2),
        "lm_head dx = dlogits E": (lm_head, 2.0 * N * V * C),
        "rmsnorm_backward C": (lambda: rmsnorm.rmsnorm_backward(dev, dy_c, x_c, w_c, rstd, dx_c, N, C, True), 16.0 * N * C),
        "bitlinear q (C->C)": (lambda: bitlinear.bitlinear_backward_input(dev, dy_c, wq, 0.5, dx_c, N, C, C), 2.0 * N * C * C),
        "bitlinear gate (C->F)": (lambda: bitlinear.bitlinear_backward_input(dev, dy_f, wgate, 0.5, dx_c, N, C, F),
                                  2.0 * N * C * F),
        "bitlinear down (F->C)": (lambda: bitlinear.bitlinear_backward_input(dev, dy_c, wdown, 0.5, dx_f, N, F, C),
                                  2.0 * N * C * F),
        "relu2_gating_backward": (lambda: relu2.relu2_gating_backward(dev, dy_f, g_f, u_f, x_f, dx_f, N * F), 20.0 * N * F),
        "rope_backward q": (lambda: rope.rope_backward(dev, dq, cos, sin, N, T, H, D), 8.0 * N * H * D),
        "attention_backward": (lambda: attention.attention_backward(dev, do, q, k, v, dq, dk, dv, stats, B, T, H, Hkv, D),
                               B * H * T * T * D * 2.0 * 4),
        "lora_forward q": (lambda: lora.lora_forward(dev, sl, x_c, a, b, u, dy_c, stream), 4.0 * N * C * R),
        "lora_backward q": (lambda: lora.lora_backward(dev, sl, dy_c, x_c, a, b, u, da, db, du, stream, dx_c),
                            8.0 * N * C * R),
    }
    print(f"B={B} T={T} N={N} C={C} F={F} H={H} Hkv={Hkv} D={D} V={V} R={R}")
    for name, (op, work) in ops.items():
        op()
        await dev.read(lsum)   # submit and wait (a round trip)
        t0 = time.perf_counter()
        for _ in range(reps):
            op()
        await dev.read(lsum)   # submit and wait (a round trip)
        ms = (time.perf_counter() - t0) / reps * 1e3
        print(f"{name:26s} {ms:9.3f} ms   {work / ms / 1e6:9.1f} GFLOP/s (GB/s for the elementwise ones)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=2)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    gpu.run(main(args.B, args.T, args.reps))
