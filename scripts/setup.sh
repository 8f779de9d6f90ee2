#!/usr/bin/env bash
# Set up everything bitlora needs on a fresh Debian/Ubuntu machine; safe to re-run
# (each step is skipped when already done).
#   scripts/setup.sh        the app: system packages, .venv with bitlora, npm packages
#   scripts/setup.sh test   the same plus the test dependencies (torch, transformers, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
want_test=${1:-}

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }

# 1. System packages: Chromium (the browser tests and --backend browser) and a
#    Vulkan driver (Mesa's lavapipe runs our WGSL natively on machines without a GPU).
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
dpkg -s mesa-vulkan-drivers >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
dpkg -s libvulkan1 >/dev/null 2>&1 || missing+=(libvulkan1)
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    say "installing ${missing[*]} (apt-get)"
    $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    say "please install: ${missing[*]} (no apt-get here)"
  fi
fi

# 2. Python: a virtual environment at .venv with bitlora installed editable.
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  say "creating .venv"
  "$python" -m venv .venv
fi
extras=""; [ "$want_test" = test ] && extras="[test]"
stamp=.venv/.bitlora-installed${extras:+-test}
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  say "installing bitlora${extras} into .venv"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".${extras}"
  touch "$stamp"
fi

# 3. Browser assets: Pyodide and the chart library from npm (pinned by the lockfile).
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  say "installing npm packages"
  npm ci --no-audit --no-fund --loglevel=error
fi

# 4. micropip and packaging for Pyodide: pure-Python wheels from PyPI, the
#    versions pyodide-lock.json names, served locally by `bitlora serve`.
extra=build/pyodide-extra
if [ ! -f "$extra/micropip-0.11.1-py3-none-any.whl" ] || [ ! -f "$extra/packaging-26.1-py3-none-any.whl" ]; then
  say "fetching micropip and packaging wheels for Pyodide"
  mkdir -p "$extra"
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.14 \
    --platform any -d "$extra" micropip==0.11.1 packaging==26.1
fi
say "ready"
