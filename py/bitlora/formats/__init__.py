"""File formats: checkpoint readers (GGUF, Hugging Face safetensors folders), PEFT
adapters and training states, all pure Python (no numpy: this runs inside Pyodide).

    ck = open_checkpoint(src)        # a GGUF file or HF BitNet folder -> checkpoint.Checkpoint

Modules, each importing (within formats/) only those listed before it:
  errors       FormatError
  source       byte sources: bytes, files, URLs (Range requests), browser Blobs
  tensors      TernaryTensor / FloatTensor, the host layout every reader yields
  ternary      2-bit packing and the GGUF ternary block formats
  safetensors  the header parser; whole-file loads / dumps / write_atomic
  checkpoint   the Checkpoint base class and the config check
  gguf, hf     the two checkpoint readers
  peft         LoRA adapters in PEFT's format (adapter_config.json + safetensors)
  state        training checkpoints for --resume
and this package's `open_checkpoint`, the dispatcher over gguf and hf.
"""
from __future__ import annotations

import os

from .checkpoint import Checkpoint, Folder
from .errors import FormatError
from .gguf import GGUFCheckpoint
from .hf import HFCheckpoint
from .source import Source, as_source, is_blob, source_name

__all__ = ["Checkpoint", "FormatError", "open_checkpoint", "source_name"]


def open_checkpoint(src, progress=None) -> Checkpoint:
    """Open a GGUF file or a HF BitNet folder: a path, a URL (ending in "/" for a
    folder), bytes, a Source, a browser Blob, or {file name: Blob/bytes/Source} for a
    folder's files. progress(done_bytes, total_bytes) is called as tensors are read."""
    if isinstance(src, dict):
        return HFCheckpoint(Folder("<files>", src), progress)
    if isinstance(src, (str, os.PathLike)) and not isinstance(src, bytes):
        s = os.fspath(src)
        if s.startswith(("http://", "https://")):
            if s.endswith("/"):
                return HFCheckpoint(Folder(s), progress)
            return GGUFCheckpoint(as_source(s), progress)
        if os.path.isdir(s):
            return HFCheckpoint(Folder(s), progress)
        if not os.path.exists(s):
            raise FormatError(f"{s}: no such file or folder")
    if not isinstance(src, Source) and not isinstance(src, (bytes, bytearray, memoryview, str, os.PathLike)) \
            and not is_blob(src):
        raise TypeError(f"open_checkpoint: cannot open {type(src).__name__}")
    return GGUFCheckpoint(as_source(src), progress)
