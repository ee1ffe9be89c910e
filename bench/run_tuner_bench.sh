#!/usr/bin/env bash
# Issue-4 measurements on the GPU machine: cold / resumed / fresh-DB `tuner study start` wall times,
# then the report. Usage: bench/run_tuner_bench.sh OUTDIR  (exactly what produced
# cb50554:bench/results/tuner_walltimes_sm_90.txt; the other tuned keys were separate `study start` calls)
set -uo pipefail
out=${1:?outdir}
mkdir -p "$out"
export TUNER_CACHE_DIR=/tmp/tc-cold TUNER_DATABASE_URL=sqlite:////tmp/tune1.db
rm -rf /tmp/tc-cold /tmp/tune1.db* /tmp/tune2.db*
t() { local s=$(date +%s%N); "$@"; local rc=$?; local e=$(date +%s%N); echo "wall $(( (e - s) / 1000000 )) ms rc=$rc :: $*" | tee -a "$out/walltimes.txt"; }
python3 -m verify_tuner db upgrade
t python3 -m verify_tuner study start --H 8 --q-len 9 --prefix 46000 --trials 60 --seed 0 2>&1 | tail -4
t python3 -m verify_tuner study start --H 8 --q-len 9 --prefix 46000 --trials 60 --seed 0 2>&1 | tail -4
env TUNER_DATABASE_URL=sqlite:////tmp/tune2.db python3 -m verify_tuner db upgrade
t env TUNER_DATABASE_URL=sqlite:////tmp/tune2.db python3 -m verify_tuner study start --H 8 --q-len 9 --prefix 46000 --trials 60 --seed 0 2>&1 | tail -4
python3 -m verify_tuner study report --out "$out"
python3 -m verify_tuner configs export --format csv -o "$out/tuned_configs.csv"
cp /tmp/tune1.db "$out/tune1.db" 2>/dev/null || true
