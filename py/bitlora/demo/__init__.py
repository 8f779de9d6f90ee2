"""The built-in demo: a tiny BitNet b1.58 model and an original Alpaca-format
dataset, made by scripts/make_demo.py and shipped as package data. They are the
default model and dataset everywhere (CLI, page, notebooks).

The wheel served to the browser leaves the model's weights out; there the app's
server has them at MODEL_URL, and `model_source()` fetches them."""
from __future__ import annotations

import importlib.resources
import sys

_HERE = importlib.resources.files(__name__)

MODEL_DIR = _HERE / "model"              # Hugging Face folder
MODEL_GGUF = _HERE / "model.gguf"        # the same weights as GGUF
DATASET = _HERE / "alpaca_demo.json"     # Alpaca-format records

MODEL_URL = "/demo/model/"               # where the app's server serves MODEL_DIR
MODEL_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "generation_config.json")


async def model_source():
    """What open_checkpoint reads the demo model from: natively the folder in the
    package; in Pyodide {file name: bytes} fetched from the app's server."""
    if sys.platform != "emscripten":
        return str(MODEL_DIR)
    from pyodide.http import pyfetch          # exists only in Pyodide
    files = {}
    for name in MODEL_FILES:
        resp = await pyfetch(MODEL_URL + name)
        if not resp.ok:
            raise OSError(f"{MODEL_URL + name}: HTTP {resp.status}")
        files[name] = await resp.bytes()
    return files
