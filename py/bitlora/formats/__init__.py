"""Checkpoint and dataset file formats (GGUF, safetensors, Hugging Face folders).

Pure Python, no numpy: this runs inside Pyodide. See `tensors.py` for the one
host-side layout every loader produces, and `checkpoint.open_checkpoint` for the
entry point. `convert.py` is the one native-only module here (numpy + gguf).
"""


class FormatError(ValueError):
    """A checkpoint file is malformed or unsupported; the message names the file,
    the tensor or key, and the problem."""


def __getattr__(name):
    # lazy, so `from bitlora.formats import FormatError` stays cheap
    if name == "open_checkpoint":
        from .checkpoint import open_checkpoint
        return open_checkpoint
    raise AttributeError(name)
