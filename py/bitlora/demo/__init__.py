"""The built-in demo: a tiny BitNet b1.58 model and an original Alpaca-format
dataset, made by scripts/make_demo.py and shipped as package data. They are the
default model and dataset everywhere (CLI, page, notebooks)."""
from __future__ import annotations

import importlib.resources

_HERE = importlib.resources.files(__name__)

MODEL_DIR = _HERE / "model"              # Hugging Face folder
MODEL_GGUF = _HERE / "model.gguf"        # the same weights as GGUF
DATASET = _HERE / "alpaca_demo.json"     # Alpaca-format records
