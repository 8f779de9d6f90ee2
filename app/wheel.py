"""Build the pure-Python wheel that Pyodide installs, in memory, from the sources.

`bitlora serve` calls this at start-up so the browser always runs the code in the
tree (no stale wheel to forget to rebuild). The wheel holds the library and its
WGSL kernels; it leaves out the command line/server (`bitlora.app`, useless in a
browser) and the demo model files (the page fetches those by URL when needed).
"""
from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.resources
import io
import pathlib
import zipfile

import bitlora

NAME = "bitlora"
SKIP_DIRS = {"__pycache__", "app", "bench"}   # native-only subpackages
SKIP_SUFFIXES = {".pyc", ".gguf", ".safetensors"}


def _version() -> str:
    try:
        return importlib.metadata.version(NAME)
    except importlib.metadata.PackageNotFoundError:
        return "0.0.0"


def _package_files() -> list[tuple[str, bytes]]:
    """(archive name, bytes) for bitlora/** and bitlora/shaders/*.wgsl."""
    files = []
    root = pathlib.Path(bitlora.__file__).parent
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_dir() or set(rel.parts[:-1]) & SKIP_DIRS or path.suffix in SKIP_SUFFIXES:
            continue
        if rel.parts[0] == "demo" and len(rel.parts) > 1 and rel.parts[1] == "model":
            continue
        files.append((f"bitlora/{rel.as_posix()}", path.read_bytes()))
    shaders = importlib.resources.files("bitlora.shaders")
    for entry in sorted(shaders.iterdir(), key=lambda p: p.name):
        if entry.name.endswith((".wgsl", ".py")):
            files.append((f"bitlora/shaders/{entry.name}", entry.read_bytes()))
    return files


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def build_wheel() -> tuple[str, bytes]:
    """Return (filename, wheel bytes) for the browser."""
    version = _version()
    dist_info = f"{NAME}-{version}.dist-info"
    files = _package_files()
    files.append((f"{dist_info}/METADATA", (
        f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {version}\n"
        "Summary: LoRA finetuning of BitNet b1.58 on WebGPU (browser build)\n").encode()))
    files.append((f"{dist_info}/WHEEL", (
        "Wheel-Version: 1.0\nGenerator: bitlora.app.wheel\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n").encode()))
    files.append((f"{dist_info}/top_level.txt", b"bitlora\n"))
    record = "".join(f"{name},{_record_hash(data)}\n" for name, data in files) + f"{dist_info}/RECORD,,\n"
    files.append((f"{dist_info}/RECORD", record.encode()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files:
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
    return f"{NAME}-{version}-py3-none-any.whl", out.getvalue()
