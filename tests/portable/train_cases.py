"""Portable training cases: LoRA steps on a tiny model passed in as file bytes, so the
same steps run natively and inside Pyodide; pytest compares them with PEFT + torch."""
import array
import base64
import os

from bitlora.model import Model
from bitlora.config import TrainConfig
from bitlora.data import Dataset
from bitlora.lora import Lora
from bitlora.train import Trainer


def _write_adapter(files: dict, where: str) -> str:
    os.makedirs(where, exist_ok=True)
    for name, b64 in files.items():
        with open(os.path.join(where, name), "wb") as f:
            f.write(base64.b64decode(b64))
    return where


async def _model(dev, model_files):
    return await Model.load({k: base64.b64decode(v) for k, v in model_files.items()}, device=dev)


async def case_train(dev, model_files, adapter_files, records, config, kind=None):
    """Train with `config` from the given initial adapter; return per-step metrics and
    the final adapter. `kind` forces the kernel family ("gpu" / "cpu"; None: the device's)."""
    with dev.kind_as(kind):
        m = await _model(dev, model_files)
        config = dict(config, init_adapter=_write_adapter(adapter_files, "/tmp/bitlora-init-adapter"))
        tr = Trainer(m, records, config)
        await tr.atrain()
        final = await tr.aadapter_tensors()
    return {"metrics": tr.metrics, "adapter": {k: list(v[1]) for k, v in final.items()}}


async def _first_step(dev, model_files, adapter_files, records, config):
    """The model, its adapter (from adapter_files), optimizer step 1 of the records and
    activations for it."""
    from bitlora.formats import peft as adapter_io
    m = await _model(dev, model_files)
    cfg = TrainConfig.from_dict(config)
    _, init = adapter_io.load_adapter(_write_adapter(adapter_files, "/tmp/bitlora-init-adapter"))
    lora = await Lora.create(m, cfg, init=init)
    ds = Dataset(records, m.tokenizer, cfg.cutoff_len, cfg.train_on_inputs)
    step = next(iter(ds.steps_for(cfg)))
    return m, lora, step, m.activations(cfg.micro_batch_size, ds.max_len(), lora, cfg.grad_accum)


async def case_step1_grads(dev, model_files, adapter_files, records, config):
    """The mean-loss gradient of optimizer step 1 (raw GPU sums / target tokens)."""
    m, lora, step, acts = await _first_step(dev, model_files, adapter_files, records, config)
    for j, mb in enumerate(step.micro_batches):
        m.forward(mb.rows(), acts, lora, targets=mb.targets, micro=j, step=0)
        m.backward(acts, lora)
    grads = await lora.arena.read(lora.arena.grads)
    loss = array.array("f")
    loss.frombytes(await dev.read(acts.top.loss_sum))
    return {"n_targets": step.n_targets, "loss_sum": loss[0],
            "grads": {k: [g / step.n_targets for g in v] for k, v in grads.items()}}


async def case_first_micro_writes(dev, model_files, adapter_files, records, config, kind):
    """One step's LoRA gradients two ways, with the `kind` kernels: every micro-batch
    adding into zeroed gradients, and micro-batch 0 writing them over stale values
    (what the Trainer does, its AdamW leaving them unzeroed). Returns both."""
    m, lora, step, acts = await _first_step(dev, model_files, adapter_files, records, config)
    out = {}
    with dev.kind_as(kind):
        await m.prepare(training=True)
        for name, first_writes in (("added", False), ("written", True)):
            dev.write(lora.arena.grads, array.array("f", [0.0 if not first_writes else 7.5] * lora.arena.n))
            for j, mb in enumerate(step.micro_batches):
                m.forward(mb.rows(), acts, lora, targets=mb.targets, micro=j, step=0)
                m.backward(acts, lora, accumulate=j > 0 or not first_writes)
            out[name] = {k: list(v) for k, v in (await lora.arena.read(lora.arena.grads)).items()}
    out["micro_batches"] = len(step.micro_batches)
    return out


async def case_adapted_decoding(dev, model_files, adapter_files, config, ids, n_new):
    """The adapted model three ways: the forward without a cache (no dropout) over all
    of ids; Model.forward with the adapter over the KV cache, a 3-token prefix then one
    token at a time; and greedy generation over the cache beside greedy decoding by
    re-running the uncached forward on the growing sequence."""
    from bitlora.formats import peft as adapter_io
    m = await _model(dev, model_files)
    _, init = adapter_io.load_adapter(_write_adapter(adapter_files, "/tmp/bitlora-init-adapter"))
    lora = await Lora.create(m, TrainConfig.from_dict(config), init=init)
    full = [list(r) for r in await m.alogits(ids, lora)]
    cache = m.kv_cache(1, len(ids))
    cached = []
    for chunk in [ids[:3]] + [[t] for t in ids[3:]]:
        buf = m.forward(chunk, lora=lora, cache=cache)
        flat = array.array("f")
        flat.frombytes(await dev.read(buf, 0, 4 * len(chunk) * m.V))
        cached += [list(flat[r * m.V:(r + 1) * m.V]) for r in range(len(chunk))]
    gen = await m.agenerate(list(ids), n_new, lora=lora)
    seq, ref = list(ids), []
    for _ in range(n_new):
        last = (await m.alogits(seq, lora))[-1]
        tok = max(range(len(last)), key=last.__getitem__)
        ref.append(tok)
        seq.append(tok)
    return {"full": full, "cached": cached, "gen": list(gen.ids), "ref": ref}


async def case_fold_reduces(dev, model_files, adapter_files, records, config):
    """The same training on a GPU kind with Model.FOLD_REDUCES on and off (the split
    reduces of o_proj's and down_proj's input gradients in the norms' backward after them,
    or their own dispatches): each
    run's per-step loss and gradient norm (as hex doubles), the final adapter's bytes (hex)
    and the dispatches its steps recorded."""
    import struct
    out = {}
    fold0 = Model.FOLD_REDUCES
    try:
        for fold in (True, False):
            Model.FOLD_REDUCES = fold
            with dev.kind_as("gpu"):
                m = await _model(dev, model_files)
                tr = Trainer(m, records, dict(config, init_adapter=_write_adapter(adapter_files,
                                                                                  "/tmp/bitlora-init-adapter")))
                before = dev.dispatches
                await tr.atrain()
                out["fold" if fold else "apart"] = {
                    "loss": [struct.pack("<d", r["loss"]).hex() for r in tr.metrics],
                    "grad_norm": [struct.pack("<d", r["grad_norm"]).hex() for r in tr.metrics],
                    "adapter": (await dev.read(tr.lora.arena.params)).hex(), "dispatches": dev.dispatches - before}
                tr.close()
    finally:
        Model.FOLD_REDUCES = fold0
    return out
