#!/usr/bin/env bash
# Set up everything bitlora needs on a fresh Debian/Ubuntu machine; safe to re-run
# (each step is skipped when already done).
#   scripts/setup.sh        the app: system packages, .venv with bitlora, npm packages
#   scripts/setup.sh lite   the same plus the JupyterLite site builder (`bitlora lite`)
#   scripts/setup.sh test   the same plus the test dependencies (torch, transformers, ...)
set -euo pipefail
cd "$(dirname "$0")/.."
want=${1:-}

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
extras=""; case "$want" in test|lite) extras="[$want]" ;; esac
stamp=.venv/.bitlora-installed${extras:+-$want}
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

# 4. Pure-Python wheels for Pyodide from PyPI, served locally by `bitlora serve`
#    (npm's pyodide ships its lock file, not these): micropip and packaging for the
#    page; IPython, jedi, comm and their dependencies for the JupyterLite kernel
#    (`bitlora lite`). The versions are the ones pyodide-lock.json names (comm, which
#    it lacks: PyPI's latest).
extra=build/pyodide-extra
wheels=(micropip==0.11.1 packaging==26.1 ipython==9.12.0 asttokens==3.0.1 decorator==5.2.1
        executing==2.2.1 matplotlib-inline==0.2.1 prompt_toolkit==3.0.52 pure-eval==0.2.3
        pygments==2.20.0 six==1.17.0 stack-data==0.6.3 traitlets==5.14.3 wcwidth==0.6.0
        jedi==0.19.2 parso==0.8.6 comm==0.2.3)
stamp_extra="$extra/.fetched-$(printf '%s ' "${wheels[@]}" | cksum | cut -d' ' -f1)"
if [ ! -f "$stamp_extra" ]; then
  say "fetching pure-Python wheels for Pyodide"
  mkdir -p "$extra"
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.14 \
    --platform any -d "$extra" "${wheels[@]}"
  touch "$stamp_extra"
fi
say "ready"
