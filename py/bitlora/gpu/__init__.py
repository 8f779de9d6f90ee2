"""bitlora.gpu: one small async adapter over WebGPU with two backends.

    dev = await bitlora.gpu.get_device()      # browser under Pyodide, else native
    k = await dev.kernel("hello.wgsl", "axpy")
    dev.dispatch(k, [x, y], groups=n // 256, params=struct.pack("<fI", a, n))
    out = await dev.read(y)
    prog = dev.record(lambda: ...)            # dispatches captured once; dev.replay(prog) each step

Natively, `bitlora.gpu.run(coro)` drives a coroutine to completion;
`bitlora.gpu.maybe_run(coro)` does that natively and hands the coroutine back to be
awaited in Pyodide, which cannot block on the GPU (the plain-call API uses it).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import sys

from .device import (Buffer, BufferView, Device, DeviceLost, GPUError, GPUUnavailable, Kernel,
                     OutOfMemory, Program, Programs, Readback, groups_1d, read_shader)

__all__ = ["Buffer", "BufferView", "Device", "DeviceLost", "GPUError", "GPUUnavailable", "Kernel",
           "OutOfMemory", "Program", "Programs", "Readback", "get_device", "groups_1d", "maybe_run", "read_shader",
           "run", "IN_BROWSER"]

IN_BROWSER = sys.platform == "emscripten"
_devices: dict[str, Device] = {}


async def get_device(backend: str | None = None, fresh: bool = False) -> Device:
    """The process-wide device for `backend` ("browser" or "native"; default by platform).
    `fresh=True` opens a new one (e.g. after the old one was lost)."""
    backend = backend or ("browser" if IN_BROWSER else "native")
    dev = _devices.get(backend)
    if dev is None or fresh:
        if backend == "browser":
            from .browser import BrowserBackend
            dev = Device(await BrowserBackend.open())
        elif backend == "native":
            from .native import NativeBackend
            dev = Device(NativeBackend())
        else:
            raise ValueError(f"unknown backend {backend!r}: use 'browser' or 'native'")
        _devices[backend] = dev
    return dev


def run(coro):
    """Run a coroutine to completion from synchronous native code.

    Where an event loop is already running in this thread (Jupyter, Playwright's
    sync API) the coroutine runs on a helper thread with its own loop; the native
    backend's objects may be used from any thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="bitlora-run") as pool:
        return pool.submit(asyncio.run, coro).result()


def maybe_run(coro):
    """Natively: run `coro` to the end and return its result. In Pyodide: return `coro`
    itself, to be awaited."""
    return coro if IN_BROWSER else run(coro)
