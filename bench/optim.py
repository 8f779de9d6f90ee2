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
"""
from __future__ import annotations

import asyncio
import json
import struct
import time

from bitlora import gpu
from bitlora.ops import adamw as adamw_ops
from bitlora.ops import grad_norm as gn
from bitlora.optim import AdamW, ParamArena


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
                      per_threads: tuple = ()) -> dict:
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

    async def copy_grads():
        dev.copy(g_src, arena.grads, 4 * arena.n)

    async def copy_and_step():
        await copy_grads()
        return await opt.record_step(tokens)

    async def step():
        return await opt.record_step(tokens)

    async def copy_and_zeroing_step():
        await copy_grads()
        return await zeroing.record_step(tokens)

    async def shader_copy():
        dev.dispatch(copy4, [g_src, g_dst], groups=-(-arena.n // 1024), params=n4)

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
        await copy_and_step()
        dev.submit()
    compiled = dev.pipelines_compiled
    first = await opt.read_state()
    t_copy = await timed(copy_grads, per_submit=False)
    t_copy_step = await timed(copy_and_step)
    t_copy_step_batched = await timed(copy_and_step, per_submit=False)
    t_copy_step_lag2 = await timed(copy_and_step, lag=2)
    t_copy_zeroing = await timed(copy_and_zeroing_step, per_submit=False)
    t_shader_copy = await timed(shader_copy, per_submit=False)
    t_shader_read = await timed(shader_read, per_submit=False)
    t_step_zero = await timed(step)      # gradients zeroed by the previous step: same traffic
    t_norm = await timed(norm_only, per_submit=False)
    t_adamw = await timed(adamw_only, per_submit=False)
    t_adamw_zero = await timed(lambda: adamw_only(zero=True), per_submit=False)
    t_adamw_per = {}
    for per in per_threads:  # the same kernel with `per` vec4s per invocation, for choosing PER_THREAD
        await dev.prepare(adamw_ops.kernel_specs(per))
        t_adamw_per[per] = await timed(lambda: adamw_only(per), per_submit=False) * 1e3
    step_s = t_copy_step_batched - t_copy
    out.update({
        "wgsl_step_ms": step_s * 1e3,
        "wgsl_step_GBps": 32 * params / step_s / 1e9,
        "wgsl_zeroing_step_ms": (t_copy_zeroing - t_copy) * 1e3,
        "wgsl_adamw_zeroing_ms": t_adamw_zero * 1e3,
        "shader_copy_ms": t_shader_copy * 1e3,
        "shader_copy_GBps": 8 * arena.n / t_shader_copy / 1e9,
        "shader_read_ms": t_shader_read * 1e3,
        "shader_read_GBps": 4 * arena.n / t_shader_read / 1e9,
        "wgsl_step_one_submit_each_ms": (t_copy_step - t_copy) * 1e3,
        "wgsl_step_one_submit_each_read_2_late_ms": (t_copy_step_lag2 - t_copy) * 1e3,
        "wgsl_step_on_zero_grads_ms": t_step_zero * 1e3,
        "wgsl_norm_passes_ms": t_norm * 1e3,
        "wgsl_adamw_ms": t_adamw * 1e3,
        "wgsl_adamw_ms_by_vec4s_per_thread": t_adamw_per,
        "wgsl_grad_copy_ms": t_copy * 1e3,
        "copy_GBps": 8 * arena.n / t_copy / 1e9,
        "recompiled_after_warmup": dev.pipelines_compiled - compiled,
        "norm": first["norm"], "norm_rel_err_vs_float64": abs(first["norm"] - want_norm) / want_norm,
    })
    for b in (arena.params, arena.grads, arena.m, arena.v, g_src, g_dst):
        dev.destroy(b)
    return out


def _bench_torch(params: int, tensors: int, iters: int) -> dict:
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

    t_clip = timed(lambda: torch.nn.utils.clip_grad_norm_(ps, 1.0))
    t_adamw = timed(opt.step)
    t_both = timed(lambda: (torch.nn.utils.clip_grad_norm_(ps, 1.0), opt.step()))
    out = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "torch_clip_ms": t_clip * 1e3,
           "torch_fused_adamw_ms": t_adamw * 1e3, "torch_clip_plus_adamw_ms": t_both * 1e3,
           "torch_clip_plus_adamw_GBps": 36 * params / t_both / 1e9}
    del ps, opt
    torch.cuda.empty_cache()
    return out


def bench_optim(params: int = 1 << 27, tensors: int = 200, iters: int = 50, backend: str = "native",
                compare_torch: bool | None = None, block4: int | None = None, per_threads: tuple = ()) -> dict:
    """Time the fused optimizer step (and, with CUDA torch present, torch's clip + fused
    AdamW over the same sizes); print a summary and one JSON line; return the figures."""
    res = {}
    if compare_torch is not False:
        try:
            res.update(_bench_torch(params, tensors, iters))
        except ImportError:
            if compare_torch:
                raise
    res.update(asyncio.run(_bench_wgsl(params, tensors, iters, backend, block4, per_threads)))
    print(f"optimizer step, {params:,} params in {tensors} tensors on {res['adapter']}")
    print(f"  bitlora fused step (norm+clip+scale+AdamW, the Trainer's: gradients not zeroed): "
          f"{res['wgsl_step_ms']:.3f} ms, {res['wgsl_step_GBps']:.0f} GB/s effective (32 B/param), "
          f"{100 * res['wgsl_step_GBps'] / res['shader_copy_GBps']:.0f} % of the shader copy's")
    print(f"    zeroing the gradients in AdamW as well (36 B/param): step {res['wgsl_zeroing_step_ms']:.3f} ms, "
          f"AdamW alone {res['wgsl_adamw_zeroing_ms']:.3f} ms")
    print(f"    references, {4 * res['arena_floats'] / 2**20:.0f} MiB: shader copy {res['shader_copy_ms']:.3f} ms "
          f"({res['shader_copy_GBps']:.0f} GB/s read + written), shader read {res['shader_read_ms']:.3f} ms "
          f"({res['shader_read_GBps']:.0f} GB/s), buffer copy {res['wgsl_grad_copy_ms']:.3f} ms "
          f"({res['copy_GBps']:.0f} GB/s)")
    print(f"    norm passes {res['wgsl_norm_passes_ms']:.3f} ms, AdamW {res['wgsl_adamw_ms']:.3f} ms, "
          f"one submit per step {res['wgsl_step_one_submit_each_ms']:.3f} ms "
          f"({res['wgsl_step_one_submit_each_read_2_late_ms']:.3f} ms reading 2 steps late)")
    for per, ms in res["wgsl_adamw_ms_by_vec4s_per_thread"].items():
        print(f"    AdamW with {per} vec4 per invocation: {ms:.3f} ms")
    if "torch_clip_ms" in res:
        res["ratio_vs_torch"] = res["wgsl_step_ms"] / (res["torch_clip_ms"] + res["torch_fused_adamw_ms"])
        print(f"  torch {res['torch']} clip_grad_norm_ {res['torch_clip_ms']:.3f} ms + AdamW(fused=True) "
              f"{res['torch_fused_adamw_ms']:.3f} ms (together {res['torch_clip_plus_adamw_ms']:.3f} ms)")
        print(f"  ratio bitlora / (torch clip + fused AdamW) = {res['ratio_vs_torch']:.2f} (target <= 0.70)")
    print("BENCH " + json.dumps(res))
    return res


def add_optim_args(parser) -> None:
    """Flags of `bitlora bench optim` (the CLI calls bench_optim with them)."""
    parser.add_argument("--params", type=int, default=1 << 27, help="total parameters (default 2^27)")
    parser.add_argument("--tensors", type=int, default=200, help="how many tensors they are split into")
    parser.add_argument("--iters", type=int, default=50, help="timed steps per measurement")
    parser.add_argument("--backend", default="native", help="native (the browser is not benchmarked here)")
    parser.add_argument("--block4", type=int, default=None, help="vec4s per sum-of-squares block (default: auto)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch CUDA comparison")
    parser.add_argument("--adamw-per-thread", default="",
                        help="also time AdamW alone with these vec4s per invocation, e.g. 1,2,4")


def main_optim(args) -> dict:
    return bench_optim(args.params, args.tensors, args.iters, args.backend,
                       compare_torch=False if getattr(args, "no_torch", False) else None,
                       block4=getattr(args, "block4", None),
                       per_threads=tuple(int(x) for x in getattr(args, "adamw_per_thread", "").split(",") if x))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="bitlora optimizer benchmark")
    add_optim_args(ap)
    main_optim(ap.parse_args())
