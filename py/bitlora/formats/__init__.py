"""Checkpoint and dataset file formats (GGUF, safetensors, Hugging Face folders).

Pure Python, no numpy: this runs inside Pyodide. See `tensors.py` for the one
host-side layout every loader produces.
"""
