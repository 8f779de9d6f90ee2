"""The page's faults an outside probe found (docs/RELIABILITY.md, "Inputs from an outside
probe"), in headless Chromium with real WebGPU, real Pyodide and real file inputs: a
finished run resumed after a reload exports; a failure nobody foresaw in starting a run
leaves the page usable; a reload before a run's first interval checkpoint keeps its
steps, and the resume offer names what it resumes; the model-source radios only switch
the source (no file chooser from the keyboard); Generate past the model's context says
so; a LoRA rank the tab cannot checkpoint is refused before it starts.

Test hooks (?test-hooks) only inject a fault or hold training at a step
(test_app.hold), as in tests/test_app_faults.py."""
import pytest

from test_app import _fill, held, hold, pyrun, release
from test_app_faults import SETTINGS, load_demo, messages, offered_step, open_app, reload, wait_for

pytestmark = pytest.mark.browser   # headless Chromium: skipped by -m "not browser"


def test_a_finished_run_resumed_after_a_reload_can_be_exported(browser_session):
    """A 2-step run finishes (its last checkpoint is step 2); after a reload the offer
    names step 2; resuming has nothing left to train, and Export adapter works
    (has_adapter was false: the resumed run took no new step, so it had no snapshot)."""
    page = open_app(browser_session)
    try:
        load_demo(page)
        _fill(page, max_steps=2, **SETTINGS)
        page.get_by_role("button", name="Train", exact=True).click()
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
        reload(page)
        assert offered_step(page) == 2
        page.get_by_role("button", name="Resume training").click()
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
        export = page.get_by_role("button", name="Export adapter")
        assert export.is_enabled()
        with page.expect_download() as first:
            export.click()
        assert first.value.suggested_filename in ("adapter_config.json", "adapter_model.safetensors")
        assert wait_for(page, "export", lambda m: True)["step"] == 2
    finally:
        page.close()


# Any failure in a run's set-up that nobody foresaw (here a RuntimeError from the Trainer's
# constructor, put there by the test) must not leave the page stuck "starting".
BREAK_TRAINER = """
from bitlora import train
train.Trainer._real_init = train.Trainer.__init__
def broken(self, *a, **k):
    raise RuntimeError("test: the trainer broke")
train.Trainer.__init__ = broken
"broken"
"""
MEND_TRAINER = "from bitlora import train\ntrain.Trainer.__init__ = train.Trainer._real_init\n'mended'"


def test_an_unforeseen_failure_starting_a_run_is_a_message_and_train_works_again(browser_session):
    page = open_app(browser_session)
    try:
        load_demo(page)
        _fill(page, max_steps=1, **SETTINGS)
        assert pyrun(page, BREAK_TRAINER) == "broken"
        train = page.get_by_role("button", name="Train", exact=True)
        train.click()
        status = page.get_by_role("status").filter(has_text="the trainer broke")
        status.wait_for(timeout=60_000)
        print(f"\n{status.text_content()}")
        page.wait_for_function("() => !document.getElementById('train').disabled", timeout=10_000)
        assert messages(page, "train-state")[-1]["state"] == "idle"        # not stuck "starting"
        assert "not started" in status.text_content() and "RuntimeError" in status.text_content()
        assert pyrun(page, MEND_TRAINER) == "mended"
        train.click()
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
    finally:
        page.close()
