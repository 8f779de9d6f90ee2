"""The one GPU adapter every op goes through, shared by both backends.

A `Device` owns: buffers, compiled kernels (one shader module per WGSL file, one
pipeline per entry point and override constants, each compiled once), bind groups
(cached), a small
arena of uniform "params" slots, and the command encoder that records the current
step. Ops call `dispatch()` any number of times; `submit()` sends everything
recorded as one command buffer. Reads are asynchronous and may be resolved a step
late (`read_later`), so reading a loss never stalls the next step's submission.

What it is not: a general WebGPU wrapper. No textures, no render pipelines. The
backend-specific calls (wgpu-py or the browser's `navigator.gpu`) live in
`native.py` and `browser.py`, behind the handful of methods of `Backend`.

Kernels are compiled ahead: `await dev.prepare(specs)` builds every listed pipeline
(concurrently where the backend can), after which `dev.prepared(shader, entry)` looks
one up synchronously, so recording a step is plain code. `await dev.kernel(...)`
compiles on first use, for one-off kernels and tests.

Per-dispatch params: `queue.writeBuffer` lands before the command buffer it is
submitted with runs, so one uniform buffer reused by two dispatches of the same
submit would show both the last value. Each dispatch therefore gets its own
256-byte-aligned slot in a params arena, all uploaded with one write at submit.

Recorded programs: `prog = dev.record(fn)` runs `fn()` with its dispatches, copies and
clears captured into a `Program` instead of the step: pipelines and workgroup counts
kept, bind groups built and params slots uploaded once (one uniform buffer, identical
slots shared). `dev.replay(prog)` then encodes all of it into the current step with one
backend call (natively a loop over prepared tuples, in the browser one call into
static/replay.js), so a step costs the host almost nothing. `Programs` keeps them
under keys (e.g. micro-batch shape). What a program does must depend only on its key:
values that change from step to step travel in buffers written outside `fn` (writing
a buffer made before the recording, from inside it, is refused).
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.resources
import itertools
from dataclasses import dataclass, field

# GPUBufferUsage / GPUMapMode values from the WebGPU spec (same in both backends).
MAP_READ, COPY_SRC, COPY_DST, UNIFORM, STORAGE = 0x1, 0x4, 0x8, 0x40, 0x80

# Limits we raise to whatever the adapter offers (WebGPU spec names).
RAISED_LIMITS = (
    "maxStorageBufferBindingSize",
    "maxBufferSize",
    "maxStorageBuffersPerShaderStage",
    "maxComputeWorkgroupStorageSize",
    "maxComputeInvocationsPerWorkgroup",
    "maxComputeWorkgroupSizeX",
    "maxComputeWorkgroupSizeY",
    "maxComputeWorkgroupsPerDimension",
    "maxUniformBufferBindingSize",
    "maxBindingsPerBindGroup",
)


# Which kernels suit an adapter. WebGPU implementations that run on the CPU (Mesa's
# lavapipe / llvmpipe, SwiftShader, Microsoft's WARP) execute a workgroup as a loop on
# one thread, so barriers and workgroup memory cost far more than on a GPU; the ops
# record variants shaped for them (one row per invocation, no barriers, vec4 loads).
# Matched, lower-cased, against the adapter's vendor / architecture / device /
# description; adapter_type "CPU" (wgpu-py) or a fallback adapter (the browser) also count.
CPU_ADAPTERS = ("llvmpipe", "lavapipe", "swiftshader", "microsoft basic render driver", "warp")
KINDS = ("gpu", "cpu")
INT8_DOT = "packed_4x8_integer_dot_product"   # the WGSL language feature of dot4I8Packed


def adapter_kind(info: dict) -> str:
    """"cpu" for a WebGPU adapter that runs on the CPU, else "gpu"."""
    if str(info.get("adapter_type", "")).upper() == "CPU" or info.get("is_fallback") is True:
        return "cpu"
    text = " ".join(str(info.get(k, "")) for k in ("vendor", "architecture", "device", "description")).lower()
    return "cpu" if any(name in text for name in CPU_ADAPTERS) else "gpu"


class GPUError(RuntimeError):
    """A WebGPU error: shader compilation, validation, out of memory, lost device."""


class OutOfMemory(GPUError):
    """A buffer did not fit: the GPU's memory, or the device's `memory_limit` budget.
    `label` and `size` name the buffer (the Trainer adds which settings would fit)."""

    def __init__(self, message: str, label: str = "", size: int = 0):
        super().__init__(message)
        self.label, self.size = label, size


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class GPUUnavailable(GPUError):
    """No WebGPU adapter: the message says how to get one."""


class DeviceLost(GPUError):
    """The GPU device was lost (driver reset, `device.destroy()`, tab in background)."""


_uids = itertools.count(1)


@dataclass(eq=False)
class Buffer:
    """A GPU buffer. `size` in bytes; `handle` is the backend's object."""
    handle: object
    size: int
    label: str = ""
    uid: int = field(default_factory=lambda: next(_uids))

    def view(self, offset: int = 0, size: int | None = None) -> "BufferView":
        return BufferView(self, offset, self.size - offset if size is None else size)


@dataclass(frozen=True)
class BufferView:
    """A byte range of a buffer, for binding a slice (e.g. one split of a big tensor)."""
    buffer: Buffer
    offset: int
    size: int

    def view(self, offset: int = 0, size: int | None = None) -> "BufferView":
        """A byte range of this range (offset from its start)."""
        return BufferView(self.buffer, self.offset + offset, self.size - offset if size is None else size)


@dataclass(eq=False)
class Kernel:
    """A compiled compute pipeline for one WGSL entry point. Bind groups are cached by
    `uid` (never reused), not by id(): a dropped Kernel's address can go to a new one."""
    pipeline: object
    layout: object  # bind group layout 0
    name: str
    uid: int = field(default_factory=lambda: next(_uids))


class _Recording:
    """What record() collects: commands, the params blob (with its slots by content) and
    the uids of buffers made meanwhile."""

    def __init__(self):
        self.commands: list = []
        self.params = bytearray()
        self.slots: dict = {}
        self.made: set = set()


@dataclass(eq=False)
class Program:
    """A recorded command list: `prepared` is the backend's form (replayed by one call),
    `dispatches` / `commands` count what it holds; `params` is its uniform buffer and
    `recorded` the commands as recorded (Kernels and BufferViews: the buffers it binds,
    kept alive with it)."""
    prepared: object
    dispatches: int
    commands: int
    params: Buffer | None
    recorded: list


class Programs:
    """Programs recorded under keys for one owner's buffers (a Trainer's activations and
    adapter): `run(key, fn)` replays key's program, recording `fn` first if the key is
    new. The key must name everything that decides what `fn` records (shapes, flags,
    which buffers). At most `limit` are kept (the least recently used goes). `clear()`
    forgets them all: do it before destroying buffers they bind."""

    def __init__(self, dev: "Device", limit: int = 32):
        self.dev, self.limit = dev, limit
        self._by_key: dict = {}
        self.recorded = 0    # how many recordings were made (tests: a new shape records once)

    def run(self, key, fn) -> Program:
        prog = self._by_key.pop(key, None)
        if prog is None:
            prog = self.dev.record(fn)
            self.recorded += 1
            while len(self._by_key) >= self.limit:
                del self._by_key[next(iter(self._by_key))]
        self._by_key[key] = prog   # most recently used last
        self.dev.replay(prog)
        return prog

    def clear(self) -> None:
        self._by_key.clear()

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key) -> bool:
        return key in self._by_key


class Readback:
    """Bytes that will be available after the GPU gets there: `await rb.get()`."""

    def __init__(self, device: "Device", staging, size: int):
        self._device, self._staging, self._size = device, staging, size
        self._data: bytes | None = None
        self._error: BaseException | None = None   # the submit that should have run it failed

    async def get(self) -> bytes:
        if self._error is not None:
            raise self._error
        if self._data is None:
            dev = self._device
            if dev._pending_reads and self in dev._pending_reads:
                dev.submit()
            self._data = await dev.backend.map_read(self._staging, self._size)
            dev.backend.release_staging(self._staging)
            dev._check_errors()
        return self._data

    def __await__(self):
        return self.get().__await__()


PRELUDE = "prelude.wgsl"


def read_shader(name: str, header: str = "") -> str:
    """The WGSL module compiled for `shaders/<name>` (package data in the wheel and in
    Pyodide): the backend's `header` (directives such as `enable subgroups;`, which
    must come first), the file, then the shared prelude (shaders/prelude.wgsl: helpers
    no file repeats). WGSL declarations may come in any order, so the prelude goes
    last and, with an empty header, compiler line numbers are the file's own."""
    files = importlib.resources.files("bitlora.shaders")
    return header + files.joinpath(name).read_text() + "\n" + files.joinpath(PRELUDE).read_text()


def kernel_key(shader: str, entry: str, constants: dict | None = None) -> tuple:
    """The cache key of one pipeline: (file, entry point, sorted override constants)."""
    return (shader, entry, tuple(sorted((constants or {}).items())))


def groups_1d(n_groups: int, max_per_dim: int = 65535) -> tuple[int, int, int]:
    """Split a 1-D workgroup count over x and y; kernels use wid.x + wid.y * nw.x."""
    if n_groups <= max_per_dim:
        return (max(n_groups, 1), 1, 1)
    y = -(-n_groups // max_per_dim)
    return (-(-n_groups // y), y, 1)


class Device:
    """The async GPU adapter. Create with `await bitlora.gpu.get_device()`."""

    def __init__(self, backend):
        self.backend = backend
        self.name = backend.name  # "native" or "browser"
        self.adapter_info: dict = backend.adapter_info
        self.limits: dict = backend.limits
        # "gpu" or "cpu": which kernel variants the ops record (adapter_kind); tests set
        # it to run either variant on any adapter (both must be prepared then).
        self.kind: str = adapter_kind(self.adapter_info)
        # Whether WGSL's dot4I8Packed compiles here (language feature packed_4x8_integer_dot_product,
        # as the backend reports it): the ternary forward on a GPU then runs on int8 dot products
        # (ops/bitlinear.py); tests set it False to run the f32 kernel instead.
        self.int8_dot: bool = INT8_DOT in backend.wgsl_features
        self.dispatches = 0          # recorded so far (benchmarks report dispatches per step)
        self.pipelines_compiled = 0  # tests use this: nothing recompiles after step 1
        self.modules_compiled = 0    # shader modules: one per WGSL file
        self._modules: dict = {}   # shader file -> compiled module
        self._kernels: dict = {}   # kernel_key -> Kernel
        self._bind_groups: dict = {}
        self._encoder = None
        self._pass = None
        self._pending_reads: list[Readback] = []
        # Dispatches wait here until submit (or a copy) because their params slots
        # live in an arena buffer that may still have to grow; then they are encoded.
        self._ops: list = []
        self._params_buf: Buffer | None = None
        self._params = bytearray()   # this submit's params slots
        self._params_sent = 0         # how many of those bytes are uploaded already
        self._align = max(16, int(self.limits.get("minUniformBufferOffsetAlignment", 256)))
        self.allocated = 0       # bytes in live storage buffers made by buffer()
        self.peak_allocated = 0  # the most that ever were (benchmarks report it)
        self.live_buffers = 0    # how many of them (the soak test watches it)
        # A budget of storage-buffer bytes: buffer() refuses to go over it with
        # OutOfMemory, as a real allocation failure would (tests use it to run out on purpose).
        self.memory_limit: int | None = None
        self._collect: list | None = None
        self.splitk_scratch: Buffer | None = None   # partial sums of split matmuls (ops/splitk.py)
        self._rec: _Recording | None = None   # set while record() runs

    # -- buffers -------------------------------------------------------------
    def buffer(self, size: int, label: str = "", data=None) -> Buffer:
        """A storage buffer of `size` bytes (rounded up to 4), zero-filled or `data`."""
        size = max(4, (int(size) + 3) & ~3)
        max_size = self.limits.get("maxBufferSize")
        if max_size and size > max_size:
            raise GPUError(f"buffer {label!r} needs {size} bytes; this device allows "
                           f"at most {max_size} (maxBufferSize)")
        if self.memory_limit is not None and self.allocated + size > self.memory_limit:
            raise OutOfMemory(f"buffer {label!r} ({mib(size)}) does not fit: {mib(self.allocated)} of the "
                              f"{mib(self.memory_limit)} GPU memory budget are in use", label, size)
        buf = Buffer(self.backend.create_buffer(size, STORAGE | COPY_SRC | COPY_DST, label), size, label)
        self.allocated += size
        self.live_buffers += 1
        if self._collect is not None:
            self._collect.append(buf)
        if self._rec is not None:
            self._rec.made.add(buf.uid)
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        if data is not None:
            self.write(buf, data)
        return buf

    def write(self, buf: Buffer, data, offset: int = 0) -> None:
        """Queue `data` (bytes-like) into `buf` at `offset`. It lands before the next
        submit runs: every dispatch of that submit sees the last data written to a
        range, so data that differs between dispatches of one step needs its own buffer."""
        mv = memoryview(data).cast("B")
        if self._rec is not None and buf.uid not in self._rec.made:
            raise GPUError(f"write to {buf.label!r} inside a recording: a replay would not repeat it; "
                           f"write per-step data before recording or replaying")
        if offset + mv.nbytes > buf.size:
            raise GPUError(f"write of {mv.nbytes} bytes at {offset} overflows {buf.label!r} ({buf.size} bytes)")
        if mv.nbytes % 4:
            mv = memoryview(bytes(mv) + b"\0" * (4 - mv.nbytes % 4))
        self.backend.write_buffer(buf.handle, offset, mv)

    def reset_peak(self) -> int:
        """Start peak_allocated again from what is allocated now (returned): a benchmark
        or test sharing the device measures its own peak as peak_allocated - that."""
        self.peak_allocated = self.allocated
        return self.allocated

    def destroy(self, *bufs: Buffer) -> None:
        """Free buffers made by buffer(), and forget the bind groups that use them. What is
        recorded and not yet submitted is submitted first: it may bind them, and a submit
        naming a destroyed buffer fails (natively wgpu-native aborts the process), while
        submitted work keeps them alive until it is done."""
        if self._rec is None and (self._ops or self._encoder is not None):
            self.submit()
        for buf in bufs:
            self.backend.destroy_buffer(buf.handle)
            self.allocated -= buf.size
            self.live_buffers -= 1
        gone = {buf.uid for buf in bufs}
        self._bind_groups = {k: bg for k, bg in self._bind_groups.items()
                             if gone.isdisjoint(uid for uid, _, _ in k[1])}

    @contextlib.contextmanager
    def kind_as(self, kind: str | None):
        """Ops recorded inside the block pick the kernel variants of device kind `kind`
        ("gpu" or "cpu"; None: this device's own), as the tests and benchmarks do to run
        either family on any adapter."""
        old, self.kind = self.kind, kind or self.kind
        try:
            yield
        finally:
            self.kind = old

    @contextlib.contextmanager
    def collect(self, into: list):
        """Buffers made inside the block are also appended to `into`, so their owner
        (a Trainer) can free them all: after a failed set-up, or when it is done."""
        prev, self._collect = self._collect, into
        try:
            yield into
        finally:
            self._collect = prev

    # -- kernels -------------------------------------------------------------
    async def prepare(self, specs) -> int:
        """Compile every kernel of `specs` not compiled yet: items (shader, entry) or
        (shader, entry, constants). Each file's module is compiled once, then the
        pipelines, concurrently where the backend can (the browser). Returns how many
        pipelines were compiled."""
        todo = {}
        for spec in specs:
            shader, entry, constants = (tuple(spec) + (None,))[:3]
            key = kernel_key(shader, entry, constants)
            if key not in self._kernels:
                todo[key] = (shader, entry, constants)
        for shader in dict.fromkeys(s for s, _, _ in todo.values()):   # one at a time: error scopes nest
            await self._module(shader)
        kernels = await asyncio.gather(*(self._pipeline(*spec) for spec in todo.values()))
        self._kernels.update(zip(todo, kernels))
        return len(todo)

    def prepared(self, shader: str, entry: str, constants: dict | None = None) -> Kernel:
        """The pipeline for `entry` in `shaders/<shader>`, compiled by `prepare` before."""
        k = self._kernels.get(kernel_key(shader, entry, constants))
        if k is None:
            consts = f" with {constants}" if constants else ""
            raise GPUError(f"kernel {shader}:{entry}{consts} was not prepared: "
                           f"await dev.prepare(specs) first (bitlora.ops.kernel_specs lists a model's)")
        return k

    async def kernel(self, shader: str, entry: str, constants: dict | None = None) -> Kernel:
        """The pipeline for `entry` in `shaders/<shader>`, compiled on first use only."""
        await self.prepare([(shader, entry, constants)])
        return self.prepared(shader, entry, constants)

    async def _module(self, shader: str):
        module = self._modules.get(shader)
        if module is None:
            module = await self.backend.create_module(read_shader(shader, self.backend.wgsl_header), shader)
            self._modules[shader] = module
            self.modules_compiled += 1
        return module

    async def _pipeline(self, shader: str, entry: str, constants: dict | None) -> Kernel:
        label = f"{shader}:{entry}"
        pipeline, layout = await self.backend.create_pipeline(await self._module(shader), entry,
                                                              constants or {}, label)
        self.pipelines_compiled += 1
        return Kernel(pipeline, layout, label)

    async def compile(self, code: str, entry: str, constants: dict | None = None, label: str = "") -> Kernel:
        """Compile WGSL source as given (no prelude: add `read_shader`'s if needed);
        errors raise GPUError with the compiler's message."""
        label = label or entry
        module = await self.backend.create_module(self.backend.wgsl_header + code, label)
        pipeline, layout = await self.backend.create_pipeline(module, entry, constants or {}, label)
        self.pipelines_compiled += 1
        return Kernel(pipeline, layout, label)

    # -- recording -----------------------------------------------------------
    def _enc(self):
        if self._encoder is None:
            self._encoder = self.backend.create_encoder()
        return self._encoder

    def _end_pass(self):
        if self._pass is not None:
            self.backend.end_pass(self._pass)
            self._pass = None

    def _param_slot(self, params: bytes) -> BufferView:
        size = (len(params) + 15) & ~15
        rec = self._rec
        if rec is not None:   # a program's slots are never rewritten: identical ones are shared
            off = rec.slots.get(params)
            if off is not None:
                return BufferView(None, off, size)
            off = rec.slots[params] = len(rec.params)
            blob = rec.params
        else:
            off, blob = len(self._params), self._params
        blob += params + b"\0" * (size - len(params))
        blob += b"\0" * ((-len(blob)) % self._align)
        return BufferView(None, off, size)  # buffer filled in at bind time

    def dispatch(self, kernel: Kernel, bindings: list, groups, params: bytes | None = None) -> None:
        """Record one dispatch. With `params`, binding 0 is a uniform holding them and
        `bindings` (Buffers or BufferViews) follow from binding 1."""
        entries = []
        if params is not None:
            entries.append(self._param_slot(params))
        for b in bindings:
            entries.append(b if isinstance(b, BufferView) else BufferView(b, 0, b.size))
        if isinstance(groups, int):
            groups = groups_1d(groups, int(self.limits.get("maxComputeWorkgroupsPerDimension", 65535)))
        if self._rec is not None:
            self._rec.commands.append(("dispatch", kernel, entries, tuple(groups)))
            return
        self.dispatches += 1
        self._enc()
        if self._pass is None:
            self._pass = self.backend.begin_pass(self._encoder)
        self._ops.append((kernel, entries, groups))

    def _flush_ops(self) -> None:
        """Encode the queued dispatches. Params slots of one submit never share bytes:
        offsets keep growing until submit() (a flush before a copy must not let later
        params overwrite earlier ones, since every write lands before the command
        buffer runs). Only the bytes added since the last flush are uploaded."""
        if not self._ops:
            return
        need = len(self._params)
        if need > self._params_sent:
            if self._params_buf is None or self._params_buf.size < need:
                # Earlier ops of this submit keep the old buffer (referenced by their
                # bind groups); the new one gets everything so far, offsets unchanged.
                cap = max(need, 2 * (self._params_buf.size if self._params_buf else 0), 64 * 1024)
                self._params_buf = Buffer(self.backend.create_buffer(cap, UNIFORM | COPY_DST, "params"), cap, "params")
                self._params_sent = 0
            self.backend.write_buffer(self._params_buf.handle, self._params_sent,
                                      memoryview(self._params)[self._params_sent:need])
            self._params_sent = need
        pbuf = self._params_buf
        ops, self._ops = self._ops, []   # taken even if one fails to encode: the next flush starts clean
        for kernel, entries, groups in ops:
            key = (kernel.uid, tuple((e.buffer.uid if e.buffer else pbuf.uid, e.offset, e.size) for e in entries))
            bg = self._bind_groups.get(key)
            if bg is None:
                if len(self._bind_groups) > 8192:
                    self._bind_groups.clear()
                bound = [(pbuf.handle if e.buffer is None else e.buffer.handle, e.offset, e.size)
                         for e in entries]
                bg = self.backend.create_bind_group(kernel.layout, bound)
                self._bind_groups[key] = bg
            self.backend.dispatch(self._pass, kernel.pipeline, bg, groups)

    def copy(self, src: Buffer, dst: Buffer, size: int | None = None, src_offset: int = 0, dst_offset: int = 0) -> None:
        """Record a buffer-to-buffer copy (sizes and offsets multiples of 4)."""
        size = src.size - src_offset if size is None else size
        if self._rec is not None:
            self._rec.commands.append(("copy", src, src_offset, dst, dst_offset, size))
            return
        self._flush_ops()
        self._end_pass()
        self.backend.copy(self._enc(), src.handle, src_offset, dst.handle, dst_offset, size)

    def clear(self, buf: Buffer, offset: int = 0, size: int | None = None) -> None:
        """Record zero-filling of a buffer range."""
        size = buf.size - offset if size is None else size
        if self._rec is not None:
            self._rec.commands.append(("clear", buf, offset, size))
            return
        self._flush_ops()
        self._end_pass()
        self.backend.clear(self._enc(), buf.handle, offset, size)

    def read_later(self, buf: Buffer, offset: int = 0, size: int | None = None) -> Readback:
        """Record a copy of `buf[offset:offset+size]` out of the GPU; resolves after submit."""
        size = buf.size - offset if size is None else size
        self._not_recording("read_later")
        self._flush_ops()
        self._end_pass()
        staging = self.backend.acquire_staging(size)
        self.backend.copy(self._enc(), buf.handle, offset, staging, 0, size)
        rb = Readback(self, staging, size)
        self._pending_reads.append(rb)
        return rb

    async def read(self, buf: Buffer, offset: int = 0, size: int | None = None) -> bytes:
        """Submit what is recorded and return the bytes of `buf` (a full round trip)."""
        return await self.read_later(buf, offset, size).get()

    def submit(self) -> None:
        """Send everything recorded since the last submit as one command buffer. If that
        fails (a validation error), the error is raised, the recorded work is dropped and
        its pending reads raise it too: the next submit starts clean."""
        self._not_recording("submit")
        reads, self._pending_reads = self._pending_reads, []
        try:
            encoder = self._take_encoder()
            if encoder is not None:
                self.backend.submit(encoder)
        except BaseException as e:
            self._drop_recorded(reads, e)
            raise
        finally:
            self._params = bytearray()
            self._params_sent = 0
        for rb in reads:
            self.backend.after_submit(rb._staging)
        self._check_errors()

    def discard(self) -> None:
        """Encode what is recorded since the last submit, then drop it unsubmitted
        (benchmarks time the host's part of a step this way). Queued writes still land."""
        self._not_recording("discard")
        reads, self._pending_reads = self._pending_reads, []
        try:
            encoder = self._take_encoder()
            if encoder is not None:
                self.backend.discard(encoder)
        finally:
            self._drop_recorded(reads, GPUError("discarded unsubmitted (Device.discard)"))
            self._params = bytearray()
            self._params_sent = 0

    def _take_encoder(self):
        """Encode the queued dispatches, end the pass and hand over this submit's command
        encoder (None where nothing is recorded); the next command starts a new one."""
        self._flush_ops()
        self._end_pass()
        encoder, self._encoder = self._encoder, None
        return encoder

    def _drop_recorded(self, reads: list, error: BaseException) -> None:
        """Forget what is recorded and unsubmitted; its pending reads fail with `error`."""
        self._ops, self._pass, self._encoder = [], None, None
        for rb in reads:
            rb._error = error
            self.backend.release_staging(rb._staging)

    async def sync(self) -> None:
        """Submit and wait until the GPU has finished all of it."""
        self.submit()
        await self.backend.wait_idle()
        self._check_errors()

    # -- recorded programs ---------------------------------------------------------
    def _not_recording(self, what: str) -> None:
        if self._rec is not None:
            raise GPUError(f"{what} inside a recording: a program holds dispatches, copies and clears only")

    def record(self, fn) -> "Program":
        """Run `fn()` and capture the dispatches, copies and clears it records into a new
        Program (nothing of it goes into the current step: `replay` puts it there). Buffers
        `fn` makes are made (and may be written: e.g. a scratch it grows); writes to older
        buffers, reads and submits inside `fn` raise GPUError."""
        if self._rec is not None:
            raise GPUError("record: already recording (a program cannot record another)")
        rec = self._rec = _Recording()
        try:
            fn()
        finally:
            self._rec = None
        params = None
        if rec.params:
            size = len(rec.params)
            params = Buffer(self.backend.create_buffer(size, UNIFORM | COPY_DST, "program.params"), size,
                            "program.params")
            self.backend.write_buffer(params.handle, 0, memoryview(rec.params))
        commands, groups = [], {}
        for c in rec.commands:
            if c[0] == "dispatch":
                _, kernel, entries, dims = c
                bound = tuple((params if e.buffer is None else e.buffer, e.offset, e.size) for e in entries)
                key = (kernel.uid, tuple((b.uid, o, n) for b, o, n in bound))
                bg = groups.get(key)
                if bg is None:
                    bg = groups[key] = self.backend.create_bind_group(
                        kernel.layout, [(b.handle, o, n) for b, o, n in bound])
                commands.append(("dispatch", kernel.pipeline, bg, dims))
            elif c[0] == "copy":
                commands.append(("copy", c[1].handle, c[2], c[3].handle, c[4], c[5]))
            else:
                commands.append(("clear", c[1].handle, c[2], c[3]))
        n = sum(c[0] == "dispatch" for c in commands)
        return Program(self.backend.program(commands), n, len(commands), params, rec.commands)

    def replay(self, prog: "Program") -> None:
        """Encode a recorded program into the current step, in one backend call."""
        self._not_recording("replay")
        self._flush_ops()
        self._end_pass()
        self.backend.replay(self._enc(), prog.prepared)
        self.dispatches += prog.dispatches

    def _check_errors(self) -> None:
        err = self.backend.take_error()
        if err is not None:
            raise err

    def describe(self) -> str:
        """A one-line name for the adapter, e.g. 'google swiftshader (browser, WebGPU)'."""
        info = self.adapter_info
        name = info.get("description") or info.get("device") or " ".join(
            x for x in (info.get("vendor"), info.get("architecture")) if x) or "unknown adapter"
        return f"{name} ({self.name}, {info.get('backend') or '?'})"
