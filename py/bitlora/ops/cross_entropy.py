"""Wrappers for shaders/cross_entropy.wgsl: masked next-token cross-entropy, forward and
backward in one pass over logits[N, V] (overwritten by dlogits), and the loss sum.
They check sizes, pack the uniform and record a dispatch; the math is in the shader
header. Browser-safe: standard library + bitlora only.

Shapes: logits[N, V] f32 (in: logits, out: dlogits), targets[N] i32 (< 0 = masked,
already shifted to the next token), losses[N] f32, loss_sum[1] f32.
"""
from __future__ import annotations

from ._check import need, quads
from ._uniform import Uniform

SHADER = "cross_entropy.wgsl"
FORWARD_BACKWARD = Uniform("CrossEntropyParams", "n:u32 v:u32 grad_scale:f32")
SUM = Uniform("CrossEntropySumParams", "n:u32")
CER = 16  # rows per workgroup of cross_entropy_forward_backward_rows (cross_entropy.wgsl CER)


def kernel_specs(table_dtype: str = "f32", training: bool = False, kind: str | None = None,
                 shapes: dict | None = None) -> list:
    """The GPU kernels (on a CPU the fallback where V % 4 != 0: not with such `shapes`), the
    CPU variants unless kind is "gpu"."""
    if not training:
        return []
    cpu = ["cross_entropy_forward_backward_rows", "cross_entropy_sum_serial"] if kind != "gpu" else []
    gpu = [] if quads(shapes, "V") else ["cross_entropy_forward_backward"] + ([] if kind == "cpu" else ["cross_entropy_sum"])
    return [(SHADER, e) for e in gpu + cpu]


def cross_entropy_forward_backward(dev, logits, targets, losses, N: int, V: int, grad_scale: float) -> None:
    """Record losses[n] = lse - logits[n, t] (0 if masked) and, in place,
    logits[n, :] <- grad_scale * (softmax - onehot(t)) (0 for masked rows)."""
    for b, n, what in ((logits, N * V, "logits"), (targets, N, "targets"), (losses, N, "losses")):
        need(b, n, what, "cross_entropy_forward_backward")
    rows = dev.kind == "cpu" and V % 4 == 0
    dev.dispatch(dev.prepared(SHADER, "cross_entropy_forward_backward_rows" if rows else
                              "cross_entropy_forward_backward"), [logits, targets, losses],
                 groups=-(-N // CER) if rows else N, params=FORWARD_BACKWARD.pack(N, V, grad_scale))


def cross_entropy_sum(dev, losses, loss_sum, N: int) -> None:
    """Record loss_sum[0] += sum(losses[N]) (one workgroup; on a CPU one invocation)."""
    need(losses, N, "losses", "cross_entropy_sum")
    need(loss_sum, 1, "loss_sum", "cross_entropy_sum")
    entry = "cross_entropy_sum_serial" if dev.kind == "cpu" else "cross_entropy_sum"
    dev.dispatch(dev.prepared(SHADER, entry), [losses, loss_sum], groups=1, params=SUM.pack(N))
