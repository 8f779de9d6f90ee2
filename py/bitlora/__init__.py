"""bitlora: LoRA finetuning of BitNet b1.58 on WebGPU — the notebook API.

    import bitlora
    model = bitlora.load_model("demo")              # HF folder, .gguf, URL, bytes or "demo"
    trainer = bitlora.Trainer(model, "demo", {"max_steps": 20, "lr": 2e-3})
    bitlora.train_with_display(trainer)             # progress bar + loss plot in a notebook
    trainer.metrics, trainer.save_adapter("out"), str(model.generate("Hello"))
    bitlora.show_app()                              # the web app in an output cell

Natively every call runs to the end; under Pyodide (a JupyterLite or browser kernel)
load_model, train, save_adapter, generate and train_with_display return awaitables.
Cells meant for both await the forms that are awaitable everywhere: aload_model,
atrain_with_display, trainer.agenerate, trainer.asave_adapter.

Everything is exported lazily (module `__getattr__`): `import bitlora` imports no GPU
library, so it is cheap and works in Pyodide before a device exists.
"""
from __future__ import annotations

__all__ = ["load_model", "aload_model", "Trainer", "TrainConfig", "attach_display",
           "train_with_display", "atrain_with_display", "NotebookProgress", "show_app"]

# name -> (module, attribute path) that defines it (imported on first use)
_LAZY = {
    "load_model": ("model", "load_model"), "aload_model": ("model", "Model.load"),
    "Trainer": ("train", "Trainer"), "TrainConfig": ("config", "TrainConfig"),
    "attach_display": ("notebook", "attach_display"), "train_with_display": ("notebook", "train_with_display"),
    "atrain_with_display": ("notebook", "atrain_with_display"),
    "NotebookProgress": ("notebook", "NotebookProgress"), "show_app": ("notebook", "show_app"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        module, path = _LAZY[name]
        value = importlib.import_module(f".{module}", __name__)
        for part in path.split("."):
            value = getattr(value, part)
        globals()[name] = value          # next lookups skip __getattr__
        return value
    raise AttributeError(f"module 'bitlora' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
