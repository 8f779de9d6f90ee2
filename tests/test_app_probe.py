"""The page's faults an outside probe found (docs/RELIABILITY.md, "Inputs from an outside
probe"), in headless Chromium with real WebGPU, real Pyodide and real file inputs: a
finished run resumed after a reload exports; a failure nobody foresaw in starting a run
leaves the page usable; a reload before a run's first interval checkpoint keeps its
steps, and the resume offer names what it resumes; the model-source radios only switch
the source (no file chooser from the keyboard); Generate past the model's context says
so; a LoRA rank the tab cannot checkpoint is refused before it starts.

Test hooks (?test-hooks) only inject a fault or hold training at a step
(test_app.hold), as in tests/test_app_faults.py."""
import json

import pytest

from test_app import _fill, held, hold, pyrun, release
from test_app_faults import SETTINGS, load_demo, messages, offered_step, open_app, reload, train_demo_steps, wait_for

pytestmark = pytest.mark.browser   # headless Chromium: skipped by -m "not browser"


def test_a_finished_run_resumed_after_a_reload_can_be_exported(browser_session):
    """A 2-step run finishes (its last checkpoint is step 2); after a reload the offer
    names step 2; resuming has nothing left to train, and Export adapter works
    (has_adapter was false: the resumed run took no new step, so it had no snapshot)."""
    page = open_app(browser_session)
    try:
        train_demo_steps(page, 2)
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


def _radio_state(page, group):
    """(the checked radio's value, the focused element's value or id) of a source group."""
    return page.evaluate("(g) => [document.querySelector(`input[name=${g}]:checked`).value, "
                         "document.activeElement.value || document.activeElement.id]", group)


def test_arrowing_through_the_source_radios_opens_no_file_chooser(browser_session, tmp_path):
    """Arrow keys through the model and dataset source radios check each in turn and open
    nothing (the file and folder radios opened their choosers, the URL radio took the
    focus away); the status says what to do. The chooser opens when the file input
    itself is activated, and the file chosen there loads."""
    from fixtures.make_tiny import TINY, make_gguf, make_hf
    gguf = make_gguf(make_hf(tmp_path / "hf", "online_f32", dims=dict(TINY, max_position_embeddings=256), seed=1),
                     tmp_path / "tiny.gguf", "tq2_0")
    page = open_app(browser_session)
    choosers = []
    page.on("filechooser", lambda fc: choosers.append(fc))
    try:
        page.get_by_role("status").filter(has_text="press Train").wait_for(timeout=60_000)
        for group, first, order in (("model-source", "Built-in demo model", ["file", "folder", "url"]),
                                    ("data-source", "Built-in demo dataset", ["file", "url"])):
            page.get_by_label(first).focus()
            for value in order:
                page.keyboard.press("ArrowDown")
                page.wait_for_timeout(400)          # a chooser would have been asked for by now
                assert choosers == [], (group, value)
                assert _radio_state(page, group) == [value, value], (group, value, _radio_state(page, group))
            print(f"\n{group}: {page.get_by_role('status').text_content()}")
        assert "Dataset URL" in page.get_by_role("status").text_content()
        page.get_by_label("Built-in demo model").focus()
        page.keyboard.press("ArrowDown")                                 # to "file", then to its input
        assert "Model file" in page.get_by_role("status").text_content()
        page.keyboard.press("Tab")
        assert page.evaluate("() => document.activeElement.id") == "model-file"
        with page.expect_file_chooser() as chooser:
            page.keyboard.press("Space")
        chooser.value.set_files(str(gguf))
        page.get_by_role("status").filter(has_text="Model loaded: tiny.gguf").wait_for(timeout=120_000)
        assert _radio_state(page, "model-source")[0] == "file"
    finally:
        page.close()


def test_a_reload_before_the_first_interval_checkpoint_keeps_the_steps_and_the_offer_names_the_run(
        browser_session, tmp_path):
    """An older run (the demo dataset, 2 steps) leaves its checkpoint; a new run on a
    dataset file, checkpoints every 10 steps, is reloaded while step 3 is held. Before,
    nothing of it was saved yet: the banner offered the older run's step 2, naming neither
    its model nor its dataset. Now the first step is saved at once, and the offer names
    the model, the dataset, the step of steps and when; resuming goes on from step 1."""
    data = tmp_path / "mine.json"
    data.write_text(json.dumps([{"instruction": f"Add {a} and {b}.", "input": "", "output": str(a + b)}
                                for a, b in [(1, 2), (3, 4), (10, 7), (2, 9), (5, 5), (12, 30)]]))
    page = open_app(browser_session)
    try:
        train_demo_steps(page, 2)
        page.get_by_label("Dataset file").set_input_files(str(data))
        page.get_by_role("status").filter(has_text="Dataset loaded").wait_for(timeout=60_000)
        _fill(page, **dict(SETTINGS, max_steps=6, save_every=10))
        page.evaluate("() => { bitloraTest.messages.length = 0; }")
        hold(page, 3)
        page.get_by_role("button", name="Train", exact=True).click()
        held(page)
        saved = wait_for(page, "checkpoint", lambda m: m.get("saved"), timeout_s=60)
        print(f"\nfirst checkpoint: step {saved['step']} in {saved['seconds']:.2f} s")
        before = {m["step"]: m["loss"] for m in messages(page, "step")}
        assert sorted(before) == [1, 2], before
        reload(page)
        step = offered_step(page)
        text = page.locator("#banner-text").text_content()
        print(text)
        assert step == 1, (step, text)
        assert "bitlora demo model on mine.json, step 1 of 6, saved " in text and "just now" in text, text
        page.get_by_role("button", name="Resume training").click()
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
        after = {m["step"]: m["loss"] for m in messages(page, "step")}
        assert sorted(after) == [2, 3, 4, 5, 6] and after[2] == before[2], (before, after)   # step 2 recomputed
        assert page.locator("#chart-loss").get_attribute("data-points") == "6"
    finally:
        page.close()


def _words_for_prompt(tokens):
    """An instruction of "word word …" whose Alpaca prompt is `tokens` tokens for the demo
    model's tokenizer (read natively; the page's worker encodes the same way)."""
    from bitlora.data import format_prompt
    from bitlora.model import load_model
    tok = load_model("demo").tokenizer
    n = lambda k: len(tok.encode(format_prompt({"instruction": "word " * k, "input": "", "output": ""}),  # noqa: E731
                                 add_special_tokens=True))
    k = next(k for k in range(tokens) if n(k) >= tokens)
    assert n(k) == tokens, (k, n(k))
    return "word " * k


def test_generate_past_the_models_context_says_so(browser_session):
    """Generate with a 500-token prompt and 48 new tokens on the demo model (context 512):
    before, all 48 came, from positions the model never saw, with no word said; now 12
    come and the status says why. A prompt of 600 tokens says how long one may be, and
    Generate works again."""
    near, over = _words_for_prompt(500), "word " * 600
    page = open_app(browser_session)
    try:
        load_demo(page)
        page.locator("#prompt").fill(near)
        page.locator("#prompt-input").fill("")
        page.locator("#max-new-tokens").fill("48")
        page.locator("#temperature").fill("100")       # EOS unlikely: every token that fits comes
        generate = page.get_by_role("button", name="Generate")
        generate.click()
        status = page.get_by_role("status").filter(has_text="Generated")
        status.wait_for(timeout=120_000)
        print(f"\n{status.text_content()}")
        done = messages(page, "generated")[-1]
        assert done["base_tokens"] == 12, done
        assert status.text_content() == ("Generated, but the prompt's 500 tokens + 48 new tokens go past the model's "
                                         "context of 512 tokens: generating at most 12 new tokens.")
        page.locator("#prompt").fill(over)
        generate.click()
        status = page.get_by_role("status").filter(has_text="shorten the prompt")
        status.wait_for(timeout=60_000)
        print(status.text_content())
        assert "generate: the prompt is" in status.text_content() and "context (max_position_embeddings) is 512" \
            in status.text_content() and "ValueError" not in status.text_content()
        assert page.locator("#gen-base").text_content() == ""
        page.wait_for_function("() => !document.getElementById('generate').disabled", timeout=10_000)
        page.locator("#prompt").fill("Say hi.")
        generate.click()
        page.get_by_role("status").filter(has_text="Generated: change").wait_for(timeout=120_000)
    finally:
        page.close()


def test_a_rank_whose_checkpoint_the_tab_cannot_hold_is_refused_with_what_fits(browser_session):
    """LoRA rank 100000 on the demo model (micro-batch 1, cutoff 64) fits the 4 GB GPU
    budget (about 3 GB), but its checkpoint needs some 10 GB of the tab's Python memory
    (wasm32: 4 GiB at most), where it ran out. Now the estimate says so and Fit to device
    proposes a rank that fits; Train does not start it."""
    page = open_app(browser_session)
    try:
        load_demo(page)
        _fill(page, max_steps=1, lora_r=100000, lora_alpha=16, **{k: v for k, v in SETTINGS.items()})
        estimate = page.locator("#memory-estimate", has_text="Python memory")
        estimate.wait_for(timeout=30_000)
        text = estimate.text_content()
        print(f"\n{text}")
        assert "Too big: its checkpoints need about" in text and "over the 2048 MB it can use" in text, text
        fit = page.get_by_role("button", name="Fit to device")
        assert fit.is_visible()
        page.get_by_role("button", name="Train", exact=True).click()
        status = page.get_by_role("status").filter(has_text="not started")
        status.wait_for(timeout=60_000)
        assert "Python memory" in status.text_content()
        assert not [m for m in messages(page, "train-state") if m.get("state") == "running"]
        page.wait_for_function("() => !document.getElementById('train').disabled", timeout=10_000)
        fit.click()
        page.locator("#memory-estimate", has_text="Training with these settings").filter(
            has_not_text="Too big").wait_for(timeout=30_000)
        r = int(page.locator("#settings [name=lora_r]").input_value())
        print(f"fitted: {page.locator('#memory-estimate').text_content()} (lora_r {r})")
        assert 1 <= r < 100000
    finally:
        page.close()
