"""Short soaks (bench/soak.py; the long ones' figures are in docs/RELIABILITY.md): the
demo on 20 records, natively (150 optimizer steps) and through the web page in
headless Chromium (60 steps). After the first epoch the GPU buffer bytes and count,
the bind-group cache and the Python heap (the metrics history left out) grow by less
than 2 %; in the page also the worker's wasm memory and its JS heap."""
import pytest

from bitlora.bench.soak import browser_soak, soak


def report(res):
    first, last = res["rows"][0], res["rows"][-1]
    print(f"\n{res['seconds']:.0f} s; after step {res['warmup']}: "
          + ", ".join(f"{m} {100 * g:+.2f} %" for m, g in res["growth"].items())
          + f"; heap {first['heap']} -> {last['heap']} B, GPU {last['gpu_bytes']} B in {last['gpu_buffers']} buffers")


def test_short_soak_is_flat():
    res = soak(150, records=20, every=5)
    report(res)
    assert all(g < 0.02 for g in res["growth"].values()), res["growth"]


@pytest.mark.browser
def test_short_browser_soak_is_flat(browser_session):
    """Every step sampled. The page's own heap (main thread) is reported, not bounded:
    V8 keeps compiling the page's code for a few hundred steps (heap snapshots: most
    of its growth is compiled code) and the charts keep one point per step."""
    res = browser_soak(60, records=20, every=1, session=browser_session)
    report(res)
    worker = {m: g for m, g in res["growth"].items() if m != "page_heap"}
    assert all(g < 0.02 for g in worker.values()), worker
    assert res["rows"][-1]["step"] == 60


def test_a_replaced_model_gives_its_gpu_memory_back():
    """The page closes a model when another replaces it: every buffer of the model, its
    decoding scratch and cache, and the bind groups using them are freed."""
    from bitlora import gpu
    from bitlora.model import load_model
    dev = gpu.run(gpu.get_device())
    first = load_model("demo", device=dev)   # the device's own scratch (split-K, matvec spares) is made once and kept
    first.generate("Hello", max_new_tokens=4)
    first.close()
    before, live, groups = dev.allocated, dev.live_buffers, len(dev._bind_groups)
    model = load_model("demo", device=dev)
    model.generate("Hello", max_new_tokens=4)
    assert dev.allocated > before + model.weight_bytes and len(dev._bind_groups) > groups
    model.close()
    assert (dev.allocated, dev.live_buffers, len(dev._bind_groups)) == (before, live, groups)
