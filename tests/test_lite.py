"""`bitlora lite`: the JupyterLite site, its kernel's lock file and package index, and
examples/finetune_demo.ipynb run cell by cell in JupyterLite's Pyodide kernel in
headless Chromium (WebGPU on SwiftShader), with every request answered by our server."""
import hashlib
import json
import math
import re
import shutil
import struct
import time
import urllib.error
import urllib.request
import zipfile

import pytest

from bitlora.app import lite
from bitlora.app.server import Server


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return lite.build_site(tmp_path_factory.mktemp("lite") / "site")


@pytest.fixture(scope="module")
def server(site):
    with Server(port=0, lite_dir=site) as s:
        yield s


def _get(url):
    with urllib.request.urlopen(url, timeout=30) as resp:
        return resp.status, dict(resp.headers), resp.read()


def test_site_config(site):
    """The kernel is set up for our Pyodide and index, the notebook is in, no other extension."""
    cfg = json.loads((site / "jupyter-lite.json").read_text())["jupyter-config-data"]
    kernel = cfg["litePluginSettings"][f"{lite.KERNEL_EXTENSION}:kernel"]
    assert kernel["pyodideUrl"] == "/pyodide/pyodide.mjs" and kernel["disablePyPIFallback"] is True
    assert kernel["pipliteUrls"][0] == "/wheels/all.json"
    assert [e["name"] for e in cfg["federated_extensions"]] == [lite.KERNEL_EXTENSION]
    assert (site / "files" / "finetune_demo.ipynb").exists()


def test_kernel_lock_and_index(server):
    """The lock names the PyPI wheels set-up fetched, with their real hashes; the index
    lists the wheel the server built; both resolve on the server."""
    _, _, body = _get(server.url + "pyodide/lite-lock.json")
    lock = json.loads(body)
    for name in ("micropip", "ipython", "jedi", "comm", "traitlets"):
        entry = lock["packages"][name]
        status, _, whl = _get(server.url + "pyodide/" + entry["file_name"])
        assert status == 200 and hashlib.sha256(whl).hexdigest() == entry["sha256"], name
    _, _, body = _get(server.url + "wheels/all.json")
    (release,) = json.loads(body)["bitlora"]["releases"].values()
    status, _, whl = _get(server.url + "wheels/" + release[0]["url"][2:])
    assert status == 200 and len(whl) == release[0]["size"]


def _wheel(folder, name, version):
    """A minimal pure-Python wheel (METADATA only) named `name` `version`."""
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return path


def test_kernel_lock_refuses_what_the_kernel_cannot_load(tmp_path, monkeypatch):
    """A wheel whose version differs from npm pyodide's lock, or a start-up package
    missing, is an error that says to run set-up (not a kernel that 404s later)."""
    monkeypatch.setattr(lite, "EXTRA", tmp_path)
    for whl in lite.SITE.parent.joinpath("pyodide-extra").glob("*.whl"):
        shutil.copy(whl, tmp_path)
    assert set(lite.KERNEL_NEEDS) <= set(lite.kernel_lock()["packages"])
    _wheel(tmp_path, "six", "1.0.0")
    with pytest.raises(lite.LiteError, match=r"six-1.0.0-py3-none-any.whl: pyodide-lock.json names six 1.17.0"):
        lite.kernel_lock()
    (tmp_path / "six-1.0.0-py3-none-any.whl").unlink()
    next(tmp_path.glob("jedi-*.whl")).unlink()
    with pytest.raises(lite.LiteError, match=r"missing from build/pyodide-extra \(jedi\): run `make setup`"):
        lite.kernel_lock()


def test_lite_routes(server):
    status, headers, body = _get(server.url + "lite/")
    assert status == 200 and b"jupyter-config-data" in body
    csp = headers["Content-Security-Policy"]
    script_src = csp.split("script-src", 1)[1].split(";")[0]
    assert "frame-ancestors 'self'" in csp and "'sha256-" in script_src and "unsafe-inline" not in script_src
    with urllib.request.urlopen(server.url + "lite/lab", timeout=30) as resp:   # a folder: redirected
        assert resp.url.endswith("/lite/lab/") and resp.status == 200
    assert _get(server.url + "pyodide/lite-lock.json")[1]["Content-Type"] == "application/json"


LITE_TRAVERSALS = [
    "lite/../pyproject.toml", "lite/%2e%2e/pyproject.toml", "lite/..%2fpyproject.toml", "lite/%252e%252e/README.md",
    "lite/lab/../../app/server.py", "lite//etc/passwd", "lite/%2fetc%2fpasswd", "lite/..%5cpyproject.toml",
    "lite/index.html%00", "lite/nothing.js", "lite/outside.toml", "lite/outside-dir/pyproject.toml",
]


def test_lite_serves_only_the_site(server, site):
    """Traversal, absolute paths and symlinks out of the site all answer 404 under /lite/."""
    (site / "outside.toml").symlink_to(lite.ROOT / "pyproject.toml")
    (site / "outside-dir").symlink_to(lite.ROOT, target_is_directory=True)
    for bad in [*LITE_TRAVERSALS, "lite/" + str(lite.ROOT / "pyproject.toml"),
                "lite/" + str(lite.ROOT / "pyproject.toml").replace("/", "%2f")]:
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(server.url + bad)
        assert e.value.code == 404 and b"[project]" not in e.value.read(), bad


def test_lite_missing_site_says_how(tmp_path):
    with Server(port=0, lite_dir=tmp_path / "none") as s:
        with pytest.raises(urllib.error.HTTPError) as e:
            _get(s.url + "lite/")
        assert e.value.code == 404 and b"bitlora lite" in e.value.read()


PROMPTS_JS = "() => [...document.querySelectorAll('.jp-InputPrompt')].map(e => e.textContent)"
OUTPUTS_JS = "() => [...document.querySelectorAll('.jp-OutputArea-output')].map(e => e.innerText)"
ERRORS_JS = ("() => [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type=\"application/"
             "vnd.jupyter.stderr\"]')].map(e => e.innerText)")
PROGRESS_JS = ("() => [...document.querySelectorAll('.bitlora-progress')].map(e => "
               "[e.querySelector('b').textContent, e.querySelectorAll('polyline, circle').length, e.innerText])")


@pytest.mark.browser
def test_notebook_in_jupyterlite(server, tmp_path, browser_session):
    """Run All Cells in JupyterLite: the kernel boots from our server, bitlora installs
    from the site's index, the display updates step by step, the loss falls, and the
    adapter lands in JupyterLite's file system, from where it downloads. The suite's
    Chromium (one Playwright per thread), in a context of its own."""
    log, requested = [], []
    ctx = browser_session.browser.new_context(viewport={"width": 1280, "height": 1000}, accept_downloads=True)
    try:
        ctx.on("request", lambda r: requested.append(r.url))
        page = ctx.new_page()
        page.on("console", lambda m: log.append(f"[{m.type}] {m.text[:300]}"))
        page.on("pageerror", lambda e: log.append(f"[pageerror] {e}"))

        def fail(what):
            pytest.fail(f"{what}\n--- browser console ---\n" + "\n".join(log[-40:]))

        page.goto(server.url + "lite/notebooks/index.html?path=finetune_demo.ipynb")
        # As a person would: run the cells once the kernel is up. (Clicked while the Pyodide
        # kernel was still starting, Run All Cells twice ran nothing in 540 s.)
        idle = page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')
        idle.wait_for(state="attached", timeout=300_000)
        def run_all():
            page.get_by_role("menuitem", name="Run", exact=True).click(timeout=120_000)
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            return time.time()

        # On a loaded machine a click on Run All Cells was once taken by JupyterLite yet
        # started no cell in 540 s; a person seeing every prompt still blank clicks again.
        clicked = [run_all()]
        t0, seen = clicked[0], []
        while True:
            if (len(clicked) < 3 and time.time() - clicked[-1] > 90
                    and not any(p.strip() not in ("", "[ ]:") for p in page.evaluate(PROMPTS_JS))):
                log.append(f"[test] no cell started {time.time() - clicked[-1]:.0f} s after Run All Cells: again")
                clicked.append(run_all())
            if page.evaluate(ERRORS_JS):
                fail("a cell failed:\n" + "\n".join(page.evaluate(ERRORS_JS)))
            progress = page.evaluate(PROGRESS_JS)
            if progress and (not seen or seen[-1] != progress[0]):
                seen.append(progress[0])
            outputs = page.evaluate(OUTPUTS_JS)
            if any("mean loss of the first" in o for o in outputs):
                break
            if time.time() - t0 > 540:
                fail(f"the notebook did not finish in 540 s (Run All Cells clicked {len(clicked)} times); "
                     f"prompts {page.evaluate(PROMPTS_JS)}, outputs so far: {outputs}")
            time.sleep(0.2)

        # The display: one output, shown before the first step and updated in place after
        # several steps while training ran, ending done with the loss plot.
        steps = [int(re.match(r"step (\d+)/10", text).group(1)) for text, _, _ in seen]
        assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 10, seen
        assert len({s for s in steps if 0 < s < 10}) >= 3, f"too few live updates: {seen}"
        assert any(shapes >= 1 for _, shapes, _ in seen[1:]) and seen[-1][1] == 2, seen
        assert "done" in seen[-1][2] and len(page.evaluate(PROGRESS_JS)) == 1

        losses = json.loads(next(o for o in outputs if o.startswith("loss by step:")).split(":", 1)[1])
        assert len(losses) == 10 and all(math.isfinite(v) for v in losses), losses
        assert sum(losses[-5:]) < sum(losses[:5]), losses
        after = next(o for o in outputs if o.startswith("after:"))
        assert len(after.strip()) > len("after: ''"), after
        assert "['adapter_config.json', 'adapter_model.safetensors']" in outputs

        # The adapter in JupyterLite's file browser, downloaded as a person would.
        page.goto(server.url + "lite/tree/")
        page.locator(".jp-DirListing-itemText", has_text="demo-adapter").dblclick(timeout=60_000)
        got = {}
        for name in ("adapter_config.json", "adapter_model.safetensors"):
            page.get_by_text(name, exact=True).click(button="right", timeout=60_000)
            with page.expect_download() as dl:
                page.get_by_role("menuitem", name="Download", exact=True).click()
            dl.value.save_as(tmp_path / name)
            got[name] = (tmp_path / name).read_bytes()
    finally:
        ctx.close()

    config = json.loads(got["adapter_config.json"])
    assert config["peft_type"] == "LORA" and config["r"] > 0
    blob = got["adapter_model.safetensors"]
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert tensors and len(blob) == 8 + n + max(v["data_offsets"][1] for v in tensors.values())
    assert any("lora_A" in k for k in tensors) and any("lora_B" in k for k in tensors)
    # The kernel's worker's requests are seen too (Pyodide, its lock, IPython, bitlora's wheel).
    paths = {u[len(server.url) - 1:].split("?")[0] for u in requested if u.startswith(server.url)}
    assert {"/pyodide/pyodide.asm.wasm", "/pyodide/lite-lock.json", "/wheels/all.json",
            "/pyodide/" + lite.kernel_lock()["packages"]["ipython"]["file_name"]} <= paths
    assert any(p.startswith("/wheels/bitlora-") for p in paths) and any(p.startswith("/demo/model/") for p in paths)
    foreign = [u for u in requested if not u.startswith((server.url, "data:", "blob:"))]
    assert not foreign, f"requests that left the server: {foreign}"
