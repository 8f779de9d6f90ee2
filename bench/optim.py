"""The optimizer benchmark (native only: numpy, and torch where a CUDA GPU is there to
compare). Not part of the wheel the browser gets.

`bitlora bench optim --params N`: the fused optimizer step (global norm + clip +
1/N scale + AdamW + gradient zeroing) over N parameters in ~200 tensors, time per
step and effective bandwidth; beside it, on a CUDA machine, torch's
`clip_grad_norm_` + `AdamW(fused=True)` over the same tensor sizes.

Bytes counted per parameter and step: the norm pass reads g (4), AdamW reads p, g,
m, v and writes p, m, v (28): 32 B, the Trainer's step (AdamW(zero_grads=False): the
next step's first micro-batch writes the gradients). Zeroing them in AdamW (the
default, timed beside as "zeroing") writes 4 B more. torch's clip + fused AdamW moves
8 + 28 = 36 B (clip reads g, scales it in place; AdamW reads p, g, m, v, writes p, m, v).
References in the same run: a compute-shader copy of the gradient buffer (vec4 loads
and stores) and a read-only pass over it (the norm pass's traffic, the reduction left
out): the bandwidth a kernel here can hope for.

How it is timed: each step's gradients are refilled first by that shader copy (a compute
kernel writes them, as the backward's do), and the step's time is (refill + step) -
refill, both timed in one round; every measurement, ours and torch's, runs `rounds`
times in turn (round-robin, so slow minutes touch all of them) and the best round is
reported (for the step, a difference, the median round: the comparison leans towards torch),
the step's rounds and torch's clip rounds printed beside.
"""
from __future__ import annotations

import json
import statistics
import struct
import time

from bitlora import gpu
from bitlora.ops import adamw as adamw_ops
from bitlora.ops import grad_norm as gn
from bitlora.optim import AdamW, ParamArena

from . import count

REFERENCE_WGSL = """
struct P { n4: u32 };
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn copy4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if (i < p.n4) { dst[i] = src[i]; }
}

// 16 vec4 per invocation, 4 loads in flight; one vec4 per workgroup written (kept live)
@compute @workgroup_size(256)
fn read4(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
         @builtin(num_workgroups) nw: vec3<u32>) {
    let b = (wid.x + wid.y * nw.x) * 4096u + lid.x;
    var a = vec4<f32>(0.0);
    for (var k = 0u; k < 16u; k += 4u) {
        let at = b + k * 256u;
        if (at + 768u < p.n4) {
            a += src[at] + src[at + 256u] + src[at + 512u] + src[at + 768u];
        }
    }
    if (a.x == 12345.0) { dst[wid.x] = a; }
}
"""


def _sizes(params: int, tensors: int) -> list[int]:
    """`tensors` sizes summing to `params`, unequal (like real layers) and mostly odd."""
    base = params // tensors
    sizes = [base + (1 if i % 2 else -1) * (i % 7) * 3 for i in range(tensors)]
    sizes[-1] += params - sum(sizes)
    return sizes


async def _bench_wgsl(params: int, tensors: int, iters: int, backend: str, block4: int | None,
                      per_threads: tuple = (), rounds: int = 3) -> dict:
    import numpy as np

    dev = await gpu.get_device(backend)
    sizes = _sizes(params, tensors)
    arena = ParamArena(dev, [(f"t{i}", (s,)) for i, s in enumerate(sizes)], "bench", block4)
    rng = np.random.default_rng(0)
    host = np.zeros(arena.n, np.float32)
    for s in arena.slots:
        host[s.offset:s.offset + s.size] = rng.standard_normal(s.size, dtype=np.float32)
    dev.write(arena.params, host)
    for s in arena.slots:
        host[s.offset:s.offset + s.size] *= 1e-2
    g_src = dev.buffer(4 * arena.n, "bench.g_src", data=host)
    tokens = 4096
    want_norm = float(np.sqrt(np.dot(host.astype(np.float64), host.astype(np.float64)))) / tokens
    del host
    opt = AdamW(dev, arena, lr=1e-4, weight_decay=1e-2, max_grad_norm=1.0, zero_grads=False)   # as the Trainer
    zeroing = AdamW(dev, arena, lr=1e-4, weight_decay=1e-2, max_grad_norm=1.0)
    await zeroing.prepare()
    copy4 = await dev.compile(REFERENCE_WGSL, "copy4")
    read4 = await dev.compile(REFERENCE_WGSL, "read4")
    g_dst = dev.buffer(4 * arena.n, "bench.g_dst")
    n4 = struct.pack("<I", arena.n // 4)
    out = {"adapter": dev.describe(), "params": params, "tensors": tensors, "arena_floats": arena.n,
           "blocks": arena.nb, "block4": arena.block4}

    async def sync():
        # a tiny read waits for all submitted work (Device.sync's wait_idle fails on wgpu-py 0.32)
        await dev.read(opt.state, 0, 16)

    async def timed(record, n=iters, per_submit=True, lag=1):
        """Seconds per iteration: `record()` n times, one submit each (or one submit)."""
        await sync()
        t = time.perf_counter()
        pending = []
        for _ in range(n):
            res = await record()
            if per_submit:
                dev.submit()
                pending.append(res)
                if len(pending) > lag:  # read results `lag` steps late, as a trainer may
                    await pending.pop(0).get()
        await sync()
        return (time.perf_counter() - t) / n

    async def refill():
        # fresh gradients before every step, written by a compute kernel as the backward's are
        dev.dispatch(copy4, [g_src, arena.grads], groups=-(-arena.n // 1024), params=n4)

    async def refill_and_step():
        await refill()
        return await opt.record_step(tokens)

    async def step():
        return await opt.record_step(tokens)

    async def refill_and_zeroing_step():
        await refill()
        return await zeroing.record_step(tokens)

    async def buffer_copy():
        dev.copy(g_src, g_dst, 4 * arena.n)

    async def shader_read():
        dev.dispatch(read4, [g_src, g_dst], groups=-(-arena.n // 16384), params=n4)

    async def norm_only():
        gn.sumsq_blocks(dev, arena.grads, arena.blocks, arena.partial, arena.nb, 1.0 / tokens, arena.block4)
        gn.sumsq_finish(dev, arena.partial, opt.state, arena.nb, 1.0 / tokens, 1.0)

    async def adamw_only(per_thread=adamw_ops.PER_THREAD, zero=False):
        adamw_ops.adamw_begin(dev, opt.state, opt.lr, opt.betas, plain=True)
        adamw_ops.adamw(dev, arena.params, arena.grads, arena.m, arena.v, opt.state, arena.n, opt.lr,
                        opt.betas, opt.eps, opt.weight_decay, per_thread, zero)

    for _ in range(3):  # warm up: compile, first touch
        await refill_and_step()
        dev.submit()
    for per in per_threads:
        await dev.prepare(adamw_ops.kernel_specs(per, zero_grads=False))
    compiled = dev.pipelines_compiled
    first = await opt.read_state()
    await timed(refill_and_step, per_submit=False)   # and let the GPU's clocks settle
    # (name, record, timed's keywords): measured round-robin, `rounds` times; each figure is the
    # best round, the step's the median over rounds of (refill + step) - refill within a round
    # (a difference: its best round would pick the noise in our favour)
    measures = [("refill", refill, {"per_submit": False}),
                ("refill_step", refill_and_step, {"per_submit": False}),
                ("refill_step_each", refill_and_step, {}),
                ("refill_step_lag2", refill_and_step, {"lag": 2}),
                ("refill_zeroing", refill_and_zeroing_step, {"per_submit": False}),
                ("buffer_copy", buffer_copy, {"per_submit": False}),
                ("shader_read", shader_read, {"per_submit": False}),
                ("step_zero", step, {}),      # gradients zeroed by the previous step: same traffic
                ("norm", norm_only, {"per_submit": False}),
                ("adamw", adamw_only, {"per_submit": False}),
                ("adamw_zero", lambda: adamw_only(zero=True), {"per_submit": False})]
    measures += [(f"adamw_per{per}", lambda per=per: adamw_only(per), {"per_submit": False}) for per in per_threads]
    t = {name: [] for name, _, _ in measures}
    for _ in range(rounds):
        for name, record, kw in measures:
            t[name].append(await timed(record, **kw))
    best = {name: min(v) for name, v in t.items()}

    def minus_refill(name):
        return statistics.median(a - b for a, b in zip(t[name], t["refill"]))

    steps = [a - b for a, b in zip(t["refill_step"], t["refill"])]
    step_s = statistics.median(steps)
    out.update({
        "rounds": rounds, "iters": iters,
        "wgsl_step_ms": step_s * 1e3,
        "wgsl_step_ms_rounds": [round(x * 1e3, 4) for x in steps],
        "wgsl_step_GBps": 32 * params / step_s / 1e9,
        "wgsl_zeroing_step_ms": minus_refill("refill_zeroing") * 1e3,
        "wgsl_adamw_zeroing_ms": best["adamw_zero"] * 1e3,
        "shader_copy_ms": best["refill"] * 1e3,
        "shader_copy_GBps": 8 * arena.n / best["refill"] / 1e9,
        "shader_read_ms": best["shader_read"] * 1e3,
        "shader_read_GBps": 4 * arena.n / best["shader_read"] / 1e9,
        "wgsl_step_one_submit_each_ms": minus_refill("refill_step_each") * 1e3,
        "wgsl_step_one_submit_each_read_2_late_ms": minus_refill("refill_step_lag2") * 1e3,
        "wgsl_step_on_zero_grads_ms": best["step_zero"] * 1e3,
        "wgsl_norm_passes_ms": best["norm"] * 1e3,
        "wgsl_adamw_ms": best["adamw"] * 1e3,
        "wgsl_adamw_ms_by_vec4s_per_thread": {per: best[f"adamw_per{per}"] * 1e3 for per in per_threads},
        "buffer_copy_ms": best["buffer_copy"] * 1e3,
        "copy_GBps": 8 * arena.n / best["buffer_copy"] / 1e9,
        "recompiled_after_warmup": dev.pipelines_compiled - compiled,
        "norm": first["norm"], "norm_rel_err_vs_float64": abs(first["norm"] - want_norm) / want_norm,
    })
    for b in (arena.params, arena.grads, arena.m, arena.v, g_src, g_dst):
        dev.destroy(b)
    return out


def _bench_torch(params: int, tensors: int, iters: int, rounds: int = 3) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {}
    cuda = torch.device("cuda")
    gen = torch.Generator(device=cuda).manual_seed(0)
    ps = [torch.nn.Parameter(torch.randn(s, device=cuda, generator=gen)) for s in _sizes(params, tensors)]
    for p in ps:
        p.grad = torch.randn(p.shape, device=cuda, generator=gen) * 1e-2
    opt = torch.optim.AdamW(ps, lr=1e-4, weight_decay=1e-2, fused=True)

    def timed(fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t) / iters

    # round-robin like ours, each figure the best of `rounds`
    fns = {"clip": lambda: torch.nn.utils.clip_grad_norm_(ps, 1.0), "adamw": opt.step,
           "both": lambda: (torch.nn.utils.clip_grad_norm_(ps, 1.0), opt.step())}
    t = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t[name].append(timed(fn))
    t_clip, t_adamw, t_both = (min(t[name]) for name in fns)
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "torch_clip_ms": t_clip * 1e3,
           "torch_clip_ms_rounds": [round(x * 1e3, 4) for x in t["clip"]],
           "torch_fused_adamw_ms": t_adamw * 1e3, "torch_clip_plus_adamw_ms": t_both * 1e3,
           "torch_clip_plus_adamw_GBps": 36 * params / t_both / 1e9}
    del ps, opt
    torch.cuda.empty_cache()
    return out


def bench_optim(params: int = 1 << 27, tensors: int = 200, iters: int = 50, backend: str = "native",
                compare_torch: bool | None = None, block4: int | None = None, per_threads: tuple = (),
                rounds: int = 3) -> dict:
    """Time the fused optimizer step (and, with CUDA torch present, torch's clip + fused
    AdamW over the same sizes), each figure the best of `rounds` rounds of `iters` steps;
    print a summary and one JSON line; return the figures."""
    if rounds < 1 or iters < 1:
        raise ValueError(f"bench optim: rounds and iters must be at least 1, got {rounds} and {iters}")
    res = {}
    if compare_torch is not False:
        try:
            res.update(_bench_torch(params, tensors, iters, rounds))
        except ImportError:
            if compare_torch:
                raise
    res.update(gpu.run(_bench_wgsl(params, tensors, iters, backend, block4, per_threads, rounds)))
    print(f"optimizer step, {params:,} params in {tensors} tensors on {res['adapter']} "
          f"(each figure the best of {rounds} rounds of {iters} steps; the step: the median round)")
    print(f"  bitlora fused step (norm+clip+scale+AdamW, the Trainer's: gradients not zeroed): "
          f"{res['wgsl_step_ms']:.3f} ms, {res['wgsl_step_GBps']:.0f} GB/s effective (32 B/param), "
          f"{100 * res['wgsl_step_GBps'] / res['shader_copy_GBps']:.0f} % of the shader copy's "
          f"(rounds: {', '.join(f'{x:.3f}' for x in res['wgsl_step_ms_rounds'])} ms)")
    print(f"    zeroing the gradients in AdamW as well (36 B/param): step {res['wgsl_zeroing_step_ms']:.3f} ms, "
          f"AdamW alone {res['wgsl_adamw_zeroing_ms']:.3f} ms")
    print(f"    references, {4 * res['arena_floats'] / 2**20:.0f} MiB: shader copy {res['shader_copy_ms']:.3f} ms "
          f"({res['shader_copy_GBps']:.0f} GB/s read + written), shader read {res['shader_read_ms']:.3f} ms "
          f"({res['shader_read_GBps']:.0f} GB/s), buffer copy {res['buffer_copy_ms']:.3f} ms "
          f"({res['copy_GBps']:.0f} GB/s)")
    print(f"    norm passes {res['wgsl_norm_passes_ms']:.3f} ms, AdamW {res['wgsl_adamw_ms']:.3f} ms, "
          f"one submit per step {res['wgsl_step_one_submit_each_ms']:.3f} ms "
          f"({res['wgsl_step_one_submit_each_read_2_late_ms']:.3f} ms reading 2 steps late)")
    for per, ms in res["wgsl_adamw_ms_by_vec4s_per_thread"].items():
        print(f"    AdamW with {per} vec4 per invocation: {ms:.3f} ms")
    if "torch_clip_ms" in res:
        res["ratio_vs_torch"] = res["wgsl_step_ms"] / (res["torch_clip_ms"] + res["torch_fused_adamw_ms"])
        print(f"  torch {res['torch']} clip_grad_norm_ {res['torch_clip_ms']:.3f} ms "
              f"(rounds: {', '.join(f'{x:.3f}' for x in res['torch_clip_ms_rounds'])}) + AdamW(fused=True) "
              f"{res['torch_fused_adamw_ms']:.3f} ms (together {res['torch_clip_plus_adamw_ms']:.3f} ms)")
        print(f"  ratio bitlora / (torch clip + fused AdamW) = {res['ratio_vs_torch']:.2f} (target <= 0.70)")
    print("BENCH " + json.dumps(res))
    return res


def add_optim_args(parser) -> None:
    """Flags of `bitlora bench optim` (the CLI calls bench_optim with them)."""
    parser.add_argument("--params", type=count, default=1 << 27, help="total parameters (default 2^27)")
    parser.add_argument("--tensors", type=count, default=200, help="how many tensors they are split into")
    parser.add_argument("--iters", type=count, default=50, help="timed steps per measurement and round")
    parser.add_argument("--rounds", type=count, default=3,
                        help="rounds of every measurement, taken in turn; each figure is the best round (default 3)")
    parser.add_argument("--backend", choices=("native",), default="native",
                        help="native (the browser is not benchmarked here)")
    parser.add_argument("--block4", type=count, default=None, help="vec4s per sum-of-squares block (default: auto)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch CUDA comparison")
    parser.add_argument("--adamw-per-thread", default="",
                        help="also time AdamW alone with these vec4s per invocation, e.g. 1,2,4")


def main_optim(args) -> dict:
    return bench_optim(args.params, args.tensors, args.iters, args.backend,
                       compare_torch=False if getattr(args, "no_torch", False) else None,
                       block4=getattr(args, "block4", None), rounds=getattr(args, "rounds", 3),
                       per_threads=tuple(int(x) for x in getattr(args, "adamw_per_thread", "").split(",") if x))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="bitlora optimizer benchmark")
    add_optim_args(ap)
    main_optim(ap.parse_args())
