#!/usr/bin/env bash
# The whole table an engine needs for one model shard on one GPU, tuned and timed: H=8 q=9, every
# prefix bucket of 0..131k at batch 1, 8 and 32 (57 keys), then its graph plan sets (up to 2 graphs
# per batch size, one per prefix range), `configs verify --sample 20`, the plans against the
# heuristic on draws the study never measured, and a `configs dump` folder of the table
# (OUT/dump: bench/engine_loop.py --config-dir replays its sets' graphs).
# Resumable: the study runs at most STUDY_LIMIT_S in one call and is killed (-9) there; run the
# script again on the same STATE dir (a later device call carries it back) and it goes on where it
# was killed. Every phase's wall time is appended to STATE/walltimes.txt.
#   [NEIGHBOUR_MB=128] bench/run_table_tune.sh STATE OUT STUDY_LIMIT_S [TRIALS]
# NEIGHBOUR_MB times every phase cold (--neighbour-mb: a GEMM over that many MB after each launch).
set -uo pipefail
state=${1:?state dir} out=${2:?out dir} limit=${3:?seconds the study may run in this call} trials=${4:-20}
mkdir -p "$state" "$out"
TUNER_DATABASE_URL="sqlite:///$(realpath "$state")/configs.db"
export TUNER_DATABASE_URL TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-/tmp/va-cache}
keys=(--H 8 --q-len 9 --prefix-range 0:131071 --batch 1,8,32)
nb=(--neighbour-mb "${NEIGHBOUR_MB:-0}")
t() { # t NAME CMD...: run CMD, append its wall time and exit status
  local name=$1 s e rc
  shift
  s=$(date +%s%N)
  "$@"
  rc=$?
  e=$(date +%s%N)
  echo "$name wall $(((e - s) / 1000000)) ms rc=$rc" | tee -a "$state/walltimes.txt" >&2
  return $rc
}
save() { tar czf "$out/state.tgz" -C "$(dirname "$state")" "$(basename "$state")"; } # what the next call carries
python3 -m verify_tuner db upgrade >/dev/null
if ! t study timeout -s KILL "$limit" python3 -m verify_tuner study start "${keys[@]}" "${nb[@]}" --trials "$trials" --seed 0 \
  --compile-jobs "$(($(nproc) > 3 ? $(nproc) - 2 : 1))" >>"$out/study.log" 2>"$out/study.err"; then
  save
  tail -2 "$out/study.err"
  echo "study not finished in this call: run again with the same STATE"
  exit 3
fi
save
tail -50 "$out/study.log"
t graph-plan python3 -m verify_tuner study graph-plan "${keys[@]}" "${nb[@]}" --max-graphs 2 --rounds 2 --passes 1 --json \
  >"$out/graph_plans.json" 2>"$out/graph_plans.log"
t verify python3 -m verify_tuner configs verify --sample 20 --rounds 2 --passes 1 >"$out/verify.log" 2>&1
tail -1 "$out/verify.log"
t unseen python3 bench/plan_vs_heuristic.py "${keys[@]}" "${nb[@]}" --draws 4 --out "$out"
python3 -m verify_tuner configs dump --out-dir "$out/dump" >/dev/null
save
