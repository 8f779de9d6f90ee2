#!/usr/bin/env bash
# Gather, on a machine with internet (PyPI, Debian), what a GPU machine without it needs to
# run the benchmarks of docs/PERFORMANCE.md from a plain checkout: the Vulkan loader and
# the glvnd libraries (amd64 .debs; libvulkan1 alone leaves NVIDIA's ICD unloadable) in
# .gl/, wgpu-py and its needs (CPython 3.12 manylinux wheels) in .whl/, and the
# transformers and peft that pyproject.toml pins (for the torch + PEFT comparison) in
# .hf/. All three are git-ignored; carry them to the GPU machine with the checkout and
# run scripts/device_targets.sh there.
#
#     bash scripts/device_kit.sh
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { grep -o "\"$1==[^\";]*" pyproject.toml | head -1 | tr -d '"'; }
mkdir -p .gl .whl .hf
lists=$(mktemp -d)
mkdir -p "$lists/partial"
apt=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 "-oDir::State::Lists=$lists")
apt-get "${apt[@]}" update -qq
(cd .gl && apt-get "${apt[@]}" download -qq libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
wheels=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
python3 -m pip download -q "${wheels[@]}" -d .whl "$(pin wgpu)" cffi pycparser rendercanvas
python3 -m pip download -q --no-deps --only-binary=:all: -d .hf "$(pin transformers)" "$(pin peft)"
rm -rf "$lists"
du -sh .gl .whl .hf
