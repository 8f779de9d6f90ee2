"""LoRA training steps and generation on a BitNet with random weights, timed: the parts
of `bitlora bench train` and `bitlora bench generate` that run on a bitlora device.
Standard library + bitlora only, so the same functions run natively and inside Pyodide
in Chromium (`--backend browser` hands this file to the page's worker, as the portable
tests do).

    res = await case_bench_steps(dev, config, B, T, steps, r, targets, profile=False)
    res = await case_bench_generate(dev, config, prompt, new, r, targets, profile=False)

Random weights: ternary codes from random bytes (code 3, not a weight, becomes 0), norm
weights near 1, a bf16 embedding of magnitude ~0.01 (2B-4T stores it in bf16). Random
token ids; every position but the first of a sequence is a target.
"""
from __future__ import annotations

import array
import collections
import random
import struct
import time

from bitlora.bitnet import EMBED, FINAL_NORM, FULL, LM_HEAD, norm_sizes, projection_shapes
from bitlora.config import TrainConfig
from bitlora.data import MicroBatch
from bitlora.gpu import Programs
from bitlora.formats.tensors import FloatTensor, TernaryTensor
from bitlora.lora import Lora
from bitlora.model import Model
from bitlora.ops.sample import sample_token, sampler_state
from bitlora.optim import AdamW

# byte -> the same byte with every 2-bit code 3 turned into 1 (a zero weight)
_NO_CODE3 = bytes(sum(((1 if (b >> s) & 3 == 3 else (b >> s) & 3) << s) for s in (0, 2, 4, 6)) for b in range(256))
# byte -> a bf16 high byte of magnitude 2^-7..2^-6 with the byte's sign
_BF16_HIGH = bytes(0x3C | (b & 0x80) for b in range(256))


def _randbytes(rnd: random.Random, n: int) -> bytes:
    """n random bytes (in pieces: one randbytes call takes fewer than 2^28)."""
    piece = 1 << 24
    return b"".join(rnd.randbytes(min(piece, n - i)) for i in range(0, n, piece))


def random_loader(config: dict, seed: int):
    """load(name) for Model.create with random weights of `config`'s shapes."""
    rnd = random.Random(seed)
    C, V = config["hidden_size"], config["vocab_size"]
    out_dims = {FULL[m]: s for m, s in projection_shapes(config).items()}
    norm_dims = norm_sizes(config)

    def near_one(n):
        return FloatTensor((n,), "f32", array.array("f", (1 + 0.1 * rnd.gauss(0, 1) for _ in range(n))).tobytes())

    def load(name: str):
        if name in (EMBED, LM_HEAD):
            raw = bytearray(2 * V * C)
            raw[0::2] = _randbytes(rnd, V * C)
            raw[1::2] = _randbytes(rnd, V * C).translate(_BF16_HIGH)
            return FloatTensor((V, C), "bf16", bytes(raw))
        if name == FINAL_NORM:
            return near_one(C)
        module = name.split(".", 3)[3].rsplit(".", 1)[0]      # model.layers.{i}.<module>.weight
        if module in norm_dims:
            return near_one(norm_dims[module])
        O, I = out_dims[module]
        return TernaryTensor((O, I), _randbytes(rnd, 4 * O * -(-I // 16)).translate(_NO_CODE3), 0.01)

    return load


def random_batch(B: int, T: int, V: int, seed: int) -> MicroBatch:
    rnd = random.Random(seed)
    ids = [rnd.randrange(2, V) for _ in range(B * T)]
    mask = ([0] + [1] * (T - 1)) * B
    return MicroBatch(B, T, ids, mask, [T] * B, list(range(B)), sum(mask))


def _profile_name(kernel, params) -> str:
    """A dispatch's line in the profile: its kernel, and for the CPU ternary matmul (one
    kernel for both) which of the two it computes (CpuMatmulParams.divide: the forward)."""
    if kernel.name.endswith("bitlinear_matmul_cpu") and params is not None:
        return kernel.name + (" (forward)" if struct.unpack_from("<I", params, 20)[0] else " (input gradient)")
    return kernel.name


PROFILE_METHODS = {True: "timestamps after each dispatch of the step replayed, median of 5",
                   False: "each dispatch repeated in one submit, less an empty submit's time"}


async def _one_at_a_time(dev, dispatch, calls: list, reps: int) -> list:
    """Seconds per call: each dispatch repeated `reps` times in one submit and waited for
    (recording them not timed), less the time of an empty submit, per call. Launch and
    wait costs stay in: a small kernel's figure is mostly them."""
    idle = await _idle_s(dev, 1)
    out = []
    for call in calls:
        for _ in range(reps):
            dispatch(*call)
        t = time.perf_counter()
        await dev.sync()
        out.append(max(time.perf_counter() - t - idle, 0.0) / reps)
    return out


async def _stamped(dev, dispatch, calls: list, reps: int) -> list:
    """Seconds per call in place: the calls recorded as one program, replayed `reps` times
    with a GPU timestamp after every dispatch (gpu/native.py replay_timed); each call's
    median over the replays."""
    prog = dev.record(lambda: [dispatch(*call) for call in calls])
    runs = [dev.backend.replay_timed(prog.prepared) for _ in range(reps)]
    return [sorted(r)[len(r) // 2] for r in zip(*runs)]


async def _profile(dev, record_step, reps: int = 5) -> tuple:
    """GPU time per kernel over one step: where the backend can stamp times between
    dispatches (natively, with timestamp-query-inside-passes), each dispatch's time in
    place in the whole step replayed (`_stamped`); else each dispatch timed alone
    (`_one_at_a_time`). Returns
    ([name, ms per step, calls] by kernel, [name, groups, ms per step, calls] by kernel
    and grid: the shapes that cost most, the method's line of PROFILE_METHODS)."""
    times, counts = collections.Counter(), collections.Counter()
    by_grid, grid_counts = collections.Counter(), collections.Counter()
    plain = dev.dispatch
    pending = []

    def timed_dispatch(kernel, bindings, groups, params=None):
        pending.append((kernel, bindings, groups, params))

    dev.dispatch = timed_dispatch
    try:
        res = await record_step()
    finally:
        del dev.dispatch
    dev.submit()
    await res[1].get()
    await dev.sync()
    stamped = getattr(dev.backend, "can_time", False)
    secs = await (_stamped if stamped else _one_at_a_time)(dev, plain, pending, reps)
    for (kernel, bindings, groups, params), sec in zip(pending, secs):
        name = _profile_name(kernel, params)
        times[name] += sec
        counts[name] += 1
        key = (name, str(groups))
        by_grid[key] += sec
        grid_counts[key] += 1
    return ([[name, round(sec * 1e3, 3), counts[name]] for name, sec in times.most_common()],
            [[k[0], k[1], round(sec * 1e3, 3), grid_counts[k]] for k, sec in by_grid.most_common(40)],
            PROFILE_METHODS[stamped])


# CPU time of this thread (Pyodide has none: its wall time, in a worker that does nothing else)
_cpu_time = getattr(time, "thread_time", time.perf_counter)


def _host_figures(host: list) -> dict:
    """The host's share per step from (build s, submit s, dispatches, build CPU s) rows:
    medians of the wall times (a shared machine's pauses fall outside them) and the mean
    CPU time of this thread (what building a step costs wherever it runs)."""
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    build, submit = med([h[0] for h in host]), med([h[1] for h in host])
    cpu, n = sum(h[3] for h in host) / len(host), host[-1][2]
    return {"host_s_per_step": build + submit, "host_record_s_per_step": build, "host_submit_s_per_step": submit,
            "host_cpu_s_per_step": cpu, "dispatches_per_step": n, "host_us_per_dispatch": 1e6 * build / n,
            "host_cpu_us_per_dispatch": 1e6 * cpu / n}


async def case_bench_steps(dev, config: dict, B: int, T: int, steps: int, r: int, targets: list,
                           profile: bool = False, checkpointing: bool = False, kind: str | None = None,
                           int8: bool = True, replay: bool = True, record_only: bool = False) -> dict:
    """Time `steps` optimizer steps (forward, loss, backward, clip, AdamW) of micro-batch
    B x T after two warm-up steps: ms/step, trained tokens/s, dispatches per step, the
    host's share (building a step: writing its inputs and recording, or with `replay`
    replaying, its dispatches; then submitting it; not waiting for it) and peak GPU bytes.
    `kind` forces Device.kind's kernel variants ("gpu": a GPU's dispatch list on any
    adapter), `int8` False turns Device.int8_dot off. `record_only`: build each step and
    throw it away unsubmitted (the host's cost alone, e.g. at 2B-4T shapes on a CPU
    adapter that would take minutes to run them)."""
    dev.kind = kind or dev.kind
    dev.int8_dot = dev.int8_dot and int8
    base = dev.reset_peak()
    t = time.perf_counter()
    model = await Model.create(dev, config, random_loader(config, 0), name="random-" + str(config["num_hidden_layers"]))
    await dev.sync()
    out = {"adapter": dev.describe(), "kind": dev.kind, "int8": dev.kind == "gpu" and dev.int8_dot,
           "model_upload_s": time.perf_counter() - t, "model_bytes": dev.allocated - base,
           "replay": replay, "record_only": record_only}
    cfg = TrainConfig(lora_r=r, lora_alpha=2 * r, lora_dropout=0.05, target_modules=targets, micro_batch_size=B,
                      grad_accum=1, cutoff_len=T)
    lora = await Lora.create(model, cfg)
    acts = model.activations(B, T, lora, checkpointing=checkpointing)
    opt = AdamW(dev, lora.arena, lr=1e-4, weight_decay=0.0, max_grad_norm=1.0, zero_grads=False)  # as the Trainer
    await opt.prepare()
    mbs = [random_batch(B, T, config["vocab_size"], s) for s in range(steps + 3)]
    programs = Programs(dev) if replay else None
    host = []

    async def step(i, programs=programs):
        t0, c0 = time.perf_counter(), _cpu_time()
        n0 = dev.dispatches
        dev.clear(acts.top.loss_sum)
        model.train_micro(mbs[i].rows(), acts, lora, mbs[i].targets, step=i, programs=programs, accumulate=False)
        if record_only:
            await opt.record_step(mbs[i].n_targets)
            dev.discard()
            host.append((time.perf_counter() - t0, 0.0, dev.dispatches - n0, _cpu_time() - c0))
            return None
        loss = dev.read_later(acts.top.loss_sum, 0, 4)
        res = await opt.record_step(mbs[i].n_targets)
        t1, c1 = time.perf_counter(), _cpu_time()
        dev.submit()
        host.append((t1 - t0, time.perf_counter() - t1, dev.dispatches - n0, c1 - c0))
        return loss, res

    t = time.perf_counter()
    first = await step(0)
    if not record_only:
        await first[1].get()
    out["first_step_s"] = time.perf_counter() - t
    out["first_step_host_s"] = host[0][0]
    if record_only:
        for i in range(1, steps + 2):
            await step(i)
        out.update(_host_figures(host[2:]), gpu_bytes_peak=dev.peak_allocated - base)
        return out
    await (await step(1))[1].get()
    host.clear()
    t = time.perf_counter()
    pending = []
    for i in range(2, steps + 2):
        pending.append(await step(i))
        if len(pending) > 1:            # read one step late, as the trainer does
            await pending.pop(0)[1].get()
    for _, res in pending:
        await res.get()
    dt = (time.perf_counter() - t) / steps
    tokens = mbs[2].n_targets
    out.update(_host_figures(host))
    out.update({"step_s": dt, "tokens_per_step": tokens, "tokens_per_s": tokens / dt,
                "loss_last": struct.unpack("<f", await pending[-1][0].get())[0] / tokens,
                "gpu_bytes_peak": dev.peak_allocated - base})
    if profile:   # dispatch by dispatch: recorded anew (a replay has no dispatch() calls to time)
        out["profile"], out["profile_by_grid"], out["profile_method"] = await _profile(dev, lambda: step(steps + 2, None))
    return out


def weight_bytes_per_token(model) -> int:
    """Bytes of weights a one-token forward reads: every packed projection, the norms
    and the head's table."""
    proj = sum(p.O * -(-p.I // 16) * 4 for lay in model.layers for p in lay.proj.values())
    norms = 4 * (model.L * (3 * model.C + model.F) + model.C)
    return proj + norms + sum(w.size for _, _, w in model.head)


async def _idle_s(dev, n: int = 5) -> float:
    """The time of an empty submit and wait (subtracted from the timings below)."""
    await dev.sync()
    best = float("inf")
    for _ in range(n):
        t = time.perf_counter()
        await dev.sync()
        best = min(best, time.perf_counter() - t)
    return best


async def _replay_s(dev, prog, idle: float, reps: int = 3) -> float:
    """GPU seconds of a recorded program: encoded, then submitted and waited for (the
    best of `reps`, less an empty submit's time)."""
    best = float("inf")
    for _ in range(reps):
        dev.replay(prog)
        t = time.perf_counter()
        await dev.sync()
        best = min(best, time.perf_counter() - t)
    return max(best - idle, 1e-9)


def _weight_binding(entry: str) -> int:
    """Which binding of a matrix-vector kernel holds its weights: the head's the second, the ternary ones' the third."""
    return 1 if entry.startswith("dense") else 2


def _time_key(name: str, bindings, groups) -> tuple:
    """A dispatch's line in _kernel_times: its kernel, and for the ternary matrix-vector kernels
    its grid and weights too (a layer's q,k,v, o, gate,up and down: each its own line)."""
    entry = name.split(":")[1]
    if "matvec" not in entry or entry.startswith("dense"):
        return name, 0
    n = groups if isinstance(groups, int) else groups[0] * (groups[1] if len(groups) > 1 else 1)
    return f"{name} ({n} workgroups)", bindings[_weight_binding(entry)].size


async def _kernel_times(dev, record, min_calls: int = 240) -> tuple:
    """GPU time per kernel of what `record()` records (the cache's kv_advance left out:
    repeated, it would move the positions). Where the backend stamps times between
    dispatches, every dispatch in place in the program replayed (`_stamped`: the sum is
    the program's time); else every dispatch of one kernel (e.g. the 30 layers' q,k,v
    matrix-vector products: distinct weights, so no cache serves a repeat) recorded in
    order, again and again up to `min_calls`, into a program that is replayed and waited
    for, less an empty submit's time. Returns ([name, ms per call, calls in the step,
    bytes of the weights it reads per step (matrix-vector kernels), GB/s], by cost; the
    method's line of PROFILE_METHODS)."""
    plain, calls = dev.dispatch, []
    dev.dispatch = lambda kernel, bindings, groups, params=None: calls.append((kernel, bindings, groups, params))
    try:
        record()
    finally:
        del dev.dispatch
    dev.discard()
    calls = [c for c in calls if c[0].name.split(":")[1].split(" ")[0] != "kv_advance"]
    seen, secs = collections.defaultdict(list), collections.Counter()
    for c in calls:
        seen[_time_key(c[0].name, c[1], c[2])].append(c)
    stamped = getattr(dev.backend, "can_time", False)
    if stamped:
        for c, sec in zip(calls, await _stamped(dev, plain, calls, 5)):
            secs[_time_key(c[0].name, c[1], c[2])] += sec
    else:
        idle = await _idle_s(dev)
        for key, group in seen.items():
            reps = -(-min_calls // len(group))
            prog = dev.record(lambda: [plain(*c) for _ in range(reps) for c in group])
            await _replay_s(dev, prog, idle, 1)   # warm-up
            secs[key] = await _replay_s(dev, prog, idle) / reps
    out = []
    for key, group in seen.items():
        name, entry, sec = key[0], key[0].split(":")[1].split(" ")[0], secs[key]
        nbytes = sum(c[1][_weight_binding(entry)].size for c in group) if "matvec" in entry else 0
        out.append([name, round(sec / len(group) * 1e3, 4), len(group), nbytes,
                    round(nbytes / sec / 1e9, 1) if nbytes else None])
    method = PROFILE_METHODS[True] if stamped else "a kernel's dispatches of the step repeated in one submit, less an empty submit's time"
    return sorted(out, key=lambda r: -r[1] * r[2]), method


async def _copy_gb_per_s(dev, nbytes: int, reps: int = 8) -> float:
    """Copy bandwidth, the reference for the kernels' GB/s: bytes read plus written per
    second by `reps` buffer-to-buffer copies of nbytes in one submit."""
    a, b = dev.buffer(nbytes, "copy_src"), dev.buffer(nbytes, "copy_dst")
    try:
        prog = dev.record(lambda: [dev.copy(a, b) if i % 2 == 0 else dev.copy(b, a) for i in range(reps)])
        idle = await _idle_s(dev)
        await _replay_s(dev, prog, idle, 1)
        return 2 * nbytes * reps / await _replay_s(dev, prog, idle) / 1e9
    finally:
        dev.destroy(a, b)


COPY_WGSL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<u32>>;
@compute @workgroup_size(256)
fn copy4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = gid.x + gid.y * nw.x * 256u;
    if (i < arrayLength(&dst)) { dst[i] = src[i]; }
}
"""


async def _copy_kernel_gb_per_s(dev, nbytes: int, reps: int = 8) -> float:
    """The same as _copy_gb_per_s through a compute kernel (16-byte loads and stores)."""
    a, b = dev.buffer(nbytes, "copy_src"), dev.buffer(nbytes, "copy_dst")
    try:
        k = await dev.compile(COPY_WGSL, "copy4")
        prog = dev.record(lambda: [dev.dispatch(k, [a, b] if i % 2 == 0 else [b, a], -(-nbytes // 16 // 256))
                                   for i in range(reps)])
        idle = await _idle_s(dev)
        await _replay_s(dev, prog, idle, 1)
        return 2 * nbytes * reps / await _replay_s(dev, prog, idle) / 1e9
    finally:
        dev.destroy(a, b)


async def _decode_gpu_ms(model, ids, lora=None, steps: int = 64) -> tuple:
    """(host ms, GPU ms) per token of `steps` decoding steps replayed into one submit
    after the prompt: the host's encoding, then the GPU's run (submit to finish)."""
    dev = model.dev
    cache = model.kv_cache(1, len(ids) + steps + 1)
    g = model._sampler(steps + 1)
    dev.write(g.state, sampler_state())
    sample_token(dev, model.forward(ids, lora=lora, cache=cache, logits="last"), g.state, g.tok, g.out, model.V)
    model._decode_step(cache, lora, g)    # recorded here if new
    idle = await _idle_s(dev)
    t = time.perf_counter()
    for _ in range(steps):
        model._decode_step(cache, lora, g)
    t1 = time.perf_counter()
    await dev.sync()
    t2 = time.perf_counter()
    return 1e3 * (t1 - t) / steps, 1e3 * max(t2 - t1 - idle, 0.0) / steps


async def case_bench_generate(dev, config: dict, prompt: int, new: int, r: int = 8, targets=("q_proj", "v_proj"),
                              reps: int = 3, profile: bool = False, model=None) -> dict:
    """Greedy generation of `new` tokens after a random `prompt`-token prompt, batch 1, KV
    cache, no EOS: the prompt's tokens/s (its forward and the first token), decoding
    tokens/s and ms per token after the first, dispatches and host ms per decoding token,
    the weights' GB/s; the same with a LoRA adapter (r on `targets`). Best of `reps`."""
    from bitlora.model import Model
    base = dev.reset_peak()
    t = time.perf_counter()
    if model is None:
        model = await Model.create(dev, config, random_loader(config, 0), name="random")
    await dev.sync()
    out = {"adapter": dev.describe(), "kind": dev.kind, "model_upload_s": time.perf_counter() - t,
           "weight_bytes_per_token": weight_bytes_per_token(model)}
    rnd = random.Random(1)
    ids = [rnd.randrange(2, model.V) for _ in range(prompt)]
    cfg = TrainConfig(lora_r=r, lora_alpha=2 * r, target_modules=list(targets))
    lora = await Lora.create(model, cfg)
    kinds = (("", None), ("lora_", lora))
    for _, ad in kinds:   # warm-up: pipelines, scratch, the cache at its timed size (a bigger one later would
        await model.agenerate(ids, new, lora=ad, eos=())      # drop the recordings), the prompt seen, then
        await model.agenerate(ids, 1, lora=ad, eos=())        # recorded: every timed prompt is a replay
    firsts, runs = {name: [] for name, _ in kinds}, {name: [] for name, _ in kinds}
    for _ in range(reps):                                        # base and adapted in turn: the same conditions
        for name, ad in kinds:
            firsts[name].append(await model.agenerate(ids, 1, lora=ad, eos=()))
            runs[name].append(await model.agenerate(ids, new, lora=ad, eos=()))
    for name, _ in kinds:
        first = min(firsts[name], key=lambda g: g.total_s)
        g = min(runs[name], key=lambda g: g.total_s - g.first_token_s)
        steps = len(g.ids) - 1
        dt = g.total_s - g.first_token_s
        out.update({name + "prefill_s": first.total_s, name + "prefill_tokens_per_s": prompt / first.total_s,
                    name + "decode_tokens_per_s": steps / dt, name + "ms_per_token": 1e3 * dt / steps,
                    name + "dispatches_per_token": (g.dispatches - first.dispatches) / steps,
                    name + "host_ms_per_token": 1e3 * (g.host_s - first.host_s) / steps,
                    name + "prefill_host_ms": 1e3 * first.host_s,
                    name + "weight_gb_per_s": out["weight_bytes_per_token"] * steps / dt / 1e9,
                    name + "ids": g.ids[:16]})
    for k, (name, ad) in enumerate(kinds):   # a prompt length not seen before: run plainly
        firsts_new = []                        # (replayed from its third time on)
        for j in range(reps):
            part = ids[:max(1, prompt - 1 - k * reps - j)]
            firsts_new.append(len(part) / (await model.agenerate(part, 1, lora=ad, eos=())).total_s)
        out[name + "prefill_first_tokens_per_s"] = max(firsts_new)
    out["lora_vs_base"] = out["lora_decode_tokens_per_s"] / out["decode_tokens_per_s"]
    out["gpu_bytes_peak"] = dev.peak_allocated - base
    if profile:
        for name, ad in kinds:   # the decoding step's own GPU time: 64 steps in one submit
            out[name + "replay_host_ms"], out[name + "gpu_ms_per_token"] = await _decode_gpu_ms(model, ids, ad)
        nbytes = min((256 if dev.kind == "gpu" else 16) << 20, int(dev.limits.get("maxStorageBufferBindingSize", 1 << 27)))
        out["copy_gb_per_s"] = await _copy_gb_per_s(dev, nbytes)
        out["copy_kernel_gb_per_s"] = await _copy_kernel_gb_per_s(dev, nbytes)
        cache = model.kv_cache(1, prompt + 2)
        g = model._sampler(2)
        prefill = lambda: sample_token(dev, model.forward(ids, cache=cache, logits="last"),  # noqa: E731
                                       g.state, g.tok, g.out, model.V)
        out["profile_prefill"], out["profile_method"] = await _kernel_times(dev, prefill, min_calls=8)
        cache = model.kv_cache(1, prompt + 2)
        prefill()
        await dev.sync()
        for name, ad in kinds:
            step = lambda: sample_token(dev, model.forward(g.tok, cache=cache, lora=ad, logits="last"),  # noqa: E731
                                        g.state, g.tok, g.out, model.V)
            out[name + "profile"], out["profile_method"] = await _kernel_times(dev, step)
    return out
