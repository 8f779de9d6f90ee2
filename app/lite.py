"""`bitlora lite`: a JupyterLite site whose Pyodide kernel runs bitlora on WebGPU,
served by `bitlora serve` under /lite/ with nothing fetched from a CDN.

The site is built by jupyterlite-core and jupyterlite-pyodide-kernel (pinned in the
`lite` extra) into build/lite, with examples/*.ipynb as its contents. Its kernel is
configured (jupyter-lite.json) to use what our server already serves:
  Pyodide          /pyodide/pyodide.mjs (npm `pyodide`, the page's own)
  Pyodide packages /pyodide/lite-lock.json: npm pyodide's lock file cut down to the
                   wheels set-up fetched from PyPI into build/pyodide-extra (micropip,
                   IPython and its dependencies, jedi, comm), with their hashes: the
                   npm package ships the lock but not the wheels, which the kernel
                   needs and would otherwise load from the Pyodide CDN
  bitlora          /wheels/all.json: a piplite index of the wheel the server builds
                   from the tree at start-up (`await piplite.install("bitlora")`)
The kernel's own wheels (piplite, pyodide-kernel, the ipykernel shim) ship inside
the kernel's extension; PyPI fallback is off.
"""
from __future__ import annotations

import email.parser
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SITE = ROOT / "build" / "lite"
EXTRA = ROOT / "build" / "pyodide-extra"
PYODIDE_LOCK = ROOT / "node_modules" / "pyodide" / "pyodide-lock.json"
NOTEBOOKS = sorted((ROOT / "examples").glob("*.ipynb"))
KERNEL_EXTENSION = "@jupyterlite/pyodide-kernel-extension"
# What the kernel loads at start-up besides its own wheels (its worker's initKernel).
KERNEL_NEEDS = ("micropip", "ipython", "jedi", "comm")

# The kernel's settings, relative to the page: the server's routes (app/server.py).
KERNEL_SETTINGS = {
    "pyodideUrl": "/pyodide/pyodide.mjs",
    "loadPyodideOptions": {"lockFileURL": "/pyodide/lite-lock.json"},
    "pipliteUrls": ["/wheels/all.json"],
    "disablePyPIFallback": True,
}


class LiteError(RuntimeError):
    pass


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_meta(path: pathlib.Path) -> tuple[str, str, list[str], list[str]]:
    """(name, version, requirement names without markers, top-level imports) of a wheel."""
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(zf.read(meta).decode())
        top = next((n for n in names if n.endswith(".dist-info/top_level.txt")), None)
        imports = zf.read(top).decode().split() if top else \
            sorted({n.split("/")[0] for n in names if "/" in n and ".dist-info" not in n.split("/")[0]})
    reqs = [re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in msg.get_all("Requires-Dist") or []
            if ";" not in r]
    return msg["Name"], msg["Version"], reqs, imports


def kernel_lock() -> dict:
    """The kernel's Pyodide lock file: npm pyodide's, listing only the packages this
    server has, the wheels in build/pyodide-extra (file name and sha256 of the PyPI
    wheel; a package npm's lock lacks gets an entry from the wheel's metadata). A
    package outside it then fails to install with a clear error instead of a 404."""
    if not PYODIDE_LOCK.exists() or not EXTRA.is_dir():
        raise LiteError("Pyodide or its extra wheels are missing: run `make setup` in the repository first")
    lock = json.loads(PYODIDE_LOCK.read_text())
    npm = {_norm(k): v for k, v in lock["packages"].items()}
    lock["packages"] = {}
    for whl in sorted(EXTRA.glob("*.whl")):
        name, version, reqs, imports = _wheel_meta(whl)
        entry = dict(npm.get(_norm(name)) or {
            "name": name, "version": version, "imports": imports, "install_dir": "site",
            "package_type": "package", "unvendored_tests": False, "depends": [_norm(r) for r in reqs]})
        if entry["version"] != version:
            raise LiteError(f"{whl.name}: pyodide-lock.json names {name} {entry['version']}; "
                            f"run `make setup` to fetch the matching wheel")
        entry.update(file_name=whl.name, sha256=hashlib.sha256(whl.read_bytes()).hexdigest())
        lock["packages"][_norm(name)] = entry
    missing = sorted({_norm(d) for e in lock["packages"].values() for d in e["depends"]} - set(lock["packages"])
                     | set(KERNEL_NEEDS) - set(lock["packages"]))
    if missing:
        raise LiteError(f"wheels the JupyterLite kernel needs are missing from build/pyodide-extra "
                        f"({', '.join(missing)}): run `make setup` in the repository")
    return lock


def piplite_index(wheel_name: str, wheel_bytes: bytes) -> dict:
    """A piplite all.json listing one wheel that lies beside it."""
    name, version = wheel_name.split("-")[:2]
    return {name: {"releases": {version: [{
        "filename": wheel_name, "url": f"./{wheel_name}", "packagetype": "bdist_wheel",
        "python_version": "py3", "requires_python": ">=3.11", "size": len(wheel_bytes),
        "digests": {"sha256": hashlib.sha256(wheel_bytes).hexdigest()}, "yanked": False}]}}}


def kernel_extension() -> pathlib.Path:
    """The Pyodide kernel's prebuilt JupyterLab extension, as pip installed it."""
    for base in (pathlib.Path(sys.prefix), pathlib.Path(sys.base_prefix)):
        path = base / "share" / "jupyter" / "labextensions" / KERNEL_EXTENSION
        if (path / "package.json").exists():
            return path
    raise LiteError("jupyterlite-pyodide-kernel is not installed: run `make lite` (or "
                    "`pip install -e '.[lite]'`) in the repository")


def build_site(out: pathlib.Path = SITE, notebooks=NOTEBOOKS) -> pathlib.Path:
    """Build the JupyterLite site into `out` (replaced) and return it."""
    try:
        import jupyterlite_core  # noqa: F401 - only to fail with a clear message
    except ImportError:
        raise LiteError("jupyterlite-core is not installed: run `make lite` (or "
                        "`pip install -e '.[lite]'`) in the repository") from None
    kernel_lock()                                  # the extra wheels are there and match
    out = pathlib.Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="bitlora-lite-") as tmp:
        lite_dir = pathlib.Path(tmp)
        (lite_dir / "jupyter-lite.json").write_text(json.dumps({
            "jupyter-lite-schema-version": 0,
            "jupyter-config-data": {"litePluginSettings": {f"{KERNEL_EXTENSION}:kernel": KERNEL_SETTINGS}}}))
        # Only the kernel's extension: not whatever else pip put in this environment.
        (lite_dir / "jupyter_lite_config.json").write_text(json.dumps({"LiteBuildConfig": {
            "ignore_sys_prefix": ["federated_extensions"],
            "federated_extensions": [str(kernel_extension())],
            "contents": [str(p) for p in notebooks],
            "output_dir": str(lite_dir / "_output"),
            "cache_dir": str(lite_dir / "_cache"),
            "no_sourcemaps": True}}))
        res = subprocess.run([sys.executable, "-m", "jupyterlite_core", "build", "--lite-dir", str(lite_dir)],
                             cwd=lite_dir, capture_output=True, text=True)
        if res.returncode != 0:
            raise LiteError(f"jupyter lite build failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        if out.exists():
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(lite_dir / "_output"), out)
    return out
