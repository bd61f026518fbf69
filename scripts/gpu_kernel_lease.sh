#!/usr/bin/env bash
# Issue 22's GPU evidence in ONE device command of at most 10 minutes, on one H200:
#
#   POPE_GIT_COMMIT=<commit> OUT=/tmp/out scripts/gpu_kernel_lease.sh        (from the repository root)
#   scripts/gpu_kernel_lease.sh --plan                                         (the steps and budgets; no GPU)
#
# Steps, in order, each under its own `timeout` (budget below, or LEASE_BUDGETS="360 100 85"; a step gets less when
# the total is nearly spent and is skipped, saying so, when under MIN_STEP_S = 15 s is left), each one's output
# printed as it runs and kept in NN-name.log. The budgets are sized from the H200 run of 2026-12-02 at c6dcd5a (the
# first real run; benchmarks/experiments/2026-12-02-kernel-lease-h200), its time per step plus a margin. That run
# also checked and timed the atomic backward (deterministic=False) and had two more steps, a d=128 backward candidate
# (bwd-autows) and d=128 tiles: all three lost on the H200 and are removed (docs/kernels.md), their time given to
# correctness.
#
#   step          budget  what                                                   H200, 2026-12-02, c6dcd5a
#   correctness    360 s  scripts/gpu_kernel_check.py, 14 checks: bf16/fp16/fp32/  ~260 s for its 15 checks then
#                         tf32 (fp32 under TF32 matmul precision) forward+backward (6 of them the atomic backward's,
#                         at GQA 8:2 d=64 and at 1x2x4096x128,
#                         packed varlen (MQA 4:1, empty / length-1 / Nq<Nk         removed; fp16/fp32 at 1x2x4096x
#                         sequences, d=128); vs float64, 2x rule; deterministic    128 added since: mostly Triton
#                         backward bitwise over 3 runs; decode                     compiles, one per dtype x head
#                                                                                  dim x batched/packed)
#   benchmark      100 s  benchmarks/attention.py at the issue's 8 shapes (d=64   85 s (40 rows, 8 of them the
#                         and 128 at N>=4096, 1K, the three GQA shapes) with       atomic provider's, removed)
#                         sdpa, cudnn sdpa, rope compiled+sdpa, pope triton
#   varlen          85 s  benchmarks/attention.py --varlen-only: packed vs per-   72 s (with the atomic provider,
#                         sequence vs padded                                       removed)
#   summary + archive     the final tables, printed last (CPU only), then the      a few s
#                         outputs packed
#   total          545 s  of budgets; LEASE_TOTAL_S (default 575) bounds the run, 10 s of it kept for the summary and
#                         the archive; a device command may run 600 s
#
# Outputs: the steps write under a scratch folder, WORK (${TMPDIR:-/tmp}/kernel-lease.<pid>/kernel-lease), never into
# OUT: a device command returns at most 8 files of OUT, no deeper than OUT/a/b/file (the first run's ~15 files came
# back 8 of them). OUT gets three: provenance.txt, summary.txt and kernel-lease.tar.gz, the whole of WORK (every log,
# the provenance, the summary, kernel_check/, bench/; `tar -xzf` gives kernel-lease/), packed after every step and
# again on exit, also when a step fails or times out and when the run itself is stopped (TERM / INT / HUP stop the
# running step, which is reported KILLED, and the summary and the archive are still written; a SIGKILL leaves the
# archive of the steps before). WORK is removed once packed.
#
# Every output records its provenance (GPU, driver, torch, triton, POPE_GIT_COMMIT, date, command, and whether CUDA MPS
# is on, as scripts/gpu_mps.sh status says: seed sweeps may have left it on, and the timings then ran under it):
# provenance.txt, the head of every log, and the scripts' own JSON / CSV columns. The benchmark's CSVs are in the
# archive's bench/, never in the repository's benchmarks/results (the lead merges those). Exit status 0 when every
# step ran and passed, 1 otherwise, 2 without a GPU.
set -u

cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/out}
TOTAL_S=${LEASE_TOTAL_S:-575}
MIN_STEP_S=15
ARCHIVE=kernel-lease.tar.gz
WORK_ROOT=${TMPDIR:-/tmp}/kernel-lease.$$
WORK=$WORK_ROOT/kernel-lease
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"

# The issue's eight shapes, the new targets (d = 128, GQA) first: rows are written as they are measured, so a step cut
# short loses the ones measured before, the d = 64 shapes.
BENCH_SHAPES=4x16x4096x128,2x32x8x4096x128,1x32x8x8192x128,2x32x4x4096x128,4x16x4096x64,2x16x8192x64,1x16x16384x64,8x12x1024x64
STEP_NAMES=(correctness benchmark varlen)
read -r -a STEP_BUDGETS <<< "${LEASE_BUDGETS:-360 100 85}"  # seconds per step, in order
STEP_COMMANDS=(
  "$PY scripts/gpu_kernel_check.py --checks batched,varlen --dtypes bf16,fp16,fp32,tf32 --bf16-rows 4,5 --other-rows 4,5 --varlen-rows 1 --out $WORK/kernel_check"
  "$PY benchmarks/attention.py --shapes $BENCH_SHAPES --providers 'sdpa,cudnn sdpa,flash sdpa,rope compiled+sdpa,pope triton' --out $WORK/bench"
  "$PY benchmarks/attention.py --varlen-only --out $WORK/bench"
)

plan() {
  local total=0 i
  echo "gpu_kernel_lease.sh plan: ${#STEP_NAMES[@]} steps + summary, OUT=$OUT, total bound ${TOTAL_S} s"
  for i in "${!STEP_NAMES[@]}"; do
    printf '%d. %-12s %4d s  %s\n' $((i + 1)) "${STEP_NAMES[$i]}" "${STEP_BUDGETS[$i]}" "${STEP_COMMANDS[$i]}"
    total=$((total + STEP_BUDGETS[i]))
  done
  printf '%d. %-12s %4s    %s\n' $((${#STEP_NAMES[@]} + 1)) summary "~5 s" \
    "$PY benchmarks/attention.py --summary-from $WORK/bench (+ the steps' logs)"
  echo "budgets sum to ${total} s (+ summary), within the ${TOTAL_S} s bound: $([ "$total" -le "$TOTAL_S" ] && echo yes || echo NO)"
  echo "outputs: the steps write under $WORK (removed once packed); $OUT gets provenance.txt, summary.txt and" \
    "$ARCHIVE (every log and output), packed after every step and on exit, a failed, timed-out or stopped run too"
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

mkdir -p "$OUT" || exit 2
if ! mkdir "$WORK_ROOT" 2>/dev/null || ! mkdir -p "$WORK"/kernel_check "$WORK"/bench; then
  echo "gpu_kernel_lease.sh: cannot make the scratch folder $WORK_ROOT (it exists, or ${TMPDIR:-/tmp} is not writable)" >&2
  exit 2
fi
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
  mps=$(bash scripts/gpu_mps.sh status 2>&1 | head -1)
  echo "cuda ${mps:-MPS: unknown}$([ "$mps" = "MPS: on" ] && echo " (the timings below ran under CUDA MPS: scripts/gpu_mps.sh stop turns it off)")"
} > "$WORK/provenance.txt" 2>&1
cp "$WORK/provenance.txt" "$OUT/provenance.txt"
cat "$WORK/provenance.txt"

STATUS=()
USED=()
for i in "${!STEP_NAMES[@]}"; do STATUS[i]="not run"; USED[i]=0; done
CURRENT=  # the step running now and its background job, for stop_step
STEP_JOB=
SUMMARY_WRITTEN=

archive() {  # WORK -> OUT/kernel-lease.tar.gz, replaced whole (GNU tar's 1: a file changed while read)
  tar -czf "$OUT/$ARCHIVE.partial" -C "$WORK_ROOT" kernel-lease 2>/dev/null
  if [ $? -le 1 ] && mv -f "$OUT/$ARCHIVE.partial" "$OUT/$ARCHIVE"; then return 0; fi
  rm -f "$OUT/$ARCHIVE.partial"
  return 1
}

summarize() {
  # The summary, printed last (what a device command's output tail keeps, about 12,000 characters): the results,
  # then the provenance and the final short table of the steps. The full outputs are in OUT/kernel-lease.tar.gz.
  {
    echo
    echo "================ gpu_kernel_lease.sh summary (full outputs: $OUT/$ARCHIVE) ================"
    echo "-- correctness (kernel error / PyTorch's error in the same dtype vs float64; 2x rule):"
    sed -n '/^check .*passed \/ total/,/^correctness:/p' "$WORK/01-correctness.log" 2>/dev/null | grep -v '^PASS'
    grep -q '^correctness:' "$WORK/01-correctness.log" 2>/dev/null || \
      grep -E '^(PASS|FAIL) ' "$WORK/01-correctness.log" 2>/dev/null | cut -c1-160
    echo "-- benchmark (bench/ in $ARCHIVE; targets stated MET / MISSED):"
    "$PY" benchmarks/attention.py --summary-from "$WORK/bench" 2>&1
    echo "-- provenance:"
    sed 's/^/  /' "$WORK/provenance.txt"
    echo "  outputs: $OUT/$ARCHIVE ($(find "$WORK" -type f | wc -l) files: the logs and every step's outputs;" \
      "tar -xzf gives kernel-lease/), summary.txt and provenance.txt beside it"
    printf '  %-12s %8s %6s  %s\n' step budget used status
    for i in "${!STEP_NAMES[@]}"; do
      printf '  %-12s %6d s %4d s  %s\n' "${STEP_NAMES[$i]}" "${STEP_BUDGETS[$i]}" "${USED[$i]}" "${STATUS[$i]}"
    done
  } 2>&1 | tee "$WORK/summary.txt"
  cp "$WORK/summary.txt" "$OUT/summary.txt"
  SUMMARY_WRITTEN=1
}

finish() {  # on every exit once WORK exists: the summary (if the run was stopped before it), the archive
  trap '' TERM INT HUP  # a few seconds; not cut short by a second signal
  archive
  [ -n "$SUMMARY_WRITTEN" ] || summarize
  if archive; then
    rm -rf "$WORK_ROOT"
  else
    echo "gpu_kernel_lease.sh: could not write $OUT/$ARCHIVE; the outputs are left in $WORK" >&2
  fi
}

stop_step() {  # TERM / INT / HUP: stop the running step (its timeout forwards the signal to the step's processes)
  trap - TERM INT HUP
  echo "gpu_kernel_lease.sh: SIG$1: stopping${CURRENT:+ step $((CURRENT + 1)) ${STEP_NAMES[$CURRENT]}}, then the summary and $OUT/$ARCHIVE" >&2
  if [ -n "$CURRENT" ]; then
    local pid= waited=0
    while [ -n "$STEP_JOB" ] && [ "$waited" -lt 20 ]; do  # timeout's pid (a step started a moment ago: wait for it)
      pid=$(cat "$WORK_ROOT/step.pid" 2>/dev/null)
      [ -n "$pid" ] && break
      sleep 0.1; waited=$((waited + 1))
    done
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
    waited=0
    while [ -n "$STEP_JOB" ] && kill -0 "$STEP_JOB" 2>/dev/null && [ "$waited" -lt 20 ]; do
      sleep 0.5; waited=$((waited + 1))
    done
    [ -n "$pid" ] && kill -KILL -- "-$pid" 2>/dev/null  # timeout's process group: anything the step left
    USED[CURRENT]=$(( $(date +%s) - STEP_START ))
    STATUS[CURRENT]="KILLED (SIG$1) at ${USED[$CURRENT]} s"
  fi
  exit 1
}

trap finish EXIT
trap 'stop_step TERM' TERM
trap 'stop_step INT' INT
trap 'stop_step HUP' HUP

STARTED=$(date +%s)
for i in "${!STEP_NAMES[@]}"; do
  name=${STEP_NAMES[$i]}
  log=$(printf '%s/%02d-%s.log' "$WORK" $((i + 1)) "$name")
  left=$((TOTAL_S - ($(date +%s) - STARTED) - 10))  # 10 s kept for the summary and the archive
  limit=$(( STEP_BUDGETS[i] < left ? STEP_BUDGETS[i] : left ))
  if [ "$limit" -lt "$(( STEP_BUDGETS[i] < MIN_STEP_S ? STEP_BUDGETS[i] : MIN_STEP_S ))" ] || [ "$limit" -lt 1 ]; then
    STATUS[i]="skipped (${left} s left)"
    echo "== step $((i + 1)) $name: skipped, ${left} s left of the ${TOTAL_S} s bound" | tee "$log"
    continue
  fi
  echo "== step $((i + 1)) $name (limit ${limit} s): ${STEP_COMMANDS[$i]}"
  STEP_START=$(date +%s)
  {
    cat "$WORK/provenance.txt"
    echo "step: $name, limit ${limit} s, command: ${STEP_COMMANDS[$i]}"
    echo
  } > "$log"
  # In the background, so that a signal to this script is handled at once (bash runs a trap only after a foreground
  # command ends); the inner shell records timeout's pid (its own process group) for stop_step.
  CURRENT=$i
  STEP_JOB=
  (
    ( echo "$BASHPID" > "$WORK_ROOT/step.pid"; exec timeout -k 5 "$limit" bash -c "${STEP_COMMANDS[$i]}" ) 2>&1 |
      tee -a "$log"
    exit "${PIPESTATUS[0]}"
  ) &
  STEP_JOB=$!
  wait "$STEP_JOB"
  rc=$?
  CURRENT=
  rm -f "$WORK_ROOT/step.pid"
  USED[i]=$(( $(date +%s) - STEP_START ))
  case $rc in
    0) STATUS[i]="ok" ;;
    124|137) STATUS[i]="TIMED OUT at ${limit} s" ;;
    *) STATUS[i]="exit ${rc}" ;;
  esac
  archive
done

summarize
for status in "${STATUS[@]}"; do
  [ "$status" = ok ] || exit 1
done
exit 0
