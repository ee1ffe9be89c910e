#!/usr/bin/env bash
# What the kernel issue reports, in one call on the GPU machine (after `source .wheelhouse/gpu-env.sh`):
# every `gpu` test, the A/B against the previous kernel (when a checkout of it is given) and the
# 40-shape benchmark. Usage: bench/run_gpu_checks.sh OUTDIR [BASE_TREE BASE_LABEL]
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-/tmp/va-cache}
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider 2>&1 | tee "$out/gpu-tests-sm_90.log" | tail -3
if [ -n "${2:-}" ]; then
  timeout 100 python3 bench/ab_versions.py --base-tree "$2" --base-label "${3:-base}" --out "$out" | tail -9
fi
timeout 280 python3 bench/bench_kernel.py --out "$out" 2>&1 | tee "$out/bench_kernel.log" | tail -3
