"""The web app's Python side: runs in the page's Web Worker under Pyodide.

The worker hands every message that is not raw code to `dispatch(msg)`; each
`type` has one handler here, and handlers answer with `post({...})`. Unknown types
are rejected. No numpy, no blocking: everything GPU-side is awaited.
"""
from __future__ import annotations

import array

from . import gpu
from .ops.hello import axpy


def post(msg: dict) -> None:
    """Send a message to the page (the worker's global postMessage)."""
    import js
    from pyodide.ffi import to_js
    js.postMessage(to_js(msg, dict_converter=js.Object.fromEntries))


async def on_hello(msg: dict) -> None:
    """The foundation's proof: run a WGSL kernel on WebGPU and report the numbers."""
    try:
        dev = await gpu.get_device()
    except gpu.GPUError as e:
        post({"type": "gpu-error", "text": str(e)})
        return
    n = int(msg.get("n", 8))
    x = dev.buffer(4 * n, "x", data=array.array("f", [float(i) for i in range(n)]))
    y = dev.buffer(4 * n, "y", data=array.array("f", [1.0] * n))
    await axpy(dev, 2.0, x, y, n)
    out = array.array("f")
    out.frombytes(await dev.read(y))
    post({"type": "hello", "adapter": dev.describe(), "info": dev.adapter_info,
          "limits": dev.limits, "x": [float(i) for i in range(n)], "y": list(out)})


HANDLERS = {"hello": on_hello}


async def dispatch(msg) -> None:
    kind = msg.get("type")
    handler = HANDLERS.get(kind)
    if handler is None:
        post({"type": "error", "text": f"unknown message type {kind!r}"})
        return
    await handler(msg)
