"""Portable cases for the foundation: the hello kernel and WGSL error reporting."""
import array

from bitlora import gpu
from bitlora.ops import hello


async def case_adapter(dev):
    """The adapter is real: its description names hardware or SwiftShader/lavapipe."""
    return {"backend": dev.name, "info": dev.adapter_info, "limits": dev.limits}


async def case_axpy(dev, n=1000, a=2.0):
    x = dev.buffer(4 * n, "x", data=array.array("f", [float(i % 97) for i in range(n)]))
    y = dev.buffer(4 * n, "y", data=array.array("f", [1.0] * n))
    await dev.prepare(hello.kernel_specs())
    hello.axpy(dev, a, x, y, n)
    hello.axpy(dev, 0.5, x, y, n)  # a second dispatch in the same submit, other params
    out = array.array("f")
    out.frombytes(await dev.read(y))
    return list(out)


async def case_syntax_error(dev):
    try:
        await dev.compile("@compute @workgroup_size(1) fn main( {", "main", label="broken.wgsl")
    except gpu.GPUError as e:
        return str(e)
    raise AssertionError("a WGSL syntax error did not raise")


async def case_compile_once(dev):
    """Asking for the same kernel again does not compile again."""
    await dev.kernel("hello.wgsl", "axpy")
    before = dev.pipelines_compiled
    for _ in range(3):
        await dev.kernel("hello.wgsl", "axpy")
    return dev.pipelines_compiled - before


async def case_prepare_once(dev):
    """prepare compiles each file's module once and each pipeline once; a kernel nobody
    prepared raises GPUError naming it."""
    specs = [("rope.wgsl", "rope_forward"), ("rope.wgsl", "rope_backward")]
    await dev.prepare(specs)
    modules, pipelines = dev.modules_compiled, dev.pipelines_compiled
    again = await dev.prepare(specs + [("rope.wgsl", "rope_forward", None)])
    try:
        dev.prepared("rope.wgsl", "no_such_entry")
        message = None
    except gpu.GPUError as e:
        message = str(e)
    return {"again": again, "modules": dev.modules_compiled - modules,
            "pipelines": dev.pipelines_compiled - pipelines, "message": message}


async def case_fresh_kernels_bind_their_own_groups(dev, rounds=24):
    """Kernels compiled, used and dropped one after another (as benchmarks do) each get
    bind groups made for their own pipeline, even where a new Kernel object lands at a
    freed one's address: every round's dispatch writes its own round number."""
    src = ("@group(0) @binding(0) var<storage, read_write> out: array<u32>;\n"
           "override VALUE: u32 = 0u;\n"
           "@compute @workgroup_size(1) fn put() { out[0] = VALUE; }\n")
    out = dev.buffer(4, "out")
    got = []
    for i in range(1, rounds + 1):
        kernel = await dev.compile(src, "put", constants={"VALUE": i})
        dev.dispatch(kernel, [out], groups=1)
        got.append(array.array("I", await dev.read(out))[0])
        del kernel
    return got


async def case_failed_submit_starts_clean(dev):
    """A submit that fails validation (a copy past the end of its destination) raises
    GPUError (natively; the read that waited on it too), and the device is not left
    holding the broken command buffer: the next work records, submits and reads normally."""
    src, small = dev.buffer(32, "src", data=array.array("f", range(8))), dev.buffer(16, "small")
    pending = dev.read_later(src)
    dev.copy(src, small)            # 32 bytes into 16: invalid
    errors = []
    try:
        dev.submit()
    except gpu.GPUError as e:
        errors.append(str(e))
    try:
        await pending.get()
    except gpu.GPUError as e:
        errors.append(str(e))
    y = dev.buffer(4 * 8, "y", data=array.array("f", [1.0] * 8))
    await dev.prepare(hello.kernel_specs())
    hello.axpy(dev, 2.0, src, y, 8)
    out = array.array("f")
    out.frombytes(await dev.read(y))
    return {"errors": errors, "after": list(out)}


async def case_destroy_submits_what_binds_it(dev):
    """Destroying a buffer that recorded, unsubmitted work still binds submits that work
    first (a submit naming a destroyed buffer fails; natively it aborts): the work runs,
    and the device goes on."""
    x = dev.buffer(16, "x", data=array.array("f", [1.0, 2.0, 3.0, 4.0]))
    y = dev.buffer(16, "y", data=array.array("f", [0.0] * 4))
    await dev.prepare(hello.kernel_specs())
    hello.axpy(dev, 3.0, x, y, 4)   # recorded, not submitted
    dev.destroy(x)
    out = array.array("f")
    out.frombytes(await dev.read(y))
    return list(out)
