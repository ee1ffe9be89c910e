#!/usr/bin/env bash
# Issue-15 measurement: a whole table (10 prefix buckets of H=8 q_len=9, a fixed trial budget per
# key) tuned by one GPU, then by several sharing the keys (verify_tuner.jobs.claims). Each run starts from an
# empty database and an empty compile cache, so neither inherits the other's compiles. Trials in
# flight per GPU: the CLI's default (--compile-jobs: cores / GPUs, at most 8) unless COMPILE_JOBS is set.
# Each mode's databases are copied to OUTDIR (table_MODE.db) with per-key spans and nvcc compile
# times in its JSON, and per key the configs it measured and how many of them no key had measured
# before (new_configs: the others' compiles were cached). WRAP, if set, prefixes the tuner command
# (e.g. a sampling profiler). DBDIR (default /tmp) holds the databases; STUDY_FILE=1 keeps Optuna's
# studies in a file of their own (TUNER_STUDY_STORAGE) instead of an SQLite file per key beside the
# config database (the default).
# Usage: bench/run_multi_table.sh OUTDIR DEVICES [TRIALS]   (DEVICES like 0,1)
set -uo pipefail
out=${1:?outdir}; devices=${2:?devices}; trials=${3:-8}
mkdir -p "$out"
args=(--H 8 --q-len 9 --prefix-range 1500:45000 --trials "$trials" --seed 0 --only STAGES=2,3 --only QT=0)
[ -n "${COMPILE_JOBS:-}" ] && args+=(--compile-jobs "$COMPILE_JOBS")
for mode in ${MODES:-single multi}; do
  dir=${DBDIR:-/tmp}; db=sqlite:///$dir/table-$mode.db; rm -rf $dir/table-$mode*.db* $dir/table-$mode.studies /tmp/tc-table-$mode
  export TUNER_CACHE_DIR=/tmp/tc-table-$mode
  if [ "${STUDY_FILE:-0}" = 1 ]; then export TUNER_STUDY_STORAGE=sqlite:///$dir/table-$mode-studies.db
  else unset TUNER_STUDY_STORAGE; fi
  env TUNER_DATABASE_URL=$db python3 -m verify_tuner db upgrade >/dev/null
  extra=(); [ $mode = multi ] && extra=(--devices "$devices")
  s=$(date +%s%N); export RUN_START_NS=$s
  env TUNER_DATABASE_URL=$db ${WRAP:-} python3 -m verify_tuner study start "${args[@]}" "${extra[@]}" > "$out/table_$mode.log" 2>&1
  rc=$?; e=$(date +%s%N)
  # SQLite's backup, not cp: the database is in WAL mode, and its last commits may still be in the -wal file
  python3 -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))' \
    $dir/table-$mode.db "$out/table_$mode.db"
  [ -d $dir/table-$mode.studies ] && rm -rf "$out/table_$mode.studies" && cp -r $dir/table-$mode.studies "$out/table_$mode.studies"
  python3 - "$db" "$mode" "$(( (e - s) / 1000000 ))" "$rc" "$out" <<'PY'
import collections, json, os, sys
import optuna
from sqlalchemy import create_engine, text
url, mode, wall_ms, rc, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
keys, spans, first_use = [], [], {}
t0 = int(os.environ["RUN_START_NS"]) / 1e9
from verify_tuner.study_files import default_study_storage, study_urls
pairs = [(u, s.study_name) for u in study_urls(os.environ.get("TUNER_STUDY_STORAGE") or default_study_storage(url))
         for s in optuna.get_all_study_summaries(storage=u)]  # a file per key (the default) or one storage
for studies, name in pairs:
    st = optuna.load_study(study_name=name, storage=studies)
    m = [t for t in st.trials if t.user_attrs.get("measured")]
    own = [(t.datetime_start.timestamp() - t0, t.datetime_complete.timestamp() - t0) for t in st.trials
           if t.datetime_start and t.datetime_complete]
    spans += own
    dup = sum(n - 1 for n in collections.Counter(tuple(sorted(t.params.items())) for t in m).values())
    for t in m:  # which key measured each config first: the others found its compile cached
        cfg, at = tuple(sorted(t.params.items())), t.datetime_start.timestamp()
        if cfg not in first_use or at < first_use[cfg][0]:
            first_use[cfg] = (at, name)
    keys.append({"study": name, "measured": len(m), "duplicates": dup, "trials": len(st.trials),
                 "configs": len({tuple(sorted(t.params.items())) for t in m}),
                 "unfinished": sum(not t.state.is_finished() for t in st.trials),
                 "span_s": [round(min(a for a, _ in own), 2), round(max(b for _, b in own), 2)] if own else None})
firsts = collections.Counter(name for _, name in first_use.values())
for k in keys:  # configs this key measured before any other key did (each a compile, unless it failed)
    k["new_configs"] = firsts[k["study"]]
cache = os.environ.get("TUNER_CACHE_DIR", "")
compiles = []  # a compile holds its .lock from nvcc's start; the .cubin is written when it ends
for lock in (os.scandir(cache) if os.path.isdir(cache) else []):
    cubin = lock.path[:-len(".lock")] + ".cubin"
    if lock.name.endswith(".lock") and os.path.exists(cubin):
        a, b = os.stat(lock.path).st_mtime - t0, os.stat(cubin).st_mtime - t0
        compiles.append([round(a, 2), round(b - a, 2)])
compiles.sort()
with create_engine(url).connect() as c:
    stored = dict(c.execute(text("select bucket, count(*) from best_configs group by bucket")).all())
    owners = c.execute(text("select count(*) from tuning_studies where owner is not null")).scalar()
spans.sort()
busy, end = 0.0, None  # union of the intervals in which at least one trial ran
for a, b in spans:
    if end is None or a > end:
        busy += b - a
        end = b
    elif b > end:
        busy += b - end
        end = b
timeline = {"first_trial_start_s": round(spans[0][0], 2) if spans else None,
            "first_trial_end_s": round(min(b for _, b in spans), 2) if spans else None,
            "last_trial_end_s": round(max(b for _, b in spans), 2) if spans else None,
            "trial_seconds_summed": round(sum(b - a for a, b in spans), 2), "some_trial_running_s": round(busy, 2)}
res = {"mode": mode, "wall_s": wall_ms / 1000, "rc": rc, "keys": len(keys), "timeline": timeline,
       "measured": sum(k["measured"] for k in keys), "duplicates": sum(k["duplicates"] for k in keys),
       "unfinished": sum(k["unfinished"] for k in keys), "winners_per_key": sorted(set(stored.values())),
       "keys_with_a_winner": len(stored), "claims_left": owners, "configs_measured": len(first_use),
       "per_key": keys,
       "compiles": {"n": len(compiles), "seconds_summed": round(sum(d for _, d in compiles), 1),
                    "start_and_seconds": compiles}}
json.dump(res, open(f"{out}/table_{mode}.json", "w"), indent=1)
print(f"{mode}: wall {res['wall_s']:.1f} s rc={rc} keys {res['keys']} measured {res['measured']} "
      f"duplicates {res['duplicates']} unfinished {res['unfinished']} winners/key {res['winners_per_key']} "
      f"keys with a winner {res['keys_with_a_winner']} claims left {owners} configs {len(first_use)} "
      f"compiles {len(compiles)} "
      f"({res['compiles']['seconds_summed']} s summed) timeline {timeline}")
PY
done
