"""Shared fixtures: the `backend` parameter and `run_case`, which runs a portable
case (tests/portable/*.py) natively or inside Pyodide in headless Chromium."""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import sys

import pytest

from bitlora import gpu

PORTABLE = pathlib.Path(__file__).parent / "portable"
sys.path.insert(0, str(PORTABLE))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")  # quiets Mesa's lavapipe

BACKENDS = ["native", pytest.param("browser", marks=pytest.mark.browser)]


def pytest_collection_modifyitems(config, items):
    """Tests marked slow run only when the -m expression names them (-m slow, or
    -m "slow and browser"): CI's plain `pytest` and -m browser skip them."""
    if "slow" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="slow: run with -m slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(scope="session")
def browser_session():
    """One Chromium + Pyodide worker for the whole session (starting one takes ~10 s)."""
    from bitlora.app.browser import BrowserSession
    with BrowserSession() as session:
        yield session


def run_native_case(module: str, name: str, **kwargs):
    mod = importlib.import_module(module)

    async def go():
        dev = await gpu.get_device("native")
        return await getattr(mod, name)(dev, **kwargs)

    return json.loads(json.dumps(gpu.run(go())))  # same types as the browser's answer


@pytest.fixture
def run_case(backend, request):
    """run_case(module, case_name, **kwargs) -> the case's JSON result, on `backend`."""
    def run(module: str, name: str, **kwargs):
        if backend == "native":
            return run_native_case(module, name, **kwargs)
        session = request.getfixturevalue("browser_session")
        return session.run_case(PORTABLE / f"{module}.py", name, kwargs)
    return run
