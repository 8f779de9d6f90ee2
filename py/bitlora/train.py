"""The training loop: Alpaca steps -> GPU forward/backward -> clip + AdamW -> metrics.

    trainer = Trainer(model, "alpaca.json", TrainConfig(max_steps=50))
    trainer.train()            # natively; `await trainer.train()` under Pyodide / Jupyter
    await trainer.setup()      # adapter, optimizer, --resume state (train() does it too)
    await trainer.atrain(until_step=10)   # train up to optimizer step 10, or the end / stop()
    trainer.metrics            # [{"step", "loss", "grad_norm", "lr", "tokens", "tokens_per_s", ...}]
    trainer.generate({"instruction": "..."})   # with the adapter (model.generate: without)
    trainer.save_adapter("out")

This is also the notebook API's `bitlora.Trainer`.

One optimizer step (step semantics pinned by the issue): every micro-batch of the
step runs forward and backward on the GPU (recorded once per micro-batch shape, then
replayed: `Model.train_micro` with the trainer's `gpu.Programs`), adding raw (unnormalised) cross-entropy
gradient sums into the arena's gradients (the first micro-batch writes them, so AdamW
need not zero them: AdamW(zero_grads=False)) and the summed loss into a GPU scalar;
then `AdamW.step(n_targets)` divides by the step's target-token count, clips the
mean gradient by global norm and updates — one submit. The loss and the pre-clip
norm are read back a step late, so the GPU never waits for Python.

Checkpoints (every `save_every` steps): the LoRA tensors, AdamW moments, step and
data cursor (formats/state.py); `on_checkpoint(step)` runs after each is written.
The page also saves after a run's first step (`save_first`: a reload then loses at
most the steps since) and once `save_interval_s` has passed since the last save
(at least 20 x what the last save took, so saving costs under ~5 % of the time).
Dropout masks are a pure function of
(seed, step, micro-batch), so a resumed run needs no other RNG state and repeats
the uninterrupted run's losses exactly.

Standard library only: this module runs in the browser.
"""
from __future__ import annotations

import asyncio
import inspect
import os
import struct
import time

from . import gpu
from .formats import peft as adapter_io
from .formats import state as checkpoint_state
from .config import TrainConfig
from .fit import as_flags, changes, fit_settings, smallest
from .data import Dataset, check_record, format_prompt, load_records
from .lora import Lora
from .optim import AdamW
from .schedule import lr_at

CHECKPOINT_DIR = "checkpoint"


class Control:
    """Pause / resume / stop, checked between optimizer steps."""

    def __init__(self):
        self.stopped = False
        self._running = asyncio.Event()
        self._running.set()

    def pause(self):
        self._running.clear()

    def resume(self):
        self._running.set()

    def stop(self):
        self.stopped = True
        self._running.set()

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    async def wait(self):
        await self._running.wait()


def _config(config, overrides) -> TrainConfig:
    if config is None:
        config = TrainConfig()
    elif isinstance(config, dict):
        config = TrainConfig.from_dict(config)
    if overrides:
        config = TrainConfig.from_dict({**config.to_dict(), **overrides})
    return config


def _url_records(url: str) -> list:
    """Records from an Alpaca JSON / JSONL http(s) URL. Trainer() is synchronous, so
    under Pyodide this is a synchronous request (allowed in a worker, where kernels run)."""
    if gpu.IN_BROWSER:
        from pyodide.http import open_url
        raw = open_url(url).getvalue().encode("utf-8")
    else:
        from .formats.source import url_bytes
        raw = url_bytes(url)      # resumes a dropped connection; refuses an HTML page
    return load_records(raw, name=url.split("?")[0])


class Trainer:
    """LoRA finetuning of a loaded bitlora model on Alpaca-format data.

    model: a `bitlora.model.Model`; data: a path, an http(s) URL, JSON text, bytes, a
    list of records, a `Dataset` or "demo" (the built-in dataset); config: a
    TrainConfig or dict (keyword overrides win)."""

    def __init__(self, model, data="demo", config=None, **overrides):
        self.model = model
        self.config = cfg = _config(config, overrides)
        max_pos = int(model.config.get("max_position_embeddings", cfg.cutoff_len))
        self.cutoff_len = min(cfg.cutoff_len, max_pos)   # a sequence must fit the model's context
        if isinstance(data, str) and data.startswith(("http://", "https://")):
            data = _url_records(data)
        if isinstance(data, Dataset):
            self.dataset = data
        elif model.tokenizer is None:
            raise ValueError(f"{model.name}: the model has no tokenizer (tokenizer.json, or the GGUF's tokenizer "
                             "metadata): training needs one to read the data")
        else:
            records = load_records(data) if not isinstance(data, list) else data
            self.dataset = Dataset(records, model.tokenizer, self.cutoff_len, cfg.train_on_inputs, model.V)
        self.total_steps = self.dataset.total_steps(cfg.micro_batch_size, cfg.grad_accum, cfg.epochs,
                                                    cfg.max_steps)
        self.metrics: list[dict] = []
        self.control = Control()
        self.step = 0                     # optimizer steps taken
        self.cursor = None                # where the next step's data starts
        self.lora = None                  # lora.Lora: the adapter being trained
        self.acts = None                  # its training activations (model.activations)
        self.opt = None
        self.programs = None              # gpu.Programs: each micro-batch shape's recorded dispatches
        self.replay = True                # replay them (False: record every step anew; same results)
        self.on_step = None               # callback(metrics_row) after each step lands
        self.on_checkpoint = None         # callback(step) after a checkpoint is written; awaited if async
        self.on_micro = None              # callback(dict) as each micro-batch finishes on the GPU (awaited if
                                          #   async); set, it makes a step one submit per micro-batch
                                          #   (progress, and stop() takes effect at the next micro-batch boundary)
        self.keep_adapter = False         # read the adapter back with each step's loss (adapter_snapshot)
        self.adapter_snapshot = None      # (step, raw f32 bytes of the arena's params) after that step
        self.checkpoint_dir = None        # where save_every writes (default OUT/checkpoint)
        self.save_first = False           # also save after the first step when no checkpoint exists yet
        self.save_interval_s = None       # also save once this long has passed since the last save (or the
                                          #   start), and at least 20 x the last save's duration
        self.save_s = 0.0                 # how long the last save_checkpoint took (GPU reads, file, hook)
        self._saved_step = None           # step of the last checkpoint written or resumed from
        self._saved_at = None             # time.monotonic() of it (or of this atrain's start)
        self._step_times: list[float] = []   # recent step durations, for the ETA
        self._buffers: list = []          # the GPU buffers setup() made (close() frees them)
        self.resume_changes: list = []    # settings this run changed from its --resume checkpoint's

    # -- set-up ----------------------------------------------------------------
    async def setup(self) -> None:
        """Create the adapter (from --init-adapter if given) and the optimizer, and load
        the --resume checkpoint. Runs once; training, generation and saving call it."""
        if self.lora is not None:
            return
        cfg = self.config
        init = state = None
        if cfg.init_adapter:
            conf, init = adapter_io.load_adapter(cfg.init_adapter)
            settings = adapter_io.adapter_settings(conf, init)
            cfg.lora_r, cfg.lora_alpha = settings["lora_r"], settings["lora_alpha"]
            cfg.target_modules = settings["target_modules"]
        if cfg.resume:   # its settings checked before any GPU buffer is made
            state = checkpoint_state.load_state(cfg.resume)
            self.resume_changes = resume_changes(state.config, cfg, cfg.resume)
        dev, bufs = self.model.dev, []
        try:
            with dev.collect(bufs):
                lora = await Lora.create(self.model, cfg, init=init)
                acts = self.model.activations(self.rows(cfg), min(self.dataset.max_len(), self.cutoff_len),
                                              lora, cfg.grad_accum, cfg.gradient_checkpointing)
                opt = AdamW(dev, lora.arena, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_eps,
                            weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm, zero_grads=False)
        except gpu.OutOfMemory as e:
            failed_at = dev.allocated
            for b in bufs:                      # give back what this set-up got; the model stays usable
                dev.destroy(b)
            raise gpu.OutOfMemory(self.out_of_memory_text(e, failed_at), e.label, e.size) from None
        self.lora, self.acts, self.opt, self._buffers = lora, acts, opt, bufs
        self.programs = gpu.Programs(dev)
        if cfg.resume:
            await self.load_checkpoint(cfg.resume, state)

    def memory_estimate(self, cfg=None) -> dict:
        """GPU bytes this run (or one with TrainConfig `cfg`) allocates: Model.memory_estimate
        at the data's longest example."""
        cfg = cfg or self.config
        return self.model.memory_estimate(cfg, seq_len=min(self.dataset.max_len(), cfg.cutoff_len, self.cutoff_len),
                                          rows=self.rows(cfg))

    def rows(self, cfg=None) -> int:
        """Sequences a micro-batch of this run holds at most: micro_batch_size, or fewer
        where the data has fewer examples (their activations are all that is allocated)."""
        return min((cfg or self.config).micro_batch_size, len(self.dataset))

    def out_of_memory_text(self, e, failed_at: int) -> str:
        """What did not fit, what the run needs and settings that would fit: the budget is
        the device's memory_limit, else what was allocated when the allocation failed
        (known to fit). The model's weights and other runs' buffers stay; the rest must fit."""
        dev, cfg = self.model.dev, self.config
        others = dev.allocated - sum(b.size for b in self._buffers) - (dev.splitk_scratch.size if dev.splitk_scratch else 0)
        free = (dev.memory_limit or failed_at) - others
        need = lambda c: self.memory_estimate(c)["total"] - self.model.weight_bytes  # noqa: E731
        mb = lambda n: f"{n / 2**20:.1f} MiB"  # noqa: E731
        floor = self.dataset.shortest_cutoff()
        if cfg.resume:
            advice = self._resumed_fit_text(cfg, need, free, floor)
        else:
            fit = fit_settings(cfg, lambda c: need(c) <= free, floor)
            if fit is not None:
                advice = f"Settings that fit: {as_flags(changes(cfg, fit))} (needs {mb(need(fit))})."
            else:
                least = smallest(cfg, floor)
                advice = (f"Nothing fits: even micro_batch_size=1, cutoff_len={least.cutoff_len} (the shortest that "
                          f"keeps every prompt), gradient checkpointing and LoRA rank {least.lora_r} on "
                          f"{','.join(least.target_modules)} need {mb(need(least))}: free GPU memory or use a "
                          "smaller model.")
        room = (f"about {mb(max(free, 0))} are free" if dev.memory_limit else
                f"about {mb(max(free, 0))} were in use when an allocation failed")
        return f"Out of GPU memory: {e}. This run needs {mb(need(cfg))} besides the model's weights and {room}. {advice}"

    @staticmethod
    def _resumed_fit_text(cfg, need, free: int, floor: int) -> str:
        """out_of_memory_text's advice for a resumed run: it keeps its checkpoint's batching,
        cutoff and adapter (resume_changes), so only gradient checkpointing may change."""
        light = TrainConfig.from_dict({**cfg.to_dict(), "gradient_checkpointing": True})
        if not cfg.gradient_checkpointing and need(light) <= free:
            return f"Settings that fit: gradient_checkpointing=True (needs {need(light) / 2**20:.1f} MiB)."
        fresh = fit_settings(cfg, lambda c: need(c) <= free, floor)
        return ("A resumed run keeps its checkpoint's batching, cutoff and adapter, and even with gradient "
                "checkpointing they do not fit: free GPU memory, or start a new run without --resume"
                + (f" ({as_flags(changes(cfg, fresh))} would fit)." if fresh is not None else "."))

    def close(self) -> None:
        """Free the GPU buffers of the adapter, activations and optimizer (the model
        stays); the trainer cannot train or generate afterwards."""
        if self.programs is not None:
            self.programs.clear()     # they bind the buffers below
        self.model.dev.destroy(*self._buffers)
        self._buffers, self.lora, self.acts, self.opt, self.programs = [], None, None, None, None

    # -- the loop --------------------------------------------------------------
    async def atrain(self, until_step: int | None = None) -> list:
        """Train until optimizer step `until_step` has been taken (None: the configured
        end), or stop(); returns the metrics. Called again, it goes on from there. Out of
        GPU memory, it stops with gpu.OutOfMemory saying which settings would fit; the
        last checkpoint is left as it was."""
        await self.setup()
        try:
            return await self._atrain(until_step)
        except gpu.OutOfMemory as e:
            raise gpu.OutOfMemory(self.out_of_memory_text(e, self.model.dev.allocated), e.label, e.size) from None

    async def _atrain(self, until_step: int | None) -> list:
        cfg, ds, dev = self.config, self.dataset, self.model.dev
        pending = None
        if self._saved_at is None:
            self._saved_at = time.monotonic()
        for step in ds.steps(cfg.micro_batch_size, cfg.grad_accum, cfg.epochs, seed=cfg.seed,
                             shuffle=cfg.shuffle, max_steps=cfg.max_steps, cursor=self.cursor):
            if self.control.paused:
                if pending is not None:
                    self._land(await self._finish(pending))
                    pending = None
                await self.control.wait()
            if self.control.stopped or (until_step is not None and self.step >= until_step):
                break
            t0 = time.perf_counter()
            lr = lr_at(cfg, step.index, self.total_steps)
            self.opt.lr = lr
            loss_sum = self.acts.top.loss_sum
            dev.clear(loss_sum)
            if not await self._micro_batches(step, t0):
                dev.clear(self.lora.arena.grads)      # stopped inside the step: its gradients go
                dev.submit()
                break
            loss_rb = dev.read_later(loss_sum, 0, 4)
            res = await self.opt.record_step(step.n_targets)
            snap = dev.read_later(self.lora.arena.params) if self.keep_adapter else None
            dev.submit()
            if pending is not None:
                self._land(await self._finish(pending), t0)
            pending = (step, lr, loss_rb, res, t0, snap)
            self.step, self.cursor = step.index + 1, step.cursor
            if self.on_micro is not None:   # already waited for each micro-batch: show the step now
                self._land(await self._finish(pending))
                pending = None
            if self._save_due():
                if pending is not None:
                    self._land(await self._finish(pending))
                    pending = None
                await self.save_checkpoint()
        if pending is not None:
            self._land(await self._finish(pending))
        return self.metrics

    def _save_due(self) -> bool:
        """Whether the step just taken ends with a checkpoint: every save_every steps; after
        the first step while none exists (save_first); once save_interval_s has passed."""
        every = self.config.save_every
        if every and self.step % every == 0:
            return True
        if self.save_first and self._saved_step is None:
            return True
        return self.save_interval_s is not None and \
            time.monotonic() - self._saved_at >= max(self.save_interval_s, 20 * self.save_s)

    async def _micro_batches(self, step, t0: float) -> bool:
        """Record forward + backward of each micro-batch of `step`. With on_micro set,
        submit each and wait for it, report it, and return False if stop() came."""
        n, done = len(step.micro_batches), 0
        tokens = sum(len(mb.ids) for mb in step.micro_batches)     # padded positions, B*T per micro-batch
        for j, mb in enumerate(step.micro_batches):
            if self.on_micro is not None:
                await self._report_micro({"step": step.index + 1, "micro": j, "micros": n, "tokens": done,
                                          "step_tokens": tokens, "elapsed_s": time.perf_counter() - t0})
                if self.control.stopped:       # stop() came while an async on_micro was awaited
                    return False
            self.model.train_micro(mb.rows(), self.acts, self.lora, mb.targets, micro=j, step=step.index,
                                   programs=self.programs if self.replay else None, accumulate=j > 0)
            done += len(mb.ids)
            if self.on_micro is not None:
                await self.model.dev.sync()
                if self.control.stopped:
                    return False
        if self.on_micro is not None:
            await self._report_micro({"step": step.index + 1, "micro": n, "micros": n, "tokens": done,
                                      "step_tokens": tokens, "elapsed_s": time.perf_counter() - t0})
        return True

    async def _report_micro(self, info: dict) -> None:
        res = self.on_micro(info)
        if inspect.isawaitable(res):
            await res

    async def _finish(self, pending) -> dict:
        step, lr, loss_rb, res, t0, snap = pending
        loss_sum = struct.unpack("<f", await loss_rb.get())[0]
        info = await res.get()
        if snap is not None:
            self.adapter_snapshot = (step.index + 1, await snap.get())
        return {"step": step.index + 1, "loss": loss_sum / step.n_targets, "grad_norm": info["norm"],
                "lr": lr, "tokens": step.n_targets, "epoch": step.epoch,
                "clip": info["clip"], "skipped": info["skipped"], "skipped_step": info["skipped_step"],
                "gpu_bytes": self.model.dev.peak_allocated, "_t0": t0}

    def _land(self, row: dict, t_end: float | None = None) -> None:
        """Record a finished step. Its time runs from its own start to the next step's
        start (the GPU works on one while Python records the next), or to now."""
        t_end = time.perf_counter() if t_end is None else t_end
        dt = max(t_end - row.pop("_t0"), 1e-9)
        row["tokens_per_s"] = row["tokens"] / dt
        self._step_times = (self._step_times + [dt])[-20:]
        row["eta_s"] = (self.total_steps - row["step"]) * sum(self._step_times) / len(self._step_times)
        self.metrics.append(row)
        if self.on_step is not None:
            self.on_step(row)

    def train(self):
        """Natively: run to the end and return the metrics. Under Pyodide: a coroutine."""
        return gpu.maybe_run(self.atrain())

    # -- control ---------------------------------------------------------------
    def pause(self):
        self.control.pause()

    def resume(self):
        self.control.resume()

    def stop(self):
        self.control.stop()

    # -- generation ------------------------------------------------------------
    async def agenerate(self, prompt, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                        seed: int = 0, on_token=None, should_stop=None):
        """Generate with the adapter being trained. prompt: text, token ids, or an Alpaca
        record (formatted with the training prompt template, without its output).
        on_token / should_stop: as Model.agenerate's (streaming, stopping)."""
        if isinstance(prompt, dict):   # a record: its instruction (and input), as training formats them
            why = check_record({"output": "", **prompt})
            if why is not None:
                raise ValueError(f"generate: the prompt record is not an Alpaca record: {why}")
            prompt = format_prompt(prompt)
        await self.setup()
        return await self.model.agenerate(prompt, max_new_tokens, temperature, top_p, seed, lora=self.lora,
                                          on_token=on_token, should_stop=should_stop)

    def generate(self, prompt, max_new_tokens: int = 32, temperature: float = 0.0, top_p: float = 1.0,
                 seed: int = 0):
        """`agenerate` as a plain call natively; an awaitable under Pyodide. str() of the
        result is the text (model.generate is the same without the adapter)."""
        return gpu.maybe_run(self.agenerate(prompt, max_new_tokens, temperature, top_p, seed))

    # -- adapters and checkpoints ---------------------------------------------
    async def aadapter_tensors(self) -> dict:
        await self.setup()
        return await self.lora.read_adapter()

    async def asave_adapter(self, out_dir) -> None:
        tensors = await self.aadapter_tensors()
        adapter_io.save_adapter(out_dir, tensors, self.config, base_model_name_or_path=self.model.name)

    def save_adapter_snapshot(self, out_dir) -> int:
        """Write the adapter as of the last finished step from adapter_snapshot (no GPU
        access: answers at once while a step runs); returns that step."""
        step, raw = self.adapter_snapshot
        adapter_io.save_adapter(out_dir, self.lora.adapter_from(raw), self.config,
                                base_model_name_or_path=self.model.name)
        return step

    def save_adapter(self, out_dir):
        return gpu.maybe_run(self.asave_adapter(out_dir))

    async def save_checkpoint(self, ckpt_dir=None) -> str:
        """Write the training state to ckpt_dir (default: checkpoint_dir, else OUT/checkpoint),
        then run on_checkpoint(step)."""
        ckpt_dir = ckpt_dir or self.checkpoint_dir or os.path.join(self.config.out, CHECKPOINT_DIR)
        t0 = time.monotonic()
        arena = self.lora.arena
        params = await arena.read(arena.params)
        m = await arena.read(arena.m)
        v = await arena.read(arena.v)
        shapes = {s.name: s.shape for s in arena.slots}
        pack = lambda d: {k: (shapes[k], d[k]) for k in d}  # noqa: E731
        path = checkpoint_state.save_state(
            ckpt_dir, step=self.step, params=pack(params), exp_avg=pack(m), exp_avg_sq=pack(v),
            cursor={**self.cursor, "fingerprint": self.dataset.fingerprint()},
            config=self.config.to_dict(), extra={"metrics": self.metrics[-10000:],
                                                 "skipped": self.metrics[-1]["skipped"] if self.metrics else 0},
            base_model_name_or_path=self.model.name)
        if self.on_checkpoint is not None:
            done = self.on_checkpoint(self.step)
            if inspect.isawaitable(done):
                await done
        self._saved_step, self._saved_at = self.step, time.monotonic()
        self.save_s = self._saved_at - t0
        return path

    async def load_checkpoint(self, ckpt_dir, st=None) -> None:
        """Continue from the checkpoint in ckpt_dir (st: its TrainState, read already):
        the adapter, AdamW's moments and step, the data cursor and the metrics so far.
        ValueError where the data or a setting the run depends on differs (resume_changes)."""
        if st is None:   # (setup reads it first and checks it before making any buffer)
            st = checkpoint_state.load_state(ckpt_dir)
            self.resume_changes = resume_changes(st.config, self.config, ckpt_dir)
        fp = st.cursor.get("fingerprint")
        if fp is not None and fp != self.dataset.fingerprint():
            raise ValueError(f"{ckpt_dir}: the checkpoint was made with different data or settings "
                             "(dataset fingerprint differs); resume with the same data and cutoff")
        await self.lora.load_state(st.params, st.exp_avg, st.exp_avg_sq)
        skipped = int(st.extra.get("skipped", 0))
        self.opt.set_step(st.step - skipped, skipped)   # AdamW's t counts the steps not skipped
        self.step = self._saved_step = st.step
        self.cursor = {k: st.cursor[k] for k in ("epoch", "micro_batch", "step")}
        self.metrics = list(st.extra.get("metrics", []))


# Settings a resumed run must share with the checkpoint's: the data's order and batching
# (the cursor is a position in that layout), the adapter's shape and scale (its tensors
# and moments are loaded as they are) and the seed (data order, dropout masks).
RESUME_FIXED = ("micro_batch_size", "grad_accum", "shuffle", "seed", "lora_r", "lora_alpha", "target_modules")
# ... and what may differ without comment: where things are, and how often to save
RESUME_FREE = ("model", "data", "out", "backend", "resume", "init_adapter", "save_every")


def resume_changes(saved: dict, cfg, ckpt_dir) -> list:
    """Check a checkpoint's TrainConfig dict against the run resuming it: raise ValueError
    naming every RESUME_FIXED setting that differs; return the other differences (the
    optimizer's, the schedule's, the run's length: a resumed run may change them) as
    "name value (checkpoint: old)" strings. An old checkpoint without a config: []."""
    if not saved:
        return []
    now = cfg.to_dict()
    same = lambda k: (sorted(saved[k]) == sorted(now[k]) if k == "target_modules"   # noqa: E731
                      else saved[k] == now[k])
    fixed = [k for k in RESUME_FIXED if k in saved and not same(k)]
    if fixed:
        raise ValueError(f"{ckpt_dir}: the checkpoint's run had " + ", ".join(f"{k} {_show(saved[k])}" for k in fixed)
                         + "; this one has " + ", ".join(f"{k} {_show(now[k])}" for k in fixed)
                         + ": resume with the checkpoint's settings, or start a new run without --resume")
    return [f"{k} {_show(now[k])} (checkpoint: {_show(saved[k])})" for k in now
            if k in saved and k not in RESUME_FIXED + RESUME_FREE and not same(k)]


def _show(v) -> str:
    return ",".join(v) if isinstance(v, list) else str(v)

