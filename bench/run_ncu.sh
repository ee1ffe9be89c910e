#!/usr/bin/env bash
# Nsight Compute profiles of the verify kernel (partial + reduce) on the GPU machine, one per
# line of a plan file "NAME H:Q:P[/KV_DTYPE] [CONFIG CONSTANTS...] [-- NVCC FLAGS...]" (no CONFIG:
# the heuristic's for that cache format; no KV_DTYPE: bf16). Writes OUT/NAME.ncu-rep, OUT/NAME.txt
# (every section, base units) and OUT/NAME_sass.csv and OUT/NAME_cuda.csv (warp stall samples of
# the partial kernel per SASS instruction and per source line: add -lineinfo to the plan line's
# flags for the latter).
# Usage (after `source .wheelhouse/gpu-env.sh`): bench/run_ncu.sh OUT PLAN
set -uo pipefail
out=${1:?outdir}; plan=${2:?plan file}
mkdir -p "$out"
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-/tmp/va-cache}
while read -r name shape rest; do
  [ -z "$name" ] || [ "${name:0:1}" = "#" ] && continue
  cfg=${rest%%--*}; flags=""; [[ "$rest" == *--* ]] && flags=${rest#*--}
  cfg=$(echo $cfg); flags=$(echo $flags)
  kv=bf16; [[ "$shape" == */* ]] && kv=${shape#*/} && shape=${shape%%/*}
  args=(--shape "$shape" "--flags=$flags" --kv-dtype "$kv"); [ -n "$cfg" ] && args+=(--config "$cfg")
  python3 bench/ncu_profile.py "${args[@]}" --launches 1 > /dev/null  # compile outside the profiler
  timeout 240 ncu --clock-control none --set full --import-source yes -k regex:verify_attn \
    --launch-skip 8 --launch-count 2 -f -o "$out/$name" python3 bench/ncu_profile.py "${args[@]}" \
    > "$out/$name.log" 2>&1
  echo "$name rc=$? $(tail -1 "$out/$name.log")"
  ncu -i "$out/$name.ncu-rep" --page details --print-units base > "$out/$name.txt" 2>&1
  ncu -i "$out/$name.ncu-rep" --page source --print-source sass --csv -k verify_attn_partial \
    > "$out/${name}_sass.csv" 2>&1
  # the kernel was compiled from a rendered copy in a deleted temp folder: point ncu at the checkout's
  ncu -i "$out/$name.ncu-rep" --page source --print-source cuda --csv -k verify_attn_partial \
    --source-folders "$PWD/kernels/csrc" > "$out/${name}_cuda.csv" 2>&1
done < "$plan"
