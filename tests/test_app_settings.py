"""The page's settings in headless Chromium: every field survives a reload (the
training settings, the hub URL, the memory budget, the URLs, the prompt and the
generation options), and Fit to device proposes a smaller LoRA adapter when a
micro-batch of 1 at the shortest sensible cutoff with gradient checkpointing is still
too big for the memory budget, or says that nothing fits. Screenshots land in
test-artifacts/ (git-ignored)."""
import pytest

from test_app import ARTIFACTS, _fill, pyrun
from test_app_ux import FAST, open_page

pytestmark = pytest.mark.browser   # headless Chromium: skipped by -m "not browser"


def shot(page, name):
    page.screenshot(path=str(ARTIFACTS / f"settings-{name}.png"), full_page=False)


def setting(page, name):
    return page.locator(f"#settings [name={name}]").input_value()


def targets(page):
    return page.evaluate("() => [...document.querySelectorAll('#settings input[name=target]:checked')]"
                         ".map((el) => el.value)")


# Fields outside the settings form: id -> a value the page would not start with.
FIELDS = {"hub-url": "http://127.0.0.1:9/mirror", "memory-budget": "1234", "model-url": "org/some-model@v2",
          "data-url": "http://127.0.0.1:9/data.json", "prompt": "Say hello.", "prompt-input": "to me",
          "max-new-tokens": "7", "temperature": "0.5"}


def test_every_setting_survives_a_reload_and_is_used(browser_session):
    """Change every field, reload: the same values come back (typed without leaving the
    field too), and they are the ones used: the memory estimate names the budget, a
    model repo id goes to the hub URL set."""
    page = open_page(browser_session)
    try:
        page.locator("summary", has_text="Hub and cache").click()
        for field, value in FIELDS.items():
            page.locator(f"#{field}").fill(value)                   # typed: input events only
        _fill(page, lr=0.0007, lora_r=4, lora_alpha=9, cutoff_len=77, max_steps=5)
        page.locator("#settings [name=lr_scheduler]").select_option("cosine")
        page.locator("#settings [name=gradient_checkpointing]").check()
        page.locator("#settings [name=shuffle]").uncheck()
        page.locator("#settings input[name=target][value=q_proj]").uncheck()
        page.locator("#settings input[name=target][value=down_proj]").check()
        page.locator("#settings [name=seed]").fill("31")             # typed, never left
        before = {f: page.locator(f"#{f}").input_value() for f in FIELDS}
        form = page.evaluate("() => Object.fromEntries([...document.querySelectorAll('#settings [name]')]"
                             ".filter((el) => el.name !== 'target')"
                             ".map((el) => [el.name, el.type === 'checkbox' ? el.checked : el.value]))")
        page.reload()
        page.get_by_role("status").filter(has_text="press Train").wait_for(timeout=120_000)
        after = {f: page.locator(f"#{f}").input_value() for f in FIELDS}
        assert after == before == FIELDS, (before, after)
        again = page.evaluate("() => Object.fromEntries([...document.querySelectorAll('#settings [name]')]"
                              ".filter((el) => el.name !== 'target')"
                              ".map((el) => [el.name, el.type === 'checkbox' ? el.checked : el.value]))")
        assert again == form, (form, again)
        assert (form["lr"], form["seed"], form["lr_scheduler"], form["shuffle"]) == ("0.0007", "31", "cosine", False)
        assert targets(page) == ["v_proj", "down_proj"]
        shot(page, "after-reload")

        page.get_by_role("button", name="Load demo model").click()
        page.locator("#memory-estimate", has_text="your budget is 1234 MB").wait_for(timeout=120_000)
        page.get_by_role("button", name="Load URL: model", exact=True).click()   # org/some-model@v2 on the mirror
        failed = page.get_by_role("status").filter(has_text="model: ")
        failed.wait_for(timeout=60_000)
        assert "http://127.0.0.1:9/mirror/org/some-model/resolve/v2/config.json" in failed.text_content()
    finally:
        page.close()


def too_big(page, budget_mb, words):
    """Set the budget; wait for the estimate that says `words`; return its text."""
    page.get_by_label("GPU memory budget (MB)").fill(str(budget_mb))
    page.get_by_label("GPU memory budget (MB)").dispatch_event("change")
    est = page.locator("#memory-estimate.warning", has_text=words)
    est.wait_for(timeout=30_000)
    text = est.text_content()
    assert "Too big: " in text and f"over your budget of {budget_mb:.2f} MB" in text, text
    return text


def test_fit_proposes_a_smaller_adapter_then_says_when_nothing_fits(browser_session):
    """The demo model and data with a 2.8 MB budget (the weights 0.95 MB on a CPU
    adapter, the forward's transposed copy included): micro-batch 1, the shortest cutoff
    that keeps every prompt (63) and gradient checkpointing need 2.91 MB, so the
    proposal lowers the LoRA rank (alpha with it); with all seven target modules it
    also drops the MLP's. One click applies it and Train trains; at 1 MB nothing fits,
    the page says so and offers nothing."""
    page = open_page(browser_session)
    try:
        page.get_by_role("button", name="Load demo model").click()
        page.get_by_role("status").filter(has_text="Model loaded").wait_for(timeout=120_000)
        page.get_by_role("button", name="Load demo dataset").click()       # the estimate uses its prompts
        page.get_by_role("status").filter(has_text="Dataset loaded").wait_for(timeout=60_000)
        page.get_by_role("button", name="Reset to defaults").click()
        fit = page.get_by_role("button", name="Fit to device")

        text = too_big(page, 2.8, "LoRA rank 4")
        print("\n" + text)
        assert "LoRA alpha 8" in text and "a smaller adapter" in text, text
        shot(page, "smaller-rank-proposed")
        fit.click()
        page.locator("#memory-estimate:not(.warning)").wait_for(timeout=30_000)
        assert (setting(page, "lora_r"), setting(page, "lora_alpha"), setting(page, "micro_batch_size"),
                setting(page, "grad_accum")) == ("4", "8", "1", "16")
        assert int(setting(page, "cutoff_len")) >= 63                     # every prompt kept
        assert page.locator("#settings [name=gradient_checkpointing]").is_checked()
        assert targets(page) == ["q_proj", "v_proj"] and fit.is_hidden()
        print(page.locator("#memory-estimate").text_content())
        _fill(page, max_steps=1, lr=0.003, warmup_steps=0, save_every=0)
        page.get_by_role("button", name="Train").click()
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)   # it fits: it trains
        assert pyrun(page, "from bitlora import webapp\nstr(webapp.S.trainer.lora.R)") == "4"

        page.get_by_role("button", name="Reset to defaults").click()
        for el in page.locator("#settings input[name=target]").all():
            el.check()
        page.locator("#settings [name=lr]").dispatch_event("change")
        text = too_big(page, 2.8, "target modules q_proj k_proj v_proj o_proj")
        print(text)
        fit.click()
        page.locator("#memory-estimate:not(.warning)").wait_for(timeout=30_000)
        assert targets(page) == ["q_proj", "k_proj", "v_proj", "o_proj"]
        shot(page, "fewer-targets-fitted")

        text = too_big(page, 1, "Nothing fits")
        print(text)
        assert "LoRA rank 1 on q_proj" in text and "the model's weights alone 0.95 MB" in text, text
        assert fit.is_hidden()
        shot(page, "nothing-fits")
        page.get_by_role("button", name="Train").click()
        page.get_by_role("status").filter(has_text="not started").wait_for(timeout=60_000)
        assert "Nothing fits" in page.get_by_role("status").text_content()
    finally:
        page.close()


def test_a_cleared_number_field_means_its_default(browser_session):
    """Clear Seed and Max steps and press Train: the empty fields are the defaults (JS
    null reached Python as pyodide's jsnull and was refused: 'expected an integer')."""
    from test_app_ux import FAST
    page = open_page(browser_session)
    try:
        _fill(page, epochs=1, **FAST)
        for name in ("seed", "max_steps"):
            page.locator(f"#settings [name={name}]").fill("")
        page.locator("#settings [name=max_steps]").dispatch_event("change")
        page.get_by_role("button", name="Train").click()
        status = page.get_by_role("status")
        status.filter(has_text="finished").wait_for(timeout=300_000)
        assert "expected" not in status.text_content()
        assert "Settings:" not in page.locator("#memory-estimate").text_content()
    finally:
        page.close()
