"""Portable case for the notebook API (bitlora/__init__.py, bitlora/notebook.py): the
calls a notebook makes, written once; natively they return values, under Pyodide
awaitables, so each result goes through `_value`."""
import inspect
import os

import bitlora


async def _value(x):
    return await x if inspect.isawaitable(x) else x


async def case_notebook_api(dev, src="demo", steps=2, out="/tmp/bitlora-notebook-adapter"):
    """load_model("demo") -> Trainer on the demo dataset -> train with the display
    (plain text: no IPython kernel here) -> metrics, generate (base and adapter),
    save_adapter."""
    model = await _value(bitlora.load_model(src, device=dev))
    trainer = bitlora.Trainer(model, "demo", {"max_steps": steps, "micro_batch_size": 1, "grad_accum": 1,
                                              "lr": 5e-3, "warmup_steps": 0})
    lines = []
    metrics = await _value(bitlora.train_with_display(trainer, every=2, out=lines.append))
    record = {"instruction": "What is 2 plus 0?", "input": "", "output": "2"}
    tuned = await _value(trainer.generate(record, max_new_tokens=2))
    base = await _value(model.generate("The word", max_new_tokens=2))
    await _value(trainer.save_adapter(out))
    return {"metrics": metrics, "same_list": metrics is trainer.metrics, "total_steps": trainer.total_steps,
            "lines": lines, "tuned": str(tuned), "base": str(base), "files": sorted(os.listdir(out)),
            "model_name": model.name}
