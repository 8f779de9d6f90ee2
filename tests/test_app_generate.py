"""The page's Generate, in headless Chromium with real WebGPU: the answers stream in as
their tokens come (base, then adapted, side by side) with tokens/s, and Stop ends the
generation at once; the page stays usable afterwards."""
import pytest

from test_app import _fill
from test_app_faults import load_demo, messages, open_app

pytestmark = pytest.mark.browser   # headless Chromium: skipped by -m "not browser"


def test_generate_streams_and_stops(browser_session):
    page = open_app(browser_session)
    try:
        load_demo(page)
        generate, stop = page.get_by_role("button", name="Generate"), page.get_by_role("button", name="Stop generating")
        assert stop.count() == 0                                    # hidden until a generation runs
        # a long answer: 1024 tokens at a temperature that makes EOS unlikely (seed 0: the same tokens every run)
        page.locator("#max-new-tokens").fill("1024")
        page.locator("#temperature").fill("100")
        generate.click()
        page.locator("#gen-base-speed", has_text="tokens/s").wait_for(timeout=120_000)
        assert generate.is_disabled() and page.get_by_role("button", name="Train").is_disabled()
        streamed = page.locator("#gen-base").text_content()
        assert streamed and streamed != "…"
        stop.click()
        page.get_by_role("status").filter(has_text="Generation stopped").wait_for(timeout=60_000)
        done = messages(page, "generated")[-1]
        tokens = [m["tokens"] for m in messages(page, "gen-token") if m["which"] == "base"]
        assert done["stopped"] and 0 < done["base_tokens"] < 1024, done
        assert tokens == sorted(tokens) and tokens[0] < done["base_tokens"], tokens     # shown as they came
        assert done["base_tokens_per_s"] > 0
        assert generate.is_enabled() and stop.count() == 0

        # train one step: then both answers stream, side by side, each with its tokens/s
        _fill(page, max_steps=1, micro_batch_size=1, grad_accum=1, cutoff_len=64, warmup_steps=0, save_every=0)
        page.get_by_role("button", name="Train").click()
        page.get_by_role("status").filter(has_text="finished").wait_for(timeout=300_000)
        page.locator("#max-new-tokens").fill("24")
        page.locator("#temperature").fill("0")
        generate.click()
        page.get_by_role("status").filter(has_text="Generated").wait_for(timeout=120_000)
        done = messages(page, "generated")[-1]
        assert not done["stopped"] and done["adapted"] is not None and done["adapted_tokens"] >= 1, done
        assert {m["which"] for m in messages(page, "gen-token")} >= {"base", "adapted"}
        assert page.locator("#gen-adapted").text_content() == done["adapted"]
        for which in ("base", "adapted"):
            assert "tokens" in page.locator(f"#gen-{which}-speed").text_content()
    finally:
        page.close()
