#!/usr/bin/env bash
# Issue 13's paired figures on an NVIDIA GPU machine, in one go, from a plain checkout
# with .gl/, .whl/ and .hf/ beside it (scripts/device_kit.sh; torch with CUDA must be
# installed there): the optimizer step (2^27 parameters) and training configs A and B,
# each beside torch + PEFT bf16 in the same process, A and B twice, then B with
# gradient checkpointing. Each benchmark's whole output goes to OUTDIR (default: $OUT,
# else ./device-out) as it runs; the figures that count are printed as they come.
#
#     bash scripts/device_targets.sh [OUTDIR] [--quick]   # --quick: A and B once each
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-${OUT:-device-out}}
quick=${2:-}
mkdir -p "$out"
out=$(cd "$out" && pwd)
for f in .gl/*.deb; do dpkg -x "$f" / >/dev/null; done
ldconfig
python3 -m pip install -q --no-index --no-deps --target /tmp/bitlora-site .whl/*.whl .hf/*.whl || exit 1
# The package as the wheel lays it out (pyproject.toml's package-dir), without installing.
pkg=/tmp/bitlora-pkg
rm -rf "$pkg" && mkdir -p "$pkg"
cp -r py/bitlora "$pkg/" && cp -r shaders "$pkg/bitlora/shaders" && cp -r bench "$pkg/bitlora/bench" \
    && cp -r app "$pkg/bitlora/app"
export PYTHONPATH=/tmp/bitlora-site:$pkg PYTHONUNBUFFERED=1
export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
git log -1 --format='commit %h %s' 2>/dev/null || true
cd /tmp

A=(--shape 2b4t --micro-batch 1 --seq 256 --steps 10)
B=(--shape 2b4t --micro-batch 2 --seq 512 --steps 5 --lora-r 16
   --target-modules q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj)
run() {   # run NAME MODULE ARGS...: the whole output to OUTDIR/NAME.log, its figures here
    local name=$1; shift
    echo "== $name: python3 -m $*"
    python3 -m "$@" > "$out/$name.log" 2>&1
    grep -E "^  (bitlora|torch|ratio)" "$out/$name.log" \
        || tail -5 "$out/$name.log"
}
run optim bitlora.bench.optim --params 134217728 --tensors 200 --iters 100
run a1 bitlora.bench.train "${A[@]}"
run b1 bitlora.bench.train "${B[@]}"
if [ "$quick" != "--quick" ]; then
    run a2 bitlora.bench.train "${A[@]}"
    run b2 bitlora.bench.train "${B[@]}"
    run b_gc bitlora.bench.train "${B[@]}" --gradient-checkpointing --no-torch
fi
