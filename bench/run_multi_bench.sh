#!/usr/bin/env bash
# Issue-6 measurement: a fixed 80-trial study with 1 tuner process vs N processes sharing it.
# Usage: bench/run_multi_bench.sh OUTDIR DEVICES   (DEVICES like 0,1; 0,0 = two processes on one GPU)
set -uo pipefail
out=${1:?outdir}; devices=${2:?devices}
mkdir -p "$out"
export TUNER_CACHE_DIR=/tmp/tc-multi
python3 - <<'PY'
import os
from pathlib import Path
from verify_tuner.kernels.build import precompile
from verify_tuner.kernels.limits import read_device_limits
from tuner import space
lim = read_device_limits(0)
fails = precompile(space.valid_configs(lim, H=8, q_len=9), 9, lim.arch, Path(os.environ["TUNER_CACHE_DIR"]))
print("precompiled the valid grid (warm cache for both runs), failures:", len(fails))
PY
t() { local s=$(date +%s%N); "$@"; local rc=$?; local e=$(date +%s%N); echo "wall $(( (e - s) / 1000000 )) ms rc=$rc :: $*" | tee -a "$out/multi_walltimes.txt"; }
for mode in single multi; do
  db=sqlite:////tmp/multi-$mode.db; rm -rf /tmp/multi-$mode.db* /tmp/multi-$mode.studies
  env TUNER_DATABASE_URL=$db python3 -m verify_tuner db upgrade >/dev/null
  if [ $mode = single ]; then
    t env TUNER_DATABASE_URL=$db python3 -m verify_tuner study start --H 8 --q-len 9 --prefix 46000 --trials 80 --seed 0 2>&1 | tail -3
  else
    t env TUNER_DATABASE_URL=$db python3 -m verify_tuner study start --H 8 --q-len 9 --prefix 46000 --trials 80 --seed 0 --devices "$devices" 2>&1 | tail -3
  fi
  python3 - "$db" <<'PY' | tee -a "$out/multi_walltimes.txt"
import collections, os, sys, optuna
url = sys.argv[1]
from verify_tuner.study_files import default_study_storage, study_urls
(url,) = study_urls(os.environ.get("TUNER_STUDY_STORAGE") or default_study_storage(url))  # one key: one study
(s,) = optuna.get_all_study_summaries(storage=url)
st = optuna.load_study(study_name=s.study_name, storage=url)
m = [t for t in st.trials if t.user_attrs.get("measured")]
unfinished = [t for t in st.trials if not t.state.is_finished()]
dup = sum(n - 1 for n in collections.Counter(tuple(sorted(t.params.items())) for t in m).values())
from sqlalchemy import create_engine, text
with create_engine(url).connect() as c:
    rows = c.execute(text("select count(*) from tuning_trials where state != 'invalid'")).scalar()
print(f"{url}: optuna trials {len(st.trials)}, measured {len(m)}, unfinished {len(unfinished)}, "
      f"duplicate measurements {dup}, tuning_trials rows (non-invalid) {rows}")
PY
done
