"""The trainer's per-micro-batch mode (the page's progress within a step, Stop at a
micro-batch boundary) and its adapter snapshot (the page's Export during a step)."""
from bitlora import demo, gpu
from bitlora.model import Model
from bitlora.train import Trainer

CFG = {"max_steps": 2, "micro_batch_size": 1, "grad_accum": 3, "cutoff_len": 64}


def test_on_micro_reports_each_micro_batch_and_changes_no_number(tmp_path):
    out = tmp_path / "out"    # with checkpoints: each step has landed already when one is written

    async def go():
        model = await Model.load(str(demo.MODEL_DIR))
        plain = Trainer(model, "demo", CFG)
        await plain.atrain()
        tr = Trainer(model, "demo", dict(CFG, save_every=1, out=str(out)))
        seen = []
        tr.on_micro, tr.keep_adapter = seen.append, True
        await tr.atrain()
        now = await tr.lora.read_adapter()
        snap = tr.lora.adapter_from(tr.adapter_snapshot[1])
        return plain.metrics, tr.metrics, seen, tr.adapter_snapshot[0], now, snap
    plain, micro, seen, snap_step, now, snap = gpu.run(go())
    assert [r["loss"] for r in plain] == [r["loss"] for r in micro]      # bitwise: same work, more submits
    assert [(m["step"], m["micro"], m["micros"]) for m in seen] == [(s, j, 3) for s in (1, 2) for j in range(4)]
    assert seen[0]["tokens"] == 0 and seen[3]["tokens"] == seen[3]["step_tokens"] > 0
    assert snap_step == 2 and all(list(now[k][1]) == list(snap[k][1]) for k in now)


def test_stop_inside_a_step_ends_at_the_micro_batch_boundary():
    async def go():
        model = await Model.load(str(demo.MODEL_DIR))
        tr = Trainer(model, "demo", dict(CFG, max_steps=3))
        tr.keep_adapter = True

        def micro(m):
            if (m["step"], m["micro"]) == (2, 1):
                tr.stop()
        tr.on_micro = micro
        await tr.atrain()
        return tr.step, [r["step"] for r in tr.metrics], tr.adapter_snapshot[0]
    step, steps, snap_step = gpu.run(go())
    assert step == 1 and steps == [1] and snap_step == 1    # step 2 was dropped after its micro-batch 1


def test_a_new_run_after_a_stop_inside_a_step():
    """The page's Stop inside a step, then Train again (the old trainer closed, as the
    worker does): the dropped step's clears do not linger in the next submit, where they
    would name the closed trainer's destroyed gradients (natively an abort), and the
    new run trains as a fresh one would."""
    async def go():
        model = await Model.load(str(demo.MODEL_DIR))
        tr = Trainer(model, "demo", dict(CFG, max_steps=3))
        tr.on_micro = lambda m: (m["step"], m["micro"]) == (2, 1) and tr.stop()
        await tr.atrain()
        tr.close()
        again = Trainer(model, "demo", dict(CFG, max_steps=1, lora_r=4))
        await again.atrain()
        again.close()
        fresh = Trainer(model, "demo", dict(CFG, max_steps=1, lora_r=4))
        await fresh.atrain()
        return tr.step, again.metrics, fresh.metrics
    stopped_at, again, fresh = gpu.run(go())
    assert stopped_at == 1
    assert [r["loss"] for r in again] == [r["loss"] for r in fresh], (again, fresh)
