#!/usr/bin/env bash
# What the kernel issue reports, a mode a call on the GPU machine (after `source .wheelhouse/gpu-env.sh`;
# every mode starts with bench/smoke.py, which stops the call if the kernel hangs or is wrong;
# each fits one 10-minute call): `tests` runs every `gpu` test but the e4m3 modules, `f8` the e4m3
# module, `f8qk` fp8_e4m3_qk's, `bench` the kernel-v7 table against v6 in the same process
# (bench/kernel_v7.py; V6_SOURCE is v6's .cu,
# e.g. `git show e88ba0d:kernels/csrc/verify_attention.cu > .v6/verify_attention.cu` here, carried).
# `e4m3` is what the e4m3 cache still needs a GPU for, in one call (a machine idles out between
# calls): both e4m3 modules, the default (VA_Q_ROWS=3) A/B'd against a q row at a time, the configs
# around e4m3's defaults, and the headline phase trace with and without VA_Q_ROWS=1. `f8ncu`
# profiles e4m3's defaults and bf16's at q=1 P=131072 and H=8 q=9 P=46000 with Nsight (where
# e4m3's loop spends the time its halved bytes should save). `layouts` measures what gathered cache
# rows give (bench/gather_bandwidth.py, 1152- and 576-byte rows) and each format's default on
# scattered and contiguous slots.
# `loop` A/Bs the tile loop's flags and runs the battery and runtime tests at the defaults; `next`
# A/Bs the QK's shuffle fallback at the defaults it changes, runs the tests whose configs take it
# and profiles H=8 with Nsight; `q64` isolates the sm_120 H=8 q=64 structure check's reading after
# the fixed-cost change; `folded` the unfenced QK at the
# RTX PRO 6000's folded e4m3 defaults (17-24 rows) and the two spilling sm_90 e4m3 defaults' cures,
# and runs the e4m3 module; `sm120e4m3` times sm_120-valid e4m3 structures (q=64's row tile
# first) against e4m3's default there. `grid` times one row group with two k-slices (WR=1 WK=2: each K
# fragment loaded, and for e4m3 dequantized, once a tile instead of twice) against the 72-row
# defaults' 2x2 grid, bf16 and e4m3, and e4m3's configs around its defaults (warp grids, blocks an SM).
# `trace1` traces the phases of both formats at q=1 (P=16k..131k) and e4m3's headline shapes at its
# own default. `reduce` A/Bs the reduce's rows cut into 16 pieces where a request has few rows
# (VA_RED_PIECES) against 4 always, and traces q=1 for both formats.
# `spread` saves every partial block's stamps and SM at q=1 (both formats) and the bf16 headline
# shapes (why the last blocks finish microseconds after the median), and times e4m3's q=1 default
# against more and fewer parts. `defer` runs the kernel's tests and A/Bs the seesaw's deferred
# prologue against the prologue before it.
# Nsight's pages come back packed in ncu.tgz (a device call returns at most 8 files). `edges` A/Bs the prologue's and epilogue's
# instruction diet and runs every gpu test.
# `dsmla` runs FlashMLA's 656-byte rows (fp8_ds_mla) first through the smoke launch, then its GPU
# module, then times its default beside bf16's in the issue's three fp8 cases (each gated); the
# steps' limits add up past one call, so they come in the order that matters if it is cut.
# `vsbase` A/Bs another revision's kernel (BASE_SOURCE, e.g. `git show REV:kernels/csrc/verify_attention.cu
# > .v6/base.cu`, carried) against this tree's at the headline and q=1 shapes, both formats.
# Usage: bench/run_gpu_checks.sh MODE OUTDIR (MODE one of MODES below) | bench/run_gpu_checks.sh bench OUTDIR V6_SOURCE [--quick]
#        | bench/run_gpu_checks.sh vsbase|tiled OUTDIR BASE_SOURCE
set -uo pipefail
# the one list of modes: the usage line and the check below read it (a mode added to the case
# further down goes here too, or the check refuses it)
MODES="tests f8 f8qk e4m3 f8ncu layouts grid trace1 reduce spread defer loop next edges q64 folded sm120e4m3 epi dsmla"
mode=${1:?tests or bench}
out=${2:?outdir}
usage="usage: $0 ${MODES// /|} OUTDIR | $0 bench OUTDIR V6_SOURCE [--quick] | $0 vsbase|tiled OUTDIR BASE_SOURCE"
if [[ "$mode" == *[[:space:]]* || " $MODES bench vsbase tiled " != *" $mode "* ]]; then echo "$usage" >&2; exit 2; fi
if [[ ( "$mode" == vsbase || "$mode" == tiled ) && ! -f "${3:-}" ]]; then echo "$mode: BASE_SOURCE ${3:-(none)} is not a file" >&2; exit 2; fi
mkdir -p "$out"
export TUNER_CACHE_DIR=${TUNER_CACHE_DIR:-/tmp/va-cache}
# gpu-env.sh puts the carried wheel before the checkout: a wheel built before the last kernel edit
# would test and time the old kernel (and ab_kernel.py would refuse the new flags as unknown)
installed=$(python3 -c "import verify_tuner.kernels.build as b; print(b.SOURCE)") || exit 1
if ! cmp -s "$installed" kernels/csrc/verify_attention.cu; then
  echo "the installed kernel ($installed) is not this checkout's: rebuild the wheel (pip wheel --no-deps -w .wheelhouse .)" >&2
  exit 2
fi
# A kernel that deadlocks hangs every step below, and the call returns nothing once its limit is
# spent: one gated launch of each format's default first, stopping the call in a few minutes
# (in a subshell whose stderr goes to the log: the shell's own "Killed" line after a timeout)
if ! (timeout -s KILL 240 python3 bench/smoke.py --kv-dtype bf16 --kv-dtype fp8_e4m3 2>&1 | tee "$out/smoke.log" \
    | tail -4) 2>>"$out/smoke.log"; then
  echo "bench/smoke.py failed or hung (its log: $out/smoke.log): stopping before the longer steps" >&2
  exit 3
fi
F8_TESTS=(tests/kernels/test_fp8_gpu.py tests/kernels/test_fp8_qk_gpu.py)
DS_TESTS=tests/kernels/test_ds_mla_gpu.py  # (its own mode: `tests` leaves it out to stay in one call)
# the code before the fixed-cost change (Q's copies and the output's stores a warp a row, stmatrix)
BEFORE_EDGES="--a-flags=-DVA_WARP_ROWS=0 -DVA_EPI_STMATRIX=0"
# Nsight profiles of a plan (bench/run_ncu.sh), packed into one ncu.tgz without the large reports:
# a device call returns at most 8 files, and each profile writes four
profile() {
  timeout "$1" bash bench/run_ncu.sh "$out/ncu" "$out/ncu_plan.txt"
  rm -f "$out"/ncu/*.ncu-rep
  tar czf "$out/ncu.tgz" -C "$out" ncu && rm -rf "$out/ncu"
}
case "$mode" in
  tests)
    timeout 540 python3 -m pytest -m gpu -q -p no:cacheprovider -rs --ignore="${F8_TESTS[0]}" --ignore="${F8_TESTS[1]}" \
      --ignore="$DS_TESTS" \
      2>&1 | tee "$out/gpu-tests.log" | tail -5 ;;
  f8|f8qk)
    module=${F8_TESTS[0]}; [ "$mode" = f8qk ] && module=${F8_TESTS[1]}
    timeout 540 python3 -m pytest -m gpu -q -p no:cacheprovider -rs -s "$module" \
      2>&1 | tee "$out/gpu-tests-$mode.log" | tail -8 ;;
  e4m3)
    for m in "${F8_TESTS[@]}"; do
      timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs -s "$m" 2>&1 | tee -a "$out/gpu-tests-e4m3.log" | tail -2
    done
    timeout 120 python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 --a-flags=-DVA_Q_ROWS=1 \
      --label "e4m3: q converted a row (A) or three rows (B) a warp at once" \
      --shapes 8:9:46000,8:1:131072,64:9:46000 --out "$out" 2>&1 | tee "$out/ab_q_rows.log" | tail -8
    timeout 120 python3 bench/fp8_configs.py --out "$out" 2>&1 | tee "$out/fp8_configs.log" | tail -12
    timeout 60 python3 bench/phase_trace.py --cases headline --kv-dtype fp8_e4m3 --variant qrow1=-DVA_Q_ROWS=1 \
      --out "$out" 2>&1 | tee "$out/phase_trace.log" | tail -6 ;;
  f8ncu)
    # e4m3 reads half the bytes, yet runs 1.8x its memory floor at q=1 against bf16's 1.3x and no
    # faster than bf16 at q=9: each format's default profiled at both shapes, for bench/ncu_regions.py
    printf 'f8_q1 8:1:131072/fp8_e4m3\nbf16_q1 8:1:131072\nf8_h8 8:9:46000/fp8_e4m3\nbf16_h8 8:9:46000\n' > "$out/ncu_plan.txt"
    profile 400 ;;
  layouts)
    # e4m3's q=1 loop streams at 65 % of DRAM bandwidth (bf16's at 79 %) and more tiles in flight did
    # not help: what do 576-byte rows at random slots give, against 1152-byte rows and contiguous slots?
    timeout -s KILL 60 python3 bench/gather_bandwidth.py --out "$out" 2>&1 | tail -8
    for kv in fp8_e4m3 bf16; do
      for layout in scattered contiguous; do
        timeout -s KILL 60 python3 bench/ab_kernel.py --kv-dtype $kv --layout $layout --shapes 8:1:131072,8:9:46000 \
          --label "$kv default on $layout slots (A and B one build)" --out "$out" 2>&1 | tail -2
      done
    done ;;
  grid)
    timeout 200 python3 bench/fp8_configs.py --out "$out" 2>&1 | tee "$out/fp8_configs.log" | tail -20
    timeout 150 python3 bench/ab_kernel.py --b-override "WR=1 WK=2" --shapes 8:9:46000,64:9:46000,128:9:46000,8:9:4096 \
      --label "bf16: 2x2 QK grid (A) vs one row group, 2 k-slices (B)" --out "$out" 2>&1 | tail -4
    timeout 100 python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 --b-override "WR=1 WK=2" --shapes 8:9:46000,64:9:46000 \
      --label "e4m3: 2x2 QK grid (A) vs one row group, 2 k-slices (B)" --out "$out" 2>&1 | tail -2 ;;
  trace1)
    for kv in bf16 fp8_e4m3; do
      timeout 120 python3 bench/phase_trace.py --cases q1 --kv-dtype $kv --out "$out" 2>&1 | tail -3
    done
    timeout 150 python3 bench/phase_trace.py --cases headline --kv-dtype fp8_e4m3 --out "$out" 2>&1 | tail -3 ;;
  reduce)
    # a q=1 request has 8 rows: at 4 pieces a row its merge ran on 32 of 132 SMs, ~3 us for 264 parts
    timeout 100 python3 bench/ab_kernel.py --a-flags=-DVA_RED_PIECES=4 --shapes 8:1:131072,8:1:16384,16:1:46000,8:2:46000,8:9:4096 \
      --label "reduce: 4 pieces a row (A) vs 16 for few rows (B)" --out "$out" 2>&1 | tail -6
    timeout 70 python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 --a-flags=-DVA_RED_PIECES=4 --shapes 8:1:131072,8:1:46000 \
      --label "e4m3 reduce: 4 pieces a row (A) vs 16 for few rows (B)" --out "$out" 2>&1 | tail -3
    for kv in bf16 fp8_e4m3; do
      timeout 90 python3 bench/phase_trace.py --cases q1 --kv-dtype $kv --out "$out" 2>&1 | tail -3
    done ;;
  spread)
    for kv in fp8_e4m3 bf16; do
      timeout 90 python3 bench/phase_trace.py --cases q1 --kv-dtype $kv --blocks --out "$out" 2>&1 | tail -3
    done
    timeout 120 python3 bench/phase_trace.py --cases headline --blocks --out "$out" 2>&1 | tail -3
    for parts in 132 396 528; do
      timeout 60 python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 --b-override "NSPLIT=$parts" --shapes 8:1:131072,8:1:46000 \
        --label "e4m3 q=1: the default's 264 parts (A) vs $parts (B)" --out "$out" 2>&1 | tail -3
    done ;;
  defer)
    # the seesaw's prologue deferring its later tiles (VA_DEFER_PRO=1, off by default): the kernel's gpu
    # tests (run them with it made the default: both e4m3 modes included), then A/Bs of 0 against 1
    # at short and long prefixes, both formats
    timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/kernels/test_kernel_gpu.py \
      tests/kernels/test_runtime_gpu.py "${F8_TESTS[@]}" 2>&1 | tee "$out/gpu-tests-defer.log" | tail -3
    timeout 60 python3 bench/ab_kernel.py --a-flags=-DVA_DEFER_PRO=0 --b-flags=-DVA_DEFER_PRO=1 \
      --shapes 8:9:0,8:9:4096,8:9:16384,8:9:46000 \
      --label "bf16 seesaw: prologue loads every slot (A) vs tile 0 first (B)" --out "$out" 2>&1 | tail -4
    timeout 60 python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 --a-flags=-DVA_DEFER_PRO=0 --b-flags=-DVA_DEFER_PRO=1 \
      --shapes 8:9:4096,8:9:46000,8:1:16384,8:1:131072 \
      --label "e4m3 seesaw: prologue loads every slot (A) vs tile 0 first (B)" --out "$out" 2>&1 | tail -4 ;;
  loop)
    # the tile loop's issue-rate flags (verify_attention.cu: VA_QK_UNIFORM, VA_SOFTMAX_TREE), each
    # A/B'd against the loop before them (0 0), then the battery and runtime tests at the defaults
    base="--a-flags=-DVA_QK_UNIFORM=0 -DVA_SOFTMAX_TREE=0"
    timeout 150 python3 bench/ab_kernel.py "$base" --b-flags=-DVA_QK_UNIFORM=2 --shapes 8:9:46000,64:9:46000,8:1:131072,8:9:4096 \
      --label "loop: fenced QK and serial softmax chains (A) vs unpredicated QK and trees (B)" --out "$out" 2>&1 | tail -5
    timeout 80 python3 bench/ab_kernel.py "$base" --b-flags=-DVA_QK_UNIFORM=1 --shapes 8:9:46000,64:9:46000 \
      --label "loop: fenced QK and serial softmax chains (A) vs uniform-predicated QK and trees (B)" --out "$out" 2>&1 | tail -3
    timeout 80 python3 bench/ab_kernel.py "$base" --b-flags=-DVA_QK_UNIFORM=0 --shapes 8:9:46000,64:9:46000 \
      --label "loop: serial softmax chains (A) vs trees (B)" --out "$out" 2>&1 | tail -3
    timeout 80 python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 "$base" --b-flags=-DVA_QK_UNIFORM=2 --shapes 8:9:46000,8:1:131072 \
      --label "e4m3 loop: fenced QK and serial softmax chains (A) vs unpredicated QK and trees (B)" --out "$out" 2>&1 | tail -3
    timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/kernels/test_kernel_gpu.py tests/kernels/test_runtime_gpu.py \
      "${F8_TESTS[0]}" 2>&1 | tee "$out/gpu-tests-loop.log" | tail -4 ;;
  next)
    # the QK's fallback where running every row tile costs too much (VA_QK_UNIFORM 2: predicates made
    # warp-uniform by a shuffle), A/B'd against the fenced predicates at the defaults it changes, then
    # the tests whose configs take it and Nsight profiles of H=8 (where the fixed costs and the loop
    # wait, per SASS line)
    for kv in fp8_e4m3 fp8_e4m3_qk; do
      timeout 80 python3 bench/ab_kernel.py --defaults-of rtx-pro-6000 --kv-dtype $kv --a-flags=-DVA_QK_UNIFORM=0 \
        --shapes 8:9:46000,64:9:46000,8:64:46000 --label "sm_120 $kv defaults: fenced QK (A) vs the default (B)" \
        --out "$out" 2>&1 | tail -4
    done
    timeout 90 python3 bench/ab_kernel.py --defaults-of h200 --a-flags=-DVA_QK_UNIFORM=0 \
      --shapes 8:5:46000,8:13:46000,16:5:46000,64:5:46000 --label "H200 bf16 defaults that fall back: fenced QK (A) vs the default (B)" \
      --out "$out" 2>&1 | tail -5
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/kernels/test_kernel_gpu.py tests/kernels/test_runtime_gpu.py \
      "${F8_TESTS[@]}" 2>&1 | tee "$out/gpu-tests-next.log" | tail -4
    printf 'h8_loop 8:9:46000\nh8_p4096 8:9:4096\n' > "$out/ncu_plan.txt"
    profile 120 ;;
  edges)
    # the fixed costs around the tile loop: Q's copies and the output's stores a warp a row
    # (VA_WARP_ROWS) and the epilogue staged with stmatrix (VA_EPI_STMATRIX), A/B'd against the
    # chunk-a-thread copies and scalar stores before them; then every gpu test at the new defaults
    timeout 120 python3 bench/ab_kernel.py "$BEFORE_EDGES" --shapes 8:9:0,8:9:4096,8:9:46000,64:9:46000,8:1:131072 \
      --label "edges: chunk-a-thread Q copies and scalar output staging (A) vs a warp a row and stmatrix (B)" \
      --out "$out" 2>&1 | tail -6
    timeout 80 python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 "$BEFORE_EDGES" --shapes 8:9:4096,8:9:46000,8:1:131072 \
      --label "e4m3 edges: chunk-a-thread Q copies (A) vs a warp a row (B)" --out "$out" 2>&1 | tail -4
    timeout 330 python3 -m pytest -m gpu -q -p no:cacheprovider -rs 2>&1 | tee "$out/gpu-tests-edges.log" | tail -4 ;;
  q64)
    # the sm_120 template's H=8 q=64 read 0.894x v6 after the fixed-cost change against 0.850x
    # before (docs/results.md): the change's flags A/B'd at the RTX PRO 6000's bf16 defaults twice
    # (separate processes: how much is noise), then Nsight profiles of that config both ways
    for round in 1 2; do
      timeout 90 python3 bench/ab_kernel.py --defaults-of rtx-pro-6000 "$BEFORE_EDGES" --shapes 8:64:46000,8:9:46000,64:9:46000 \
        --label "sm_120 bf16 defaults, round $round: chunk-a-thread copies and scalar staging (A) vs the default (B)" \
        --out "$out" 2>&1 | tail -4
    done
    cfg="NSPLIT=11 HT=1 TK=16 BLOCK=128 STAGES=2 QT=32 WR=1 WK=4 SF=0 PIPE=1"
    # and the H200 default's tile loop at the headline shape, per source line (run_ncu.sh points
    # Nsight at kernels/csrc since the per-line page came back empty without it)
    printf 'q64_default 8:64:46000 %s\nq64_old 8:64:46000 %s -- -DVA_WARP_ROWS=0 -DVA_EPI_STMATRIX=0\nh8_loop 8:9:46000\n' \
      "$cfg" "$cfg" > "$out/ncu_plan.txt"
    profile 220 ;;
  folded)
    # the 99-100 KB devices' e4m3 defaults at 17-24 rows fold their scores (SF=1) and kept the fenced
    # QK until VA_QK_UNIFORM's default let 64 rows and fewer take the unfenced one: A/B'd against the
    # fenced QK as a structure check (sm_120 speed is not measured), then the e4m3 module, whose
    # folded seesaw at 8 and 16 rows now takes it
    timeout 100 python3 bench/ab_kernel.py --defaults-of rtx-pro-6000 --kv-dtype fp8_e4m3 --a-flags=-DVA_QK_UNIFORM=0 \
      --shapes 8:3:46000,4:5:46000,1:17:46000,8:3:4096 --label "sm_120 folded e4m3 defaults: fenced QK (A) vs the default (B)" \
      --out "$out" 2>&1 | tail -6
    # the two sm_90 e4m3 defaults that spill (HT=4 at q_len 17-18: 16 bytes, the segment's prefix
    # pointer and the softmax scale reloaded once a tile; bench/results/ptxas_defaults.md): either
    # flag removes the spill, each measured slower elsewhere; which costs less here?
    for f in -DVA_WARP_ROWS=0 -DVA_QK_UNIFORM=0; do
      timeout 60 python3 bench/ab_kernel.py --kv-dtype fp8_e4m3 --b-flags=$f --shapes 8:17:46000,4:18:46000 \
        --label "sm_90 e4m3 at q_len 17-18: the spilling default (A) vs $f (B)" --out "$out" 2>&1 | tail -3
    done
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs "${F8_TESTS[0]}" 2>&1 | tee "$out/gpu-tests-folded.log" | tail -4 ;;
  sm120e4m3)
    # e4m3's sm_120 defaults: the balanced 4-warp template at 33-40 rows (0.70-0.74x the 2:1:1:1
    # split it replaced, bench/results/sm120_structures_fp8_e4m3_sm_90.json) and, at q=64, 32-row
    # tiles still on the 8-warp 2x4 grid, where one sampled 4-head tile of 8 nodes ran 0.736x: that
    # tile with both 4-warp grids, against the default and a new sample (a structure check on this
    # GPU, not sm_120 speed)
    timeout 560 python3 bench/sm120_structures.py --kv-dtype fp8_e4m3 --sample 24 --seed 1 --out "$out" \
      --config "NSPLIT=1 HT=4 TK=32 BLOCK=128 STAGES=2 QT=8 WR=2 WK=2 SF=0 PIPE=0" \
      --config "NSPLIT=1 HT=4 TK=32 BLOCK=128 STAGES=2 QT=8 WR=1 WK=2 SF=0 PIPE=1" \
      2>&1 | tee "$out/sm120_e4m3.log" | tail -12 ;;
  epi)
    # the epilogue's rows as one bulk copy each (VA_EPI_BULK=1, sm_90+) against a warp's 16-byte
    # stores (the default): the short prefixes and the headline shape first (each variant gated
    # against the fp32 reference), then H=64 and e4m3 (in that order: a short call keeps what
    # matters most)
    bulk=--b-flags=-DVA_EPI_BULK=1
    timeout 80 python3 bench/ab_kernel.py $bulk --shapes 8:9:0,8:9:4096,8:9:46000 \
      --label "epilogue: 16-byte stores (A) vs a bulk copy a row (B)" --out "$out" 2>&1 | grep '^|' | tail -n +3
    timeout 45 python3 bench/ab_kernel.py $bulk --shapes 64:9:46000 \
      --label "epilogue at H=64: 16-byte stores (A) vs a bulk copy a row (B)" --out "$out" 2>&1 | grep '^|' | tail -n +3
    timeout 45 python3 bench/ab_kernel.py $bulk --kv-dtype fp8_e4m3 --shapes 8:9:4096 \
      --label "e4m3 epilogue: 16-byte stores (A) vs a bulk copy a row (B)" --out "$out" 2>&1 | grep '^|' | tail -n +3 ;;
  tiled)
    # short batches of several requests: the unit plan (A) against the tiled plan (B), the plan's
    # GPU tests first; then one request, where the plans agree, against BASE_SOURCE (the kernel
    # before the tiled plan), warm and cold (the tiled plan adds code to the prologue)
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider tests/kernels/test_runtime_gpu.py \
      tests/kernels/test_fp8_gpu.py -k "graph or ragged or tiled" 2>&1 | tee "$out/gpu-tests-tiled.log" | tail -3
    for b in "2 8:9:2000,64:9:200" "3 8:9:1000" "4 8:9:1000,8:9:0,8:9:4096" "8 8:9:500" "16 8:9:200"; do
      timeout 60 python3 bench/ab_kernel.py --batch ${b%% *} --shapes ${b#* } --a-flags=-DVA_TILED_PLAN=0 \
        --label "short batches of ${b%% *}: unit plan (A) vs tiled plan (B)" --out "$out" 2>&1 | grep '^|' | tail -n +3
    done
    timeout 40 python3 bench/ab_kernel.py --batch 4 --kv-dtype fp8_e4m3 --shapes 8:9:1000 --a-flags=-DVA_TILED_PLAN=0 \
      --label "e4m3 short batches of 4: unit plan (A) vs tiled plan (B)" --out "$out" 2>&1 | grep '^|' | tail -n +3
    timeout 60 python3 bench/ab_kernel.py --a-source "$3" --shapes 8:9:46000,8:9:4096,8:9:0 \
      --label "one request: $(basename "$3") (A) vs the tiled plan's tree (B)" --out "$out" 2>&1 | grep '^|' | tail -n +3
    timeout 80 python3 bench/ab_kernel.py --a-source "$3" --neighbour-mb 128 --shapes 8:9:46000,8:9:4096,8:9:0 \
      --label "one request, cold: $(basename "$3") (A) vs the tiled plan's tree (B)" --out "$out" 2>&1 | grep '^|' | tail -n +3 ;;
  dsmla)
    export VERIFY_TUNER_RUN_WITHHELD=fp8_ds_mla  # withheld from serving: its GPU tests failed (kernels/formats.py)
    if ! (timeout -s KILL 200 python3 bench/smoke.py --kv-dtype fp8_ds_mla 2>&1 | tee "$out/smoke-dsmla.log" \
        | tail -3) 2>>"$out/smoke-dsmla.log"; then
      echo "bench/smoke.py failed or hung on fp8_ds_mla (its log: $out/smoke-dsmla.log)" >&2
      exit 3
    fi
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider -rs -s "$DS_TESTS" 2>&1 | tee "$out/gpu-tests-dsmla.log" | tail -8
    timeout 150 python3 bench/kernel_v7.py --quick --fp8 fp8_ds_mla --fp8-only --out "$out" 2>&1 | tee "$out/kernel_v7_dsmla.log" | tail -5 ;;
  vsbase)
    base=$3
    timeout 200 python3 bench/ab_kernel.py --a-source "$base" \
      --shapes 8:9:46000,8:9:4096,64:9:46000,128:9:46000,8:1:131072,8:1:16384,16:1:46000,8:9:0 \
      --label "bf16: $(basename "$base") (A) vs this tree (B)" --out "$out" 2>&1 | tail -9
    timeout 100 python3 bench/ab_kernel.py --a-source "$base" --kv-dtype fp8_e4m3 --shapes 8:9:46000,8:1:131072,64:9:46000,8:9:4096 \
      --label "e4m3: $(basename "$base") (A) vs this tree (B)" --out "$out" 2>&1 | tail -5 ;;
  bench)
    timeout 560 python3 bench/kernel_v7.py --v6-source "${3:?v6 source}" --out "$out" ${4:-} \
      2>&1 | tee "$out/kernel_v7.log" | tail -20 ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
