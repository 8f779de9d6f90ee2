"""The native backend: wgpu-py (wgpu-native) on Vulkan, Metal or D3D12.

Here the calls block: wgpu-py's synchronous API is used inside the async methods,
so the same `await`-based code above runs unchanged under CPython's asyncio.
"""
from __future__ import annotations

import asyncio
import itertools
import os
import tempfile

os.environ.setdefault("XDG_RUNTIME_DIR", tempfile.gettempdir())  # quiets Mesa on headless machines

import wgpu  # noqa: E402

from .device import COPY_DST, COPY_SRC, INT8_DOT, MAP_READ, RAISED_LIMITS, GPUError, GPUUnavailable, OutOfMemory, mib  # noqa: E402


def _hyphen(name: str) -> str:
    """maxStorageBufferBindingSize -> max-storage-buffer-binding-size (wgpu-py's keys)."""
    return "".join("-" + c.lower() if c.isupper() else c for c in name)


def _camel(name: str) -> str:
    head, *rest = name.split("-")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _pick_adapter():
    """Prefer a real GPU over a CPU one, and Vulkan/Metal/D3D12 over OpenGL."""
    adapters = wgpu.gpu.enumerate_adapters_sync()
    if not adapters:
        raise GPUUnavailable("wgpu found no GPU adapter. Install a Vulkan driver "
                             "(on Debian: apt-get install mesa-vulkan-drivers) or use a machine with a GPU.")

    def rank(a):
        info = a.info
        return (info.get("backend_type") == "OpenGL", info.get("adapter_type") == "CPU")

    return sorted(adapters, key=rank)[0]


# WGSL language features worth knowing about, each with a module that uses it. wgpu-native
# reports none (wgpu.gpu.wgsl_language_features is empty), so they are found by compiling.
_PROBES = {
    INT8_DOT: "@compute @workgroup_size(1) fn main() { _ = dot4I8Packed(1u, 2u); }",
}


def _wgsl_features(device) -> set:
    """The language features of _PROBES that this device's shader compiler accepts."""
    found = set()
    for name, code in _PROBES.items():
        try:
            device.create_shader_module(code=code, label=f"probe {name}")
            found.add(name)
        except Exception:  # noqa: BLE001 - wgpu raises a validation error: not supported
            pass
    return found


try:   # wgpu-native's C entry points as cffi exposes them, without wgpu-py's per-call wrapper
    from wgpu.backends.wgpu_native._ffi import ffi as _ffi, lib as _lib   # (error capture: ~3 us a call)
except ImportError:   # another wgpu-py layout: replay through the public methods
    _lib = None


def _replay_pass(cpass, run, stamp=None) -> None:
    """One compute pass of a replayed program: `run` holds (pipeline, bind group, x, y, z)
    C handles; the pipeline is set only where it changes. `stamp()`, where given, is
    called after each dispatch (NativeBackend.replay_timed)."""
    set_pipeline = _lib.wgpuComputePassEncoderSetPipeline
    set_bind_group = _lib.wgpuComputePassEncoderSetBindGroup
    dispatch = _lib.wgpuComputePassEncoderDispatchWorkgroups
    null, last = _ffi.NULL, None
    for pipeline, bind_group, x, y, z in run:
        if pipeline is not last:
            set_pipeline(cpass, pipeline)
            last = pipeline
        set_bind_group(cpass, 0, bind_group, 0, null)
        dispatch(cpass, x, y, z)
        if stamp is not None:
            stamp()


def _module_with_checks(device, code, label, checks):
    """A WGSL module compiled with naga's runtime checks `checks` (wgpu-native's
    WGPUShaderRuntimeChecks bits: 1 bounds checks, 2 loop bounding; 3 is what
    create_shader_module does)."""
    from wgpu.backends.wgpu_native import _api
    src = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(code))
    src[0].chain.next = _ffi.NULL
    src[0].chain.sType = _lib.WGPUSType_ShaderSourceWGSL
    desc = _api.new_struct_p("WGPUShaderModuleDescriptor *", nextInChain=_ffi.cast("WGPUChainedStruct *", src),
                             label=_api.to_c_string_view(label))
    mid = _api.libf.wgpuDeviceCreateShaderModuleTrusted(device._internal, desc, checks)
    if mid == _ffi.NULL:
        raise GPUError(f"WGSL {label}: wgpu-native created no module (runtime checks {checks})")
    return _api.GPUShaderModule(label, mid, device)


# naga's runtime checks in the modules we compile (BITLORA_SHADER_CHECKS overrides): index
# clamping (1) keeps every access in bounds, as any WebGPU implementation must; loop
# bounding (2), a counter that ends any loop after 2^64 turns, is wgpu's own addition,
# not something WebGPU asks for. On an H100 (2026-12-07) it cost 12 % of config B's
# step (372.9 ms with both, 328.3 with clamping only, 334.9 with neither) and 1.5-1.65x
# in attention, whose loops run to bounds read from uniforms; the results are the same bits.
SHADER_CHECKS = 1

TIMESTAMP_FEATURES = ("timestamp-query", "timestamp-query-inside-passes")
QUERIES_PER_SET = 4096   # wgpu's most queries in one query set


class NativeBackend:
    name = "native"
    # Put before every shader module (gpu/device.py read_shader). Empty: naga needs no
    # directive for what the kernels use, and rejects `enable subgroups;`.
    wgsl_header = ""

    def __init__(self, required_features=()):
        adapter = _pick_adapter()
        alimits = adapter.limits
        wanted = {_hyphen(k): alimits[_hyphen(k)] for k in RAISED_LIMITS if _hyphen(k) in alimits}
        # timestamps between dispatches (replay_timed: the benchmarks' per-kernel profile)
        # where the adapter has them; requesting them changes nothing else
        feats = [f for f in (*required_features, *TIMESTAMP_FEATURES) if f in adapter.features]
        self._error = None
        try:
            self.device = adapter.request_device_sync(required_limits=wanted, required_features=feats)
        except Exception as e:  # noqa: BLE001 - wgpu raises several types here
            raise GPUUnavailable(f"could not open a device on {adapter.info.get('device')}: {e}") from e
        info = adapter.info
        self.adapter_info = {
            "vendor": info.get("vendor", ""), "architecture": info.get("architecture", ""),
            "device": info.get("device", ""), "description": info.get("description", ""),
            "backend": info.get("backend_type", ""), "adapter_type": info.get("adapter_type", ""),
        }
        self.features = sorted(self.device.features)
        self.wgsl_features = _wgsl_features(self.device)
        self.limits = {_camel(k): v for k, v in self.device.limits.items()}
        self.queue = self.device.queue
        self._staging_pool: dict[int, list] = {}
        checks = os.environ.get("BITLORA_SHADER_CHECKS")
        if checks is not None and not checks.isdigit():
            raise ValueError(f"BITLORA_SHADER_CHECKS={checks!r}: give naga's runtime-check bits as a number "
                             "(0 none, 1 index clamping: the default, 2 loop bounding, 3 both: wgpu's own)")
        self.shader_checks = None if _lib is None else SHADER_CHECKS if checks is None else int(checks)

    # buffers
    def create_buffer(self, size, usage, label):
        try:
            return self.device.create_buffer(size=size, usage=usage, label=label)
        except Exception as e:  # noqa: BLE001
            if isinstance(e, wgpu.GPUOutOfMemoryError) or "out of memory" in str(e).lower():
                raise OutOfMemory(f"buffer {label!r} ({mib(size)}) does not fit: the GPU is out of memory "
                                  f"({e})", label, size) from None
            raise GPUError(f"could not allocate buffer {label!r} of {size} bytes: {e}") from e

    def write_buffer(self, handle, offset, mv):
        self.queue.write_buffer(handle, offset, mv)

    def destroy_buffer(self, handle):
        handle.destroy()

    def acquire_staging(self, size):
        pool = self._staging_pool.get(size)
        if pool:
            return pool.pop()
        return self.device.create_buffer(size=size, usage=MAP_READ | COPY_DST)

    def release_staging(self, staging):
        self._staging_pool.setdefault(staging.size, []).append(staging)

    def after_submit(self, staging):
        pass

    async def map_read(self, staging, size):
        staging.map_sync(wgpu.MapMode.READ, 0, size)
        data = bytes(staging.read_mapped(0, size))
        staging.unmap()
        # Inside a running asyncio loop, wgpu-py schedules each resolved promise's
        # callback with call_soon_threadsafe; a training task that never suspends
        # would let them pile up (~1 KB per read) until it ends. Let the loop run them.
        await asyncio.sleep(0)
        return data

    # pipelines
    async def create_module(self, code, label):
        try:
            if self.shader_checks is not None:
                return _module_with_checks(self.device, code, label, self.shader_checks)
            return self.device.create_shader_module(code=code, label=label)
        except wgpu.GPUError as e:
            raise GPUError(f"WGSL {label}: {e.message if hasattr(e, 'message') else e}") from None

    async def create_pipeline(self, module, entry, constants, label):
        try:
            stage = {"module": module, "entry_point": entry}
            if constants:
                stage["constants"] = constants
            pipeline = self.device.create_compute_pipeline(layout="auto", compute=stage, label=label)
        except wgpu.GPUError as e:
            raise GPUError(f"WGSL {label}: {e.message if hasattr(e, 'message') else e}") from None
        return pipeline, pipeline.get_bind_group_layout(0)

    def create_bind_group(self, layout, bound):
        entries = [{"binding": i, "resource": {"buffer": h, "offset": o, "size": s}}
                   for i, (h, o, s) in enumerate(bound)]
        try:
            return self.device.create_bind_group(layout=layout, entries=entries)
        except wgpu.GPUError as e:
            raise GPUError(f"bind group: {e.message if hasattr(e, 'message') else e}") from None

    # recording
    def create_encoder(self):
        return self.device.create_command_encoder()

    def begin_pass(self, encoder):
        return encoder.begin_compute_pass()

    def end_pass(self, cpass):
        cpass.end()

    def dispatch(self, cpass, pipeline, bind_group, groups):
        cpass.set_pipeline(pipeline)
        cpass.set_bind_group(0, bind_group)
        cpass.dispatch_workgroups(*groups)

    # recorded programs (gpu/device.py Program)
    def program(self, commands):
        """Device.record's commands -> what replay loops over: runs of dispatches, each
        one compute pass of (pipeline, bind group, x, y, z) as the C handles wgpu-native
        takes, and copies / clears. The objects stay referenced (alive) with it."""
        out, run, keep = [], None, []
        for c in commands:
            if c[0] == "dispatch":
                if run is None:
                    run = []
                    out.append(("pass", run))
                pipeline, bind_group = c[1], c[2]
                keep.append(bind_group)
                if _lib is not None:
                    pipeline, bind_group = pipeline._internal, bind_group._internal
                run.append((pipeline, bind_group, *c[3]))
            else:
                run = None
                out.append((c[0], c[1:]))
        return out, keep

    def replay(self, encoder, prepared):
        for what, item in prepared[0]:
            if what == "pass":
                cpass = encoder.begin_compute_pass()
                if _lib is not None:
                    _replay_pass(cpass._internal, item)
                else:
                    last = None
                    for pipeline, bind_group, x, y, z in item:
                        if pipeline is not last:
                            cpass.set_pipeline(pipeline)
                            last = pipeline
                        cpass.set_bind_group(0, bind_group)
                        cpass.dispatch_workgroups(x, y, z)
                cpass.end()   # validation errors of the pass surface here or at submit
            elif what == "copy":
                encoder.copy_buffer_to_buffer(*item)
            else:
                encoder.clear_buffer(*item)

    @property
    def can_time(self) -> bool:
        return _lib is not None and all(f in self.features for f in TIMESTAMP_FEATURES)

    def replay_timed(self, prepared) -> list:
        """Submit a recorded program alone with a GPU timestamp at the start of each of its
        passes and after each dispatch, wait for it, and return the seconds between each
        dispatch's stamp and the one before it (the dispatch in place: the barrier before
        it and its drain included), in order. Needs `can_time`."""
        total = sum(len(item) + 1 for what, item in prepared[0] if what == "pass")
        if not total:
            return []
        sets = [self.device.create_query_set(type="timestamp", count=min(QUERIES_PER_SET, total - i))
                for i in range(0, total, QUERIES_PER_SET)]
        write, queries, after = _lib.wgpuComputePassEncoderWriteTimestamp, itertools.count(), []

        def stamp(cpass) -> int:   # a timestamp into the next query; its index
            i = next(queries)
            write(cpass, sets[i // QUERIES_PER_SET]._internal, i % QUERIES_PER_SET)
            return i

        encoder = self.device.create_command_encoder()
        for what, item in prepared[0]:
            if what != "pass":
                (encoder.copy_buffer_to_buffer if what == "copy" else encoder.clear_buffer)(*item)
                continue
            cpass = encoder.begin_compute_pass()
            stamp(cpass._internal)   # the pass's start
            _replay_pass(cpass._internal, item, lambda: after.append(stamp(cpass._internal)))
            cpass.end()
        out = self.device.create_buffer(size=8 * total, usage=wgpu.BufferUsage.QUERY_RESOLVE | COPY_SRC)
        for k, qs in enumerate(sets):
            encoder.resolve_query_set(qs, 0, qs.count, out, 8 * QUERIES_PER_SET * k)
        self.submit(encoder)
        ticks = memoryview(self.queue.read_buffer(out)).cast("Q")
        period = _lib.wgpuQueueGetTimestampPeriod(self.queue._internal) * 1e-9   # seconds a tick
        out.destroy()
        for qs in sets:
            qs.destroy()
        return [max(int(ticks[a]) - int(ticks[a - 1]), 0) * period for a in after]

    def copy(self, encoder, src, src_off, dst, dst_off, size):
        encoder.copy_buffer_to_buffer(src, src_off, dst, dst_off, size)

    def clear(self, encoder, handle, offset, size):
        encoder.clear_buffer(handle, offset, size)

    def discard(self, encoder):
        encoder.finish()   # finished, never submitted: wgpu-native frees it

    def submit(self, encoder):
        try:
            self.queue.submit([encoder.finish()])
        except wgpu.GPUError as e:
            raise GPUError(f"submit failed: {e}") from None

    async def wait_idle(self):
        # queue.on_submitted_work_done_sync() fails in wgpu-py 0.32 (a cffi TypeError);
        # reading a tiny buffer waits for all submitted work just the same.
        if not hasattr(self, "_fence"):
            self._fence = self.device.create_buffer(size=4, usage=COPY_SRC)
        self.queue.read_buffer(self._fence)

    def take_error(self):
        err, self._error = self._error, None
        return err
