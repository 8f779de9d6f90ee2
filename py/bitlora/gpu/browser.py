"""The browser backend: WebGPU through Pyodide's `js` module, in a Web Worker.

A Worker has no `window`; `js` is the worker's global scope, so `js.navigator.gpu`
is the entry point. Descriptors are plain JS objects built with `to_js`; bytes
cross into JS as Uint8Arrays. Errors are collected three ways: an error scope
around shader module creation (with the compiler's messages) and the rejection of
createComputePipelineAsync, `onuncapturederror` for everything else, and the
device's `lost` promise.
"""
from __future__ import annotations

import array

import js  # noqa: F401 - only importable under Pyodide
from pyodide.ffi import create_proxy, to_js

from .device import RAISED_LIMITS, GPUError, GPUUnavailable, DeviceLost, MAP_READ, COPY_DST, OutOfMemory

ENABLE_HINT = (
    "WebGPU is not available in this browser. Use a recent Chrome, Edge or Safari 26+ "
    "(Firefox 141+ on Windows), or enable it: chrome://flags/#enable-unsafe-webgpu "
    "(Linux also needs #enable-vulkan). Headless Chromium needs --enable-unsafe-webgpu."
)


def _obj(d):
    return to_js(d, dict_converter=js.Object.fromEntries)


def _missing(x) -> bool:
    """JS null or undefined (Pyodide maps them to JsNull / None / js.undefined)."""
    return x is None or type(x).__name__ == "JsNull" or x == js.undefined


class BrowserBackend:
    name = "browser"
    # Put before every shader module (gpu/device.py read_shader). Chrome requires
    # `enable subgroups;` in a module that uses subgroup builtins (and the 'subgroups'
    # feature on the device); no kernel does yet, so nothing goes here.
    wgsl_header = ""

    @classmethod
    async def open(cls, required_features=()):
        self = cls()
        gpu = getattr(js.navigator, "gpu", None)
        if _missing(gpu):
            raise GPUUnavailable(ENABLE_HINT)
        adapter = await gpu.requestAdapter(_obj({"powerPreference": "high-performance"}))
        if _missing(adapter):
            raise GPUUnavailable("navigator.gpu returned no adapter: " + ENABLE_HINT)
        alimits = adapter.limits
        wanted = {k: getattr(alimits, k) for k in RAISED_LIMITS if getattr(alimits, k, None) is not None}
        feats = [f for f in required_features if adapter.features.has(f)]
        try:
            self.device = await adapter.requestDevice(_obj({"requiredLimits": wanted, "requiredFeatures": feats}))
        except Exception as e:  # noqa: BLE001 - a JsException
            raise GPUUnavailable(f"requestDevice failed: {e}") from None
        info = adapter.info
        self.adapter_info = {k: str(getattr(info, k, "") or "") for k in ("vendor", "architecture", "device", "description")}
        self.adapter_info["backend"] = "WebGPU"
        self.adapter_info["is_fallback"] = bool(getattr(info, "isFallbackAdapter", False))
        self.features = sorted(str(f) for f in getattr(js.Array, "from")(self.device.features))
        langs = getattr(gpu, "wgslLanguageFeatures", None)   # a set-like of names (Chrome 115+)
        self.wgsl_features = set() if _missing(langs) else {str(f) for f in getattr(js.Array, "from")(langs)}
        dl = self.device.limits
        names = list(RAISED_LIMITS) + ["minUniformBufferOffsetAlignment", "minStorageBufferOffsetAlignment",
                                       "maxComputeWorkgroupSizeZ", "maxBindGroups"]
        self.limits = {k: int(getattr(dl, k)) for k in names if getattr(dl, k, None) is not None}
        self.queue = self.device.queue
        self._error = None
        self._lost = None

        def on_error(event):
            if self._error is None:
                if str(event.error.constructor.name) == "GPUOutOfMemoryError":
                    self._error = OutOfMemory(f"a WebGPU allocation failed ({event.error.message})")
                else:
                    self._error = GPUError(f"WebGPU error: {event.error.message}")
        self._on_error = create_proxy(on_error)
        self.device.addEventListener("uncapturederror", self._on_error)

        def on_lost(info):
            self._lost = DeviceLost(f"the GPU device was lost ({info.reason}): {info.message}")
        self._on_lost = create_proxy(on_lost)
        self.device.lost.then(self._on_lost)
        self._staging_pool: dict[int, list] = {}
        # static/replay.js's replay, where the page's worker loaded it (a JupyterLite kernel
        # does not): programs are replayed by one call into it, else from Python.
        replay = getattr(js, "bitloraReplay", None)
        self.replay_js = None if _missing(replay) else replay
        return self

    # buffers
    def create_buffer(self, size, usage, label):
        return self.device.createBuffer(_obj({"size": size, "usage": usage, "label": label}))

    def write_buffer(self, handle, offset, mv):
        arr = js.Uint8Array.new(mv.nbytes)
        arr.assign(mv)
        self.queue.writeBuffer(handle, offset, arr)   # copies arr now: its memory may go at once
        if mv.nbytes >= 1 << 20 and hasattr(arr.buffer, "transfer"):
            arr.buffer.transfer(0)     # a model's upload would otherwise pile up until a collection

    def destroy_buffer(self, handle):
        handle.destroy()

    def acquire_staging(self, size):
        pool = self._staging_pool.get(size)
        if pool:
            return pool.pop()
        return self.device.createBuffer(_obj({"size": size, "usage": MAP_READ | COPY_DST}))

    def release_staging(self, staging):
        self._staging_pool.setdefault(int(staging.size), []).append(staging)

    def after_submit(self, staging):
        # Start mapping now so the promise resolves while Python goes on recording.
        staging._bitlora_map = staging.mapAsync(MAP_READ)

    async def map_read(self, staging, size):
        if self._lost is not None:
            raise self._lost
        promise = getattr(staging, "_bitlora_map", None)
        try:
            await (promise if promise is not None else staging.mapAsync(MAP_READ))
        except Exception as e:  # noqa: BLE001
            raise (self._lost or GPUError(f"reading back from the GPU failed: {e}")) from None
        staging._bitlora_map = None
        data = js.Uint8Array.new(staging.getMappedRange(0, size)).to_bytes()
        staging.unmap()
        return data

    # pipelines
    async def create_module(self, code, label):
        dev = self.device
        dev.pushErrorScope("validation")
        module = dev.createShaderModule(_obj({"code": code, "label": label}))
        info = await module.getCompilationInfo()
        err = await dev.popErrorScope()
        errors = [m for m in info.messages if m.type == "error"]
        if errors:
            text = "\n".join(f"{label}:{int(m.lineNum)}:{int(m.linePos)}: {m.message}" for m in errors)
            raise GPUError(f"WGSL {label}: {text}")
        if not _missing(err):
            raise GPUError(f"WGSL {label}: {err.message}")
        return module

    async def create_pipeline(self, module, entry, constants, label):
        stage = {"module": module, "entryPoint": entry}
        if constants:
            stage["constants"] = constants
        try:
            pipeline = await self.device.createComputePipelineAsync(
                _obj({"layout": "auto", "compute": stage, "label": label}))
        except Exception as e:  # noqa: BLE001 - a JsException wrapping GPUPipelineError
            raise GPUError(f"WGSL {label}: {getattr(e, 'message', e)}") from None
        return pipeline, pipeline.getBindGroupLayout(0)

    def create_bind_group(self, layout, bound):
        entries = [{"binding": i, "resource": {"buffer": h, "offset": o, "size": s}}
                   for i, (h, o, s) in enumerate(bound)]
        return self.device.createBindGroup(_obj({"layout": layout, "entries": entries}))

    # recording
    def create_encoder(self):
        return self.device.createCommandEncoder()

    def begin_pass(self, encoder):
        return encoder.beginComputePass()

    def end_pass(self, cpass):
        cpass.end()

    def dispatch(self, cpass, pipeline, bind_group, groups):
        cpass.setPipeline(pipeline)
        cpass.setBindGroup(0, bind_group)
        cpass.dispatchWorkgroups(*groups)

    # recorded programs (gpu/device.py Program)
    def program(self, commands):
        """Device.record's commands -> the object static/replay.js's replay(encoder,
        program) takes (a flat Float64Array of commands and arrays of the pipelines, bind
        groups and buffers they name), built once. Where the worker did not load that
        module (replay_js), the commands themselves, replayed from Python."""
        if self.replay_js is None:
            return ("python", commands)
        tables = {"pipelines": ([], {}), "bindGroups": ([], {}), "buffers": ([], {})}

        def index(table, obj):
            objs, seen = tables[table]
            i = seen.get(id(obj))
            if i is None:
                i = seen[id(obj)] = len(objs)
                objs.append(obj)
            return i

        code = array.array("d")
        for c in commands:
            if c[0] == "dispatch":
                code.extend((0, index("pipelines", c[1]), index("bindGroups", c[2]), *c[3]))
            elif c[0] == "copy":
                code.extend((1, index("buffers", c[1]), c[2], index("buffers", c[3]), c[4], c[5]))
            else:
                code.extend((2, index("buffers", c[1]), c[2], c[3]))
        arr = js.Float64Array.new(len(code))
        arr.assign(code)
        prog = _obj({"code": arr, **{k: objs for k, (objs, _) in tables.items()}})
        return ("js", prog)

    def replay(self, encoder, prepared):
        how, prog = prepared
        if how == "js":
            self.replay_js(encoder, prog)
            return
        cpass = None
        for c in prog:
            if c[0] == "dispatch":
                if cpass is None:
                    cpass = encoder.beginComputePass()
                self.dispatch(cpass, c[1], c[2], c[3])
                continue
            if cpass is not None:
                cpass.end()
                cpass = None
            if c[0] == "copy":
                encoder.copyBufferToBuffer(*c[1:])
            else:
                encoder.clearBuffer(*c[1:])
        if cpass is not None:
            cpass.end()

    def copy(self, encoder, src, src_off, dst, dst_off, size):
        encoder.copyBufferToBuffer(src, src_off, dst, dst_off, size)

    def clear(self, encoder, handle, offset, size):
        encoder.clearBuffer(handle, offset, size)

    def discard(self, encoder):
        encoder.finish()   # finished, never submitted: garbage

    def submit(self, encoder):
        if self._lost is not None:
            raise self._lost
        self.queue.submit(to_js([encoder.finish()]))

    async def wait_idle(self):
        await self.queue.onSubmittedWorkDone()

    def take_error(self):
        if self._lost is not None:
            return self._lost
        err, self._error = self._error, None
        return err
