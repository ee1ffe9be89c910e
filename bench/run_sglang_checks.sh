#!/usr/bin/env bash
# The SGLang backend's GPU checks on the GPU machine (after `source .wheelhouse/gpu-env.sh`): its gpu
# tests and the op's, the host cost against an empty op with real launches, and the 300-step loop
# through the backend's hooks, a graph per prefix range. A device call lasts at most 10 minutes: run
# `tests host` in one and `loop` in another. CONFIG_DIR (a `tuner configs dump` folder, e.g.
# run_table_tune.sh's OUT/dump): the loop replays its plan sets' graphs; else two ranges at 4096.
# Usage: [CONFIG_DIR=DIR] bench/run_sglang_checks.sh OUTDIR [tests] [host] [loop]  (none: all)
set -uo pipefail
out=${1:?outdir}
shift
parts=" ${*:-tests host loop} "
mkdir -p "$out"
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-/tmp/va-cache}
if [[ $parts == *" tests "* ]]; then
  timeout 400 python3 -m pytest -m gpu -q -p no:cacheprovider tests/engine/test_sglang_backend_gpu.py \
    tests/engine/test_op_gpu.py tests/engine/test_layouts_gpu.py 2>&1 | tee "$out/sglang-gpu-tests.log" | tail -3
fi
if [[ $parts == *" host "* ]]; then
  timeout 150 python3 bench/host_cost.py --device cuda --out "$out" | tail -14
fi
if [[ $parts == *" loop "* ]]; then
  timeout 580 python3 bench/engine_loop.py --out "$out" ${CONFIG_DIR:+--config-dir "$CONFIG_DIR"} 2>&1 |
    tee "$out/engine_loop.log" | tail -6
fi
