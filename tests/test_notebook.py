"""The notebook API: `import bitlora` stays light; the live display (text lines, the
SVG loss plot); show_app serving the app framable by a local notebook; the same calls
natively and inside Pyodide (portable case); and examples/finetune_demo.ipynb run by
nbclient, whose last cell asserts that the loss falls."""
import json
import math
import pathlib
import subprocess
import sys
import types
import urllib.request
import xml.etree.ElementTree as ET

import pytest

from bitlora import notebook, train

ROOT = pathlib.Path(__file__).resolve().parent.parent
ADAPTER_FILES = ["adapter_config.json", "adapter_model.safetensors"]


def test_import_is_light():
    code = ("import sys, bitlora; assert 'wgpu' not in sys.modules and 'bitlora.gpu' not in sys.modules;"
            "bitlora.TrainConfig; assert 'bitlora.gpu' not in sys.modules;"
            "assert callable(bitlora.load_model) and 'wgpu' not in sys.modules; print(sorted(bitlora.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "train_with_display" in out


def _rows(losses):
    return [{"step": i + 1, "loss": v, "grad_norm": 1.0, "lr": 1e-3, "tokens_per_s": 100.0, "eta_s": 3.0}
            for i, v in enumerate(losses)]


@pytest.mark.parametrize("losses", [[], [2.0], [3.0, 3.0],
                                    [5.0, float("nan"), 4.0] + [4.0 - i / 10 for i in range(10)]])
def test_loss_svg_is_well_formed(losses):
    svg = notebook.loss_svg(_rows(losses), total=20)
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    shapes = [e for e in root.iter() if e.tag.endswith(("polyline", "circle"))]
    finite = [v for v in losses if math.isfinite(v)]
    assert len(shapes) == (0 if not finite else 1 if len(finite) < 8 else 2)
    for e in shapes:
        for num in (e.get("points") or f"{e.get('cx')},{e.get('cy')}").replace(",", " ").split():
            assert math.isfinite(float(num))


def test_progress_html_escapes():
    html = notebook.progress_html(_rows([1.0]), 4, 1.0)
    ET.fromstring(html)                                  # well-formed, so nothing unescaped got in
    assert "step 1/4" in html and "<progress" in html


def _fake_trainer(total):
    return types.SimpleNamespace(total_steps=total, metrics=[], on_step=None)


def test_text_display_lines_and_chaining():
    tr = _fake_trainer(7)
    seen, lines = [], []
    tr.on_step = seen.append
    prog = notebook.attach_display(tr, mode="text", every=3, out=lines.append)
    for row in _rows([5, 4, 3, 2, 1, 0.5, 0.25]):
        tr.metrics.append(row)
        tr.on_step(row)
    prog.finish()
    prog.detach()
    assert [int(line.split()[1].split("/")[0]) for line in lines] == [0, 1, 3, 6, 7]
    assert lines[-1].startswith("step 7/7 [####################] loss 0.25")
    assert len(seen) == 7 and tr.on_step == seen.append


def test_show_app_outside_a_notebook(capsys):
    url = notebook.show_app()
    assert notebook.show_app() == url                    # one server per process
    assert url in capsys.readouterr().out
    with urllib.request.urlopen(url, timeout=30) as resp:
        csp = resp.headers["Content-Security-Policy"]
        assert resp.status == 200 and b"<html" in resp.read().lower()
    assert "frame-ancestors 'self' http://localhost:*" in csp
    from bitlora.app.server import CSP, csp as server_csp
    assert csp == server_csp(notebook.FRAME_ANCESTORS) and csp.startswith(CSP.rsplit("frame-ancestors", 1)[0])
    records = train._url_records(url + "demo/alpaca_demo.json")   # Trainer's URL data
    assert len(records) > 100 and set(records[0]) >= {"instruction", "output"}


def test_show_app_in_a_kernel():
    """In an IPython kernel show_app returns an IFrame to the loopback server."""
    from jupyter_client.manager import start_new_kernel
    outs = []
    km, kc = start_new_kernel(kernel_name="python3")
    try:
        reply = kc.execute_interactive("import bitlora; bitlora.show_app(height=600)", timeout=120,
                                       output_hook=outs.append)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert reply["content"]["status"] == "ok"
    html = [m["content"]["data"].get("text/html", "") for m in outs if m["msg_type"] == "execute_result"]
    assert len(html) == 1 and "<iframe" in html[0] and 'src="http://127.0.0.1:' in html[0] and '"600"' in html[0]



def test_notebook_api(run_case, backend):
    """The notebook's calls natively and inside Pyodide (where the demo model is fetched
    from the server and every call is awaited)."""
    res = run_case("notebook_cases", "case_notebook_api", steps=2)
    losses = [r["loss"] for r in res["metrics"]]
    assert res["same_list"] and res["total_steps"] == 2 and len(losses) == 2
    assert all(math.isfinite(v) and 0 < v < 20 for v in losses), losses
    assert res["lines"][0].startswith("step 0/2") and res["lines"][-1].startswith("step 2/2")
    assert res["files"] == ADAPTER_FILES and res["model_name"] == "demo"
    assert isinstance(res["tuned"], str) and isinstance(res["base"], str)


def test_example_notebook_runs(tmp_path):
    """examples/finetune_demo.ipynb from top to bottom in a fresh kernel (~2-3 min here)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = nbformat.read(ROOT / "examples" / "finetune_demo.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    shown = [o for o in outputs
             if o.output_type == "display_data" and "bitlora-progress" in o.data.get("text/html", "")]
    assert len(shown) == 1 and "step 10/10" in shown[0].data["text/html"] and "done" in shown[0].data["text/html"]
    assert "<svg" in shown[0].data["text/html"]
    text = "".join(o.get("text", "") for o in outputs)
    assert "mean loss of the first 5 steps" in text
    json.dumps(nb)                                       # the executed notebook is plain JSON


def test_interrupt_stops_at_a_step_boundary(tmp_path):
    """Ctrl-C during train_with_display asks the trainer to stop, waits for the step in
    flight, shows the final state, then lets the KeyboardInterrupt through — also when
    the OS hands the signal to the training thread (the worst case of a process-wide
    SIGINT: only the main thread runs Python's handlers)."""
    script = tmp_path / "interrupt.py"
    script.write_text(
        "import asyncio, os, signal, threading, types\n"
        "from bitlora import notebook\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, also where CI ignores it\n"
        "tr = types.SimpleNamespace(total_steps=100, metrics=[], on_step=None, stopped=False)\n"
        "tr.stop = lambda: setattr(tr, 'stopped', True)\n"
        "async def atrain():\n"
        "    for i in range(1, 101):\n"
        "        if tr.stopped: break\n"
        "        await asyncio.sleep(0.05)\n"
        "        row = {'step': i, 'loss': 1.0 / i, 'grad_norm': 1.0, 'lr': 1e-3, 'tokens_per_s': 1.0, 'eta_s': 1.0}\n"
        "        tr.metrics.append(row); tr.on_step(row)\n"
        "        if i == 3: signal.pthread_kill(threading.get_ident(), signal.SIGINT)\n"
        "    return tr.metrics\n"
        "tr.atrain = atrain\n"
        "try:\n"
        "    notebook.train_with_display(tr, mode='text', every=50)\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted after', len(tr.metrics), 'steps')\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60).stdout
    lines = out.strip().splitlines()
    assert lines[-2].startswith("step ") and lines[-2].endswith("(stopped)"), out
    steps = int(lines[-1].split()[2])
    assert 3 <= steps <= 5 and lines[-2].startswith(f"step {steps}/100"), out
