#!/usr/bin/env bash
# Issue 22's GPU evidence in ONE device command of at most 10 minutes, on one H200:
#
#   POPE_GIT_COMMIT=<commit> OUT=/tmp/out scripts/gpu_kernel_lease.sh        (from the repository root)
#   scripts/gpu_kernel_lease.sh --plan                                         (the steps and budgets; no GPU)
#
# Steps, in order, each under its own `timeout` (budget below, or LEASE_BUDGETS="120 110 190 100 40"; a step gets less
# when the total is nearly spent and is skipped, saying so, when under MIN_STEP_S = 15 s is left), each one's output in
# OUT/NN-name.log and printed as it runs:
#
#   step          budget  what                                                   known H200 cost it is sized from
#   correctness    120 s  scripts/gpu_kernel_check.py, 15 checks: bf16/fp16/fp32   22 checks in 3 dtypes took 160-190 s,
#                         forward+backward at GQA 8:2 d=64, packed varlen (MQA    12 bf16 atomic checks 130 s, mostly
#                         4:1, empty / length-1 / Nq<Nk sequences, d=128), the    Triton compiles (~5 kernels per dtype
#                         atomic backward (deterministic=False) batched and        x head dim x batched/packed/atomic)
#                         packed; bf16 also 1x2x4096x128; vs float64, 2x rule;
#                         deterministic backward bitwise over 3 runs; decode       (here ~70 compiles of ~1.5 s)
#   candidate      110 s  the d=128 one-loop dk/dv candidate (bwd-autows          two groups of 50 s: compiles ~10 s,
#                         gpu_check.py): each variant checked on the timing        the float64 reference of one head
#                         inputs (2x rule vs float64, determinism, bits vs         group a few s, backward ~4.4 ms x
#                         shipped), then timed (do_bench median) against the      3 do_bench per variant
#                         shipped backward at 4x16x4096x128 and 2x32x8x4096x128
#   benchmark      190 s  benchmarks/attention.py at the issue's 8 shapes (d=64   40 rows of ~1-2 s (do_bench 25+100 ms
#                         and 128 at N>=4096, 1K, the three GQA shapes) with       x2) + Triton compiles (~30 s, partly
#                         sdpa, cudnn sdpa, rope compiled+sdpa, pope triton,       cached by step 1) + torch.compile of
#                         pope triton atomic                                        the rotation per shape (~3-8 s)
#   varlen         100 s  benchmarks/attention.py --varlen-only: packed vs per-   30 rows (3 length distributions x
#                         sequence vs padded, deterministic=False too              2 head dims x 5 providers) of ~1 s +
#                                                                                  ~8 packed/batched compile sets
#   d128-tiles      40 s  scripts/kernel_variants.py: the d=128 dq/dk-dv tiles     5 rows of one compile + fwd/bwd timing
#                         that compile spill-free (2026-12-01-d128-registers);     (lowest priority: it gets what the
#                         the shipped tiles first, the baseline                    steps before left)
#   summary        ~8 s   the final tables, printed last (CPU only)
#   total          560 s  of budgets; LEASE_TOTAL_S (default 575) bounds the run, 10 s of it kept for the summary;
#                         a device command may run 600 s
#
# Every output records its provenance (GPU, driver, torch, triton, POPE_GIT_COMMIT, date, command): OUT/provenance.txt,
# the head of every log, and the scripts' own JSON / CSV columns. The benchmark writes to OUT/bench, never to the
# repository's benchmarks/results (the lead merges those). Exit status 0 when every step ran and passed, 1 otherwise,
# 2 without a GPU.
set -u

cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/out}
TOTAL_S=${LEASE_TOTAL_S:-575}
MIN_STEP_S=15
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"

# The issue's eight shapes, the new targets (d = 128, GQA) first: rows are written as they are measured, so a step cut
# short loses the ones measured before, the d = 64 shapes.
BENCH_SHAPES=4x16x4096x128,2x32x8x4096x128,1x32x8x8192x128,2x32x4x4096x128,4x16x4096x64,2x16x8192x64,1x16x16384x64,8x12x1024x64
STEP_NAMES=(correctness candidate benchmark varlen d128-tiles)
read -r -a STEP_BUDGETS <<< "${LEASE_BUDGETS:-120 110 190 100 40}"  # seconds per step, in order
STEP_COMMANDS=(
  "$PY scripts/gpu_kernel_check.py --checks batched,varlen,atomic --dtypes bf16,fp16,fp32 --bf16-rows 4,5 --other-rows 5 --varlen-rows 1 --atomic-rows 5 --out $OUT/kernel_check"
  "$PY benchmarks/experiments/2026-12-01-bwd-autows/gpu_check.py --groups time-4x16x4096x128,time-2x32x8x4096x128 --variants shipped,one-loop,one-loop-dkdv --limit-s 50 --out $OUT/bwd_autows"
  "$PY benchmarks/attention.py --shapes $BENCH_SHAPES --providers 'sdpa,cudnn sdpa,rope compiled+sdpa,pope triton,pope triton atomic' --out $OUT/bench"
  "$PY benchmarks/attention.py --varlen-only --out $OUT/bench"
  "$PY scripts/kernel_variants.py --module shipped=src/pope/kernels --shapes 4x16x4096x128 --dq 128,32,8,2 --dq 64,32,4,2 --dkdv 64,64,8,2 --dkdv 32,64,8,3 --out $OUT/d128_tiles"
)

plan() {
  local total=0 i
  echo "gpu_kernel_lease.sh plan: ${#STEP_NAMES[@]} steps + summary, OUT=$OUT, total bound ${TOTAL_S} s"
  for i in "${!STEP_NAMES[@]}"; do
    printf '%d. %-12s %4d s  %s\n' $((i + 1)) "${STEP_NAMES[$i]}" "${STEP_BUDGETS[$i]}" "${STEP_COMMANDS[$i]}"
    total=$((total + STEP_BUDGETS[i]))
  done
  printf '%d. %-12s %4s    %s\n' $((${#STEP_NAMES[@]} + 1)) summary "~5 s" \
    "$PY benchmarks/attention.py --summary-from $OUT/bench (+ the steps' logs)"
  echo "budgets sum to ${total} s (+ summary), within the ${TOTAL_S} s bound: $([ "$total" -le "$TOTAL_S" ] && echo yes || echo NO)"
}

if [ "${#STEP_BUDGETS[@]}" -ne "${#STEP_NAMES[@]}" ] || ! [[ "${STEP_BUDGETS[*]} $TOTAL_S" =~ ^[0-9\ ]+$ ]]; then
  echo "gpu_kernel_lease.sh: LEASE_BUDGETS must be ${#STEP_NAMES[@]} whole numbers of seconds (one per step: ${STEP_NAMES[*]}) and LEASE_TOTAL_S one; got '${STEP_BUDGETS[*]}' and '$TOTAL_S'" >&2
  exit 2
fi

case "${1:-}" in
  --plan) plan; exit 0 ;;
  "") ;;
  *) echo "gpu_kernel_lease.sh: unknown argument '$1'; run it with no argument (on the GPU) or with --plan" >&2; exit 2 ;;
esac

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo "gpu_kernel_lease.sh: no CUDA GPU visible to $PY (torch.cuda.is_available() is False, or torch does not import); run it on the H200 machine, or use --plan to list its steps" >&2
  exit 2
fi

mkdir -p "$OUT"/kernel_check "$OUT"/bwd_autows "$OUT"/bench "$OUT"/d128_tiles || exit 2
if [ -z "${POPE_GIT_COMMIT:-}" ]; then
  POPE_GIT_COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  echo "gpu_kernel_lease.sh: POPE_GIT_COMMIT was not set; using '$POPE_GIT_COMMIT' (a device copy's .git may be stale: set it)"
fi
export POPE_GIT_COMMIT
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "command: OUT=$OUT POPE_GIT_COMMIT=$POPE_GIT_COMMIT scripts/gpu_kernel_lease.sh"
  echo "commit (POPE_GIT_COMMIT): $POPE_GIT_COMMIT"
  echo "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  "$PY" -c "import sys, torch, triton; print(f'python {sys.version.split()[0]}, torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}, device {torch.cuda.get_device_name()}')"
  echo "host: $(hostname), $(nproc) CPUs"
} > "$OUT/provenance.txt" 2>&1
cat "$OUT/provenance.txt"

STARTED=$(date +%s)
STATUS=()
USED=()
for i in "${!STEP_NAMES[@]}"; do
  name=${STEP_NAMES[$i]}
  log=$(printf '%s/%02d-%s.log' "$OUT" $((i + 1)) "$name")
  left=$((TOTAL_S - ($(date +%s) - STARTED) - 10))  # 10 s kept for the summary
  limit=$(( STEP_BUDGETS[i] < left ? STEP_BUDGETS[i] : left ))
  if [ "$limit" -lt "$(( STEP_BUDGETS[i] < MIN_STEP_S ? STEP_BUDGETS[i] : MIN_STEP_S ))" ] || [ "$limit" -lt 1 ]; then
    STATUS+=("skipped (${left} s left)"); USED+=(0)
    echo "== step $((i + 1)) $name: skipped, ${left} s left of the ${TOTAL_S} s bound" | tee "$log"
    continue
  fi
  echo "== step $((i + 1)) $name (limit ${limit} s): ${STEP_COMMANDS[$i]}"
  step_start=$(date +%s)
  {
    cat "$OUT/provenance.txt"
    echo "step: $name, limit ${limit} s, command: ${STEP_COMMANDS[$i]}"
    echo
  } > "$log"
  timeout -k 5 "$limit" bash -c "${STEP_COMMANDS[$i]}" 2>&1 | tee -a "$log"
  rc=${PIPESTATUS[0]}
  USED+=($(( $(date +%s) - step_start )))
  case $rc in
    0) STATUS+=("ok") ;;
    124|137) STATUS+=("TIMED OUT at ${limit} s") ;;
    *) STATUS+=("exit ${rc}") ;;
  esac
done

# The summary, printed last (what a device command's output tail keeps, about 12,000 characters): the results, then
# the provenance and the final short table of the steps. The full outputs are in OUT.
{
  echo
  echo "================ gpu_kernel_lease.sh summary (full outputs: $OUT) ================"
  echo "-- correctness (kernel error / PyTorch's error in the same dtype vs float64; 2x rule):"
  sed -n '/^check .*passed \/ total/,/^correctness:/p' "$OUT/01-correctness.log" 2>/dev/null | grep -v '^PASS'
  grep -q '^correctness:' "$OUT/01-correctness.log" 2>/dev/null || \
    grep -E '^(PASS|FAIL) ' "$OUT/01-correctness.log" 2>/dev/null | cut -c1-160
  echo "-- d=128 backward candidate (bwd-autows; ms, ratio to shipped):"
  grep -q '^| group | variant' "$OUT/02-candidate.log" 2>/dev/null && \
    sed -n '/^| group | variant/,$p' "$OUT/02-candidate.log" | cut -c1-180 || \
    echo "  (no table: see 02-candidate.log and $OUT/bwd_autows/*.json for the groups that finished)"
  echo "-- d=128 tiles (scripts/kernel_variants.py; ms):"
  grep -E ' total ' "$OUT/05-d128-tiles.log" 2>/dev/null || echo "  (no rows)"
  echo "-- benchmark (OUT/bench; targets stated MET / MISSED):"
  "$PY" benchmarks/attention.py --summary-from "$OUT/bench" 2>&1
  echo "-- provenance:"
  sed 's/^/  /' "$OUT/provenance.txt"
  printf '  %-12s %8s %6s  %s\n' step budget used status
  for i in "${!STEP_NAMES[@]}"; do
    printf '  %-12s %6d s %4d s  %s\n' "${STEP_NAMES[$i]}" "${STEP_BUDGETS[$i]}" "${USED[$i]}" "${STATUS[$i]}"
  done
} 2>&1 | tee "$OUT/summary.txt"

for status in "${STATUS[@]}"; do
  [ "$status" = ok ] || exit 1
done
exit 0
