"""Portable cases for the optimizer (bitlora.optim): global norm, clipping, loss
normalisation and AdamW on the GPU. Standard library + bitlora only; tests/test_optim.py
runs them natively and in the browser and compares with torch.

Gradients and initial parameters come from `tensor_values`, a deterministic generator
that the pytest side imports too, so nothing large crosses the browser boundary on
the way in. Values are built from random bits with big-integer masks (fast even in
Pyodide): sign and mantissa random, exponent spread over 8 octaves above 2^(E-127).
"""
import array
import base64
import random

from bitlora.ops import hello
from bitlora.optim import AdamW, ParamArena

NAN_BITS = 0x7FC00000


def tensor_values(seed: int, n: int, exponent: int) -> array.array:
    """n f32 values +-(1+f) * 2^(e-127), e in [exponent, exponent+8), exponent % 8 == 0."""
    assert exponent % 8 == 0 and 0 < exponent < 247
    rng = random.Random(seed)
    bits = int.from_bytes(rng.randbytes(4 * n), "little")
    keep = int.from_bytes(b"\xff\xff\xff\x83" * n, "little")     # sign, 3 low exponent bits, mantissa
    base = int.from_bytes((exponent << 23).to_bytes(4, "little") * n, "little")
    out = array.array("f")
    out.frombytes(((bits & keep) | base).to_bytes(4 * n, "little"))
    return out


def step_plan(seed: int, steps: int, ntensors: int):
    """Per step: (num_target_tokens, [gradient exponent per tensor]) — a mix of steps
    below and above the clipping threshold, tensors of different magnitudes."""
    rng = random.Random(seed * 7919 + 1)
    plan = []
    for _ in range(steps):
        tokens = int(10 ** rng.uniform(0, 3))
        plan.append((tokens, [8 * rng.randint(13, 15) for _ in range(ntensors)]))
    return plan


def raw_grads(seed: int, step: int, sizes, exponents):
    return [tensor_values(seed * 1_000_003 + step * 101 + t, n, e) for t, (n, e) in enumerate(zip(sizes, exponents))]


def init_params(seed: int, sizes):
    return [tensor_values(seed * 31 + t + 17, n, 120) for t, n in enumerate(sizes)]


def lr_at(lr: float, step: int, steps: int) -> float:
    """A linear-decay schedule: lr changes every step, pipelines must not."""
    return lr * (1.0 - 0.5 * step / steps)


def b64(values) -> str:
    return base64.b64encode(bytes(memoryview(values).cast("B"))).decode()


def flat(named: dict, names) -> array.array:
    out = array.array("f")
    for n in names:
        out.extend(named[n])
    return out


async def _arena(dev, sizes):
    names = [f"t{i}" for i in range(len(sizes))]
    return ParamArena(dev, [(n, (s,)) for n, s in zip(names, sizes)]), names


async def case_adamw_run(dev, sizes, steps, seed=0, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
                         max_grad_norm=1.0, nan_step=-1, per_tensor=False, per_thread=None, kind=None):
    """`steps` fused optimizer steps on random gradients; the final p, m, v and every
    step's reported norm/clip. Results are awaited a step late, as a trainer does.
    `kind`: the kernel variants of that device kind (None: the device's own)."""
    with dev.kind_as(kind):
        return await _adamw_run(dev, sizes, steps, seed, lr, betas, eps, weight_decay, max_grad_norm, nan_step,
                                per_tensor, per_thread)


async def _adamw_run(dev, sizes, steps, seed, lr, betas, eps, weight_decay, max_grad_norm, nan_step, per_tensor,
                     per_thread):
    arena, names = await _arena(dev, sizes)
    opt = AdamW(dev, arena, lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                max_grad_norm=max_grad_norm, **({} if per_thread is None else {"per_thread": per_thread}))
    for n, v in zip(names, init_params(seed, sizes)):
        arena.write(arena.params, n, v)
    plan = step_plan(seed, steps, len(sizes))
    reports, pending, compiled_after_first = [], None, None
    for k, (tokens, exps) in enumerate(plan):
        grads = raw_grads(seed, k, sizes, exps)
        if k == nan_step:
            grads[-1][len(grads[-1]) // 2] = float("nan")
        for n, g in zip(names, grads):
            arena.write(arena.grads, n, g)
        opt.lr = lr_at(lr, k, steps)
        res = await opt.step(tokens, per_tensor=per_tensor)
        if pending is not None:
            reports.append(await pending)
        pending = res
        if k == 0:
            compiled_after_first = dev.pipelines_compiled
    reports.append(await pending)
    out = {"reports": reports, "recompiled": dev.pipelines_compiled - compiled_after_first}
    for what in ("params", "m", "v", "grads"):
        out[what] = b64(flat(await arena.read(getattr(arena, what)), names))
    return out


async def case_clip_ops(dev, sizes, seed=0, num_target_tokens=8, max_grad_norm=1.0, exponents=None):
    """The seed's separate operations: scale by 1/N, sum of squares into the accumulator,
    clip. Returns the gradients after scaling and after clipping, and the state."""
    arena, names = await _arena(dev, sizes)
    opt = AdamW(dev, arena, max_grad_norm=max_grad_norm)
    exponents = exponents or [8 * (14 + t % 3) for t in range(len(sizes))]
    for n, g in zip(names, raw_grads(seed, 0, sizes, exponents)):
        arena.write(arena.grads, n, g)
    await opt.scale(1.0 / num_target_tokens)
    scaled = flat(await arena.read(arena.grads), names)
    opt.zero_accumulator()
    await opt.sum_squares()
    await opt.clip()
    clipped = flat(await arena.read(arena.grads), names)
    state = await opt.read_state()
    return {"scaled": b64(scaled), "clipped": b64(clipped), "state": state, "exponents": exponents}


async def case_accumulate(dev, sizes, seed=0, tokens=(5, 9, 3), max_grad_norm=1.0):
    """k micro-batches whose raw gradient sums are added on the GPU, then one step over
    sum(tokens) target tokens: the clip must act on the mean gradient."""
    arena, names = await _arena(dev, sizes)
    await dev.prepare(hello.kernel_specs())
    opt = AdamW(dev, arena, max_grad_norm=max_grad_norm)
    for n, v in zip(names, init_params(seed, sizes)):
        arena.write(arena.params, n, v)
    micro = dev.buffer(4 * arena.n, "micro")
    for j, _ in enumerate(tokens):
        for n, g in zip(names, raw_grads(seed + j, 0, sizes, [120] * len(sizes))):
            arena.write(micro, n, g)
        hello.axpy(dev, 1.0, micro, arena.grads, arena.n)
        dev.submit()
    res = await (await opt.step(sum(tokens)))
    return {"report": res, "params": b64(flat(await arena.read(arena.params), names))}


async def case_zero_grad(dev, sizes, max_grad_norm=1.0):
    """An all-zero gradient: norm 0, factor 1, no NaN anywhere."""
    arena, names = await _arena(dev, sizes)
    opt = AdamW(dev, arena, max_grad_norm=max_grad_norm)
    for n, v in zip(names, init_params(0, sizes)):
        arena.write(arena.params, n, v)
    res = await (await opt.step(7))
    return {"report": res, "params": b64(flat(await arena.read(arena.params), names)),
            "m": b64(flat(await arena.read(arena.m), names))}


async def case_step_is_async(dev, sizes=(3, 257)):
    """step() returns before anything is read back; two steps in flight resolve in order."""
    arena, names = await _arena(dev, sizes)
    opt = AdamW(dev, arena)
    waited = []
    for k in range(2):
        for n, g in zip(names, raw_grads(0, k, sizes, [120] * len(sizes))):
            arena.write(arena.grads, n, g)
        res = await opt.step(10 + k)
        waited.append(res._state_rb._data is None and not dev._pending_reads)  # submitted, not read
        if k == 0:
            first = res
    second = res
    return {"unread_after_step": waited, "first": await first, "second": await second}
