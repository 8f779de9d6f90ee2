"""Portable cases for the host-side training pieces (data, schedules, adapter files,
training states): the same answers natively and in Pyodide. `dev` is unused.

The pytest side compares the browser's answer with the native one, so data order,
LoRA init and file bytes are proven identical across CPython and Pyodide.
"""
import hashlib
import os
import tempfile

from bitlora.formats import peft as adapter
from bitlora.formats import state as checkpoint_state
from bitlora.config import TrainConfig
from bitlora.data import Dataset, load_records
from bitlora.schedule import lr_at


class CharTok:
    """One id per character: enough to exercise batching without a vocabulary."""
    bos_id, eos_id, pad_id = 1, 2, 0

    def encode(self, text, add_special_tokens=False):
        return [3 + (ord(c) % 250) for c in text]


def _sha(b):
    return hashlib.sha256(b).hexdigest()


async def case_pipeline(dev, jsonl_text, config, hf_config):
    cfg = TrainConfig.from_dict(config)
    ds = Dataset(load_records(jsonl_text), CharTok(), cfg.cutoff_len, cfg.train_on_inputs)
    total = ds.total_steps_for(cfg)
    steps = [{"index": s.index, "epoch": s.epoch, "n_targets": s.n_targets, "cursor": s.cursor,
              "indices": [mb.indices for mb in s.micro_batches],
              "ids": _sha(repr([(mb.ids, mb.mask, mb.targets) for mb in s.micro_batches]).encode()),
              "lr": lr_at(cfg, s.index, total)} for s in ds.steps_for(cfg)]
    shapes = adapter.lora_shapes(hf_config, cfg.target_modules, cfg.lora_r)
    params = adapter.init_lora(shapes, cfg.seed)
    with tempfile.TemporaryDirectory() as d:
        adapter.save_adapter(d, params, cfg, "tiny")
        files = {f: _sha(open(os.path.join(d, f), "rb").read()) for f in sorted(os.listdir(d))}
        _, back = adapter.load_adapter(d)
        ck = os.path.join(d, "ck")
        checkpoint_state.save_state(ck, step=len(steps), params=params, exp_avg=params, exp_avg_sq=params,
                                    cursor=steps[-1]["cursor"], config=cfg.to_dict())
        st = checkpoint_state.load_state(ck)
    return {"invalid": ds.invalid, "steps": steps, "files": files,
            "adapter_round_trip": back == params and st.params == params and st.cursor == steps[-1]["cursor"]}
