"""Portable cases for recorded programs (gpu/device.py Device.record / replay, Programs):
the same dispatches recorded anew and replayed give the same bits, what a recording may
not do raises, and the Trainer's steps are bitwise the same with and without replay.
Standard library + bitlora only (they run natively and in Pyodide)."""
import array
import struct

from bitlora import gpu
from bitlora.model import Model
from bitlora.ops import hello
from bitlora.train import Trainer


def _f32(dev, vals, label):
    return dev.buffer(4 * len(vals), label, data=array.array("f", vals))


async def _floats(dev, buf):
    out = array.array("f")
    out.frombytes(await dev.read(buf))
    return list(out)


async def case_record_replay(dev, n=1000, steps=3, python_replay=False):
    """y = 2x + 0.5x (two dispatches), a copy and a clear, `steps` times: recorded every
    time, and recorded once then replayed with x rewritten before each step. Returns both
    runs' y per step, dispatch counts and what the refused operations raised.
    `python_replay`: in the browser, replay from Python as where static/replay.js is not
    loaded (a JupyterLite kernel)."""
    saved = getattr(dev.backend, "replay_js", None)
    if python_replay:
        dev.backend.replay_js = None
    try:
        return await _record_replay(dev, n, steps)
    finally:
        if python_replay:
            dev.backend.replay_js = saved


async def _record_replay(dev, n, steps):
    await dev.prepare(hello.kernel_specs())
    x, y, z, keep = (dev.buffer(4 * n, name) for name in ("x", "y", "z", "keep"))

    def step_ops():
        hello.axpy(dev, 2.0, x, y, n)
        dev.copy(y, keep)        # a copy between passes
        dev.clear(z)
        hello.axpy(dev, 0.5, x, z, n)
        hello.axpy(dev, 1.0, z, y, n)

    out = {}
    for mode in ("record", "replay"):
        programs, got, counts = gpu.Programs(dev), [], []
        dev.write(y, bytes(4 * n))
        for s in range(steps):
            dev.write(x, array.array("f", [(i % 7) * 0.25 + s for i in range(n)]))
            d0 = dev.dispatches
            if mode == "record":
                step_ops()
            else:
                programs.run(("axpy", n), step_ops)
            counts.append(dev.dispatches - d0)
            got.append(await _floats(dev, y))
        out[mode] = {"y": got, "dispatches": counts, "recorded": programs.recorded,
                     "keep": await _floats(dev, keep)}

    refused = {}
    for what, fn in (("write", lambda: dev.write(x, bytes(4))),
                     ("read_later", lambda: dev.read_later(x)),
                     ("submit", dev.submit)):
        try:
            dev.record(fn)
            refused[what] = None
        except gpu.GPUError as e:
            refused[what] = str(e)
    made = []   # a buffer made inside the recording may be written there (e.g. a grown scratch)
    prog = dev.record(lambda: made.append(dev.buffer(16, "made", data=bytes(16))))
    how = prog.prepared[0]   # the browser's: "js" (static/replay.js) or "python" (no such module)
    try:   # a failed recording leaves the device as it was
        dev.record(lambda: (hello.axpy(dev, 1.0, x, y, n), 1 / 0))
    except ZeroDivisionError:
        pass
    limit, dev.memory_limit = dev.memory_limit, dev.allocated + 1024
    try:   # ... out of memory inside it too (a new shape's scratch that does not fit)
        dev.record(lambda: (hello.axpy(dev, 1.0, x, y, n), dev.buffer(4096, "too big")))
        oom = None
    except gpu.OutOfMemory as e:
        oom = str(e)
    finally:
        dev.memory_limit = limit
    hello.axpy(dev, 1.0, x, y, n)
    after = await _floats(dev, y)
    out.update(refused=refused, made=len(made), oom=oom, how=how if isinstance(how, str) else dev.name, after_failure=after[:4], expect_after=[
        a + b for a, b in zip(out["replay"]["y"][-1][:4], (await _floats(dev, x))[:4])])
    for b in (x, y, z, keep, *made):
        dev.destroy(b)
    return out


async def case_trainer_replay(dev, config, steps=4):
    """The demo model trained from the same start with and without replayed steps:
    per-step loss, gradient norm and the final adapter's bytes (as hex), plus how many
    programs the replaying trainer recorded and how many distinct micro-batch shapes
    (B, T, micro) its data had."""
    model = await Model.load("demo", device=dev)
    out = {}
    for replay in (False, True):
        tr = Trainer(model, "demo", dict(config, max_steps=steps))
        tr.replay = replay
        await tr.setup()
        shapes = set()
        for step in tr.dataset.steps_for(tr.config):
            if step.index >= steps:
                break
            shapes |= {(mb.B, mb.T, j) for j, mb in enumerate(step.micro_batches)}
        await tr.atrain()
        raw = await dev.read(tr.lora.arena.params)
        out["replay" if replay else "record"] = {
            "loss": [struct.pack("<d", m["loss"]).hex() for m in tr.metrics],
            "grad_norm": [struct.pack("<d", m["grad_norm"]).hex() for m in tr.metrics],
            "adapter": raw.hex(), "recorded": tr.programs.recorded, "shapes": len(shapes),
            "programs": len(tr.programs)}
        tr.close()
    return out
