#!/usr/bin/env bash
# Background seed sweeps on the GPU machine, with one command line pasted into every device command of a lease:
#
#   bash scripts/gpu_sweeps.sh 540 scripts/sweeps/example.plan     # command 1, 2, 3, ...: the same line
#
# gpu_sweeps.sh SECONDS PLAN...: first brings every sweep of the plan to the state it should be in, printing one
# line each:
#   NAME: started (fresh machine: no runs)      no run directory and no process of any of the plan's sweeps: the
#                                                machine is new (the previous one went back with its runs); starts
#   NAME: started (new sweep: no runs yet)       this sweep has no run directory but others of the plan do
#   NAME: running (pid N)                        its sweep script, or one of its seeds, is alive: left alone
#   NAME: finished                               every seed finished and the log shows the script's end: left alone
#   NAME: restarted (resume: seed 0 at step 41000, ...; each seed continues from its checkpoints/last)
#                                                not running, not finished (a crash, a killed script): started again;
#                                                scripts/gpu_sweep_indirect.sh always resumes
# Each start is scripts/gpu_sweep_indirect.sh in its own session (setsid nohup), logging to $LOG_DIR/sweep-NAME.log
# (a previous log is kept as sweep-NAME.log.previous), with LIMIT=100000 training seconds unless the plan says
# otherwise, so it outlives the device command. Before the first start, when none of the plan's sweeps is running
# and the plan runs more than one training process at once (its unfinished sweeps together, each
# min(seeds, JOBS_PER_GPU)), CUDA MPS is turned on (scripts/gpu_mps.sh start: one line; a failure leaves the sweeps
# time-slicing the GPU). One process alone runs ~9 % faster without MPS (an H200, 2026-12-04), so a one-process
# plan leaves MPS alone.
# Then it watches them with scripts/gpu_sweep_monitor.sh for the rest of SECONDS (never longer: give <= 540 for a
# 600 s command) and exits with its status: 0 when the time is up or every sweep ended, 1 when no sweep process is
# alive but one did not end (the next call resumes it). With CONTINUE_ONLY=1 (for a command that only continues the
# previous one's runs, e.g. the second half of a seed too long for one command) a fresh machine starts nothing:
# one line per sweep says so and the script exits 3 at once, leaving the device time for other work (the runs went
# back with the previous machine, and started again they would not finish in this command). Without SECONDS,
# `--check PLAN...` parses the plan and prints each sweep's settings and state, starting nothing.
#
# A PLAN is a file with one sweep a line, or one such line as an argument (it contains `=`). A line is shell-quoted
# KEY=VALUE words (`#` starts a comment):
#   NAME=pope-wrap PE=pope:delta_range=wrap SEEDS=0-1 JOBS_PER_GPU=2
#   NAME=pope-len32 PE=pope SEEDS=0-2 EXTRA="--set recipe.dataset=indirect-indexing:min_len=20,max_len=32"
# NAME (required; the run directory under $RUNS, letters, digits, . _ -), PE (required; any `pope train --pe`),
# SEEDS (required; 0-3 or 0,3,5), JOBS_PER_GPU (default: pope's), EXTRA (more `--set` arguments for `pope train`),
# LIMIT (training seconds, default 100000) are scripts/gpu_sweep_indirect.sh's settings. Names are unique in a plan.
# Settings (environment): RUNS (/tmp/pope-runs), OUT (where the monitor archives: this command's $OUT; default
# /tmp/out), SWEEP_OUT (the sweep scripts' OUT, /tmp/out), LOG_DIR (/tmp), MPS (auto: as above; on: start it even
# for one process; off: leave MPS alone), CONTINUE_ONLY (0; 1: as above),
# SWEEP_SCRIPT (scripts/gpu_sweep_indirect.sh; the tests give a stand-in).
set -u
usage="usage: gpu_sweeps.sh SECONDS PLAN... | gpu_sweeps.sh --check PLAN... (PLAN: a plan file or one sweep line)"
limit=${1:-}; shift || true
[ $# -gt 0 ] || { echo "gpu_sweeps.sh: $usage" >&2; exit 2; }
case $limit in
  --check) ;;
  ''|*[!0-9]*) echo "gpu_sweeps.sh: SECONDS must be a whole number, not '$limit'; $usage" >&2; exit 2 ;;
esac
case ${MPS:-auto} in
  auto|on|off) ;;
  *) echo "gpu_sweeps.sh: MPS must be auto, on or off, not '$MPS'" >&2; exit 2 ;;
esac
case ${CONTINUE_ONLY:-0} in
  0|1) ;;
  *) echo "gpu_sweeps.sh: CONTINUE_ONLY must be 0 or 1, not '$CONTINUE_ONLY'" >&2; exit 2 ;;
esac
here=$(dirname "$0")
export RUNS=${RUNS:-/tmp/pope-runs} OUT=${OUT:-/tmp/out} LOG_DIR=${LOG_DIR:-/tmp}
SWEEP_OUT=${SWEEP_OUT:-/tmp/out}  # the background scripts' own OUT: it outlives this command's $OUT
export SWEEP_SCRIPT=${SWEEP_SCRIPT:-$here/gpu_sweep_indirect.sh}
if [ ! -f "$SWEEP_SCRIPT" ]; then
  echo "gpu_sweeps.sh: no sweep script $SWEEP_SCRIPT (run from the repository root)" >&2; exit 2
fi
# shellcheck source=scripts/gpu_sweep_processes.sh
. "$here/gpu_sweep_processes.sh"

# The plan, checked before anything starts, and each sweep's runs: NAME PE SEEDS JOBS LIMIT EXTRA FINISHED STEPS
# PROCESSES (how many of its seeds train at once), NUL-separated (EXTRA may hold any character but NUL) in a file:
# a bash variable cannot hold a NUL.
fields_file=$(mktemp)
trap 'rm -f "$fields_file"' EXIT
PYTHONPATH="$here/../src" python3 - "$RUNS" "$@" > "$fields_file" <<'PY' || exit 2
import re, shlex, sys
from pathlib import Path
from pope.train.sweep import DEFAULT_JOBS_PER_GPU, last_step, parse_seeds, run_finished

KEYS = ("NAME", "PE", "SEEDS", "JOBS_PER_GPU", "EXTRA", "LIMIT")
def fail(where, message):
    sys.exit(f"gpu_sweeps.sh: {where}: {message}; a sweep line is KEY=VALUE words, e.g. "
             "NAME=pope-a PE=pope SEEDS=0-3 JOBS_PER_GPU=4 EXTRA=\"--set ...\" (keys: " + ", ".join(KEYS) + ")")
lines = []
for arg in sys.argv[2:]:
    if Path(arg).is_file():
        lines += [(f"{arg} line {n}", text) for n, text in enumerate(Path(arg).read_text().splitlines(), 1)]
    elif "=" in arg:
        lines.append((f"sweep {arg!r}", arg))
    else:
        fail(repr(arg), "no such plan file, and not a sweep line (no KEY=VALUE)")
runs, sweeps = Path(sys.argv[1]), {}
for where, text in lines:
    try:
        words = shlex.split(text, comments=True)
    except ValueError as error:
        fail(where, f"cannot split it into words ({error})")
    if not words:
        continue
    sweep = {}
    for word in words:
        key, equals, value = word.partition("=")
        if not equals or key not in KEYS:
            fail(where, f"{word!r} is not KEY=VALUE with a known KEY")
        if key in sweep:
            fail(where, f"{key} given twice")
        sweep[key] = value
    for key in ("NAME", "PE", "SEEDS"):
        if not sweep.get(key):
            fail(where, f"give {key}")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", sweep["NAME"]) or sweep["NAME"] in (".", ".."):
        fail(where, f"NAME {sweep['NAME']!r} must be a directory name (letters, digits, . _ -)")
    if sweep["NAME"] in sweeps:
        fail(where, f"NAME {sweep['NAME']} is already a sweep of the plan")
    try:
        seeds = parse_seeds(sweep["SEEDS"])
    except ValueError as error:
        fail(where, f"SEEDS: {error}")
    for key in ("JOBS_PER_GPU", "LIMIT"):
        if key in sweep and not re.fullmatch(r"[1-9][0-9]*", sweep[key]):
            fail(where, f"{key} must be a positive whole number, not {sweep[key]!r}")
    directory = runs / sweep["NAME"]
    finished = all(run_finished(directory / f"seed-{seed}") for seed in seeds)
    steps = ", ".join(f"seed {seed} " + ("finished" if run_finished(directory / f"seed-{seed}") else
                                         f"at step {last_step(directory / f'seed-{seed}' / 'metrics.jsonl')}"
                                         if (directory / f"seed-{seed}" / "config.json").exists() else "not started")
                      for seed in seeds)
    # training processes at once, on one GPU (a finished sweep trains none)
    processes = 0 if finished else min(len(seeds), int(sweep.get("JOBS_PER_GPU") or DEFAULT_JOBS_PER_GPU))
    sweeps[sweep["NAME"]] = [sweep["NAME"], sweep["PE"], sweep["SEEDS"], sweep.get("JOBS_PER_GPU", ""),
                             sweep.get("LIMIT", "100000"), sweep.get("EXTRA", ""), str(int(finished)), steps,
                             str(processes)]
if not sweeps:
    fail(" ".join(sys.argv[2:]), "the plan names no sweep")
sys.stdout.write("".join(field + "\0" for sweep in sweeps.values() for field in sweep))
PY
mapfile -d '' -t fields < "$fields_file"
rm -f "$fields_file"
names=(); processes=0
for ((i = 0; i < ${#fields[@]}; i += 9)); do names+=("${fields[i]}"); processes=$((processes + fields[i + 8])); done

# What each sweep needs: running, finished, or a start (fresh or a resume).
fresh=1; busy=0
for name in "${names[@]}"; do [ -d "$RUNS/$name" ] && fresh=0; done
[ -n "$(sweep_pids "${names[@]}")" ] && fresh=0 busy=1
if [ $fresh = 1 ] && [ "${CONTINUE_ONLY:-0}" = 1 ]; then
  for name in "${names[@]}"; do
    echo "$name: not started (fresh machine: no runs to continue, and CONTINUE_ONLY=1)"
  done
  [ "$limit" = --check ] && exit 0
  echo "gpu_sweeps.sh: the previous command's runs went back with its machine; nothing started (without" \
       "CONTINUE_ONLY=1 the plan starts again from step 0)"
  exit 3
fi
mps_done=0
for ((i = 0; i < ${#fields[@]}; i += 9)); do
  name=${fields[i]} pe=${fields[i + 1]} seeds=${fields[i + 2]} jobs=${fields[i + 3]} seconds=${fields[i + 4]}
  extra=${fields[i + 5]} finished=${fields[i + 6]} steps=${fields[i + 7]}
  log=$LOG_DIR/sweep-$name.log
  pids=$(sweep_pids "$name" | tr '\n' ' ')
  if [ -n "$pids" ]; then
    echo "$name: running (pid ${pids% })"; continue
  elif [ "$finished" = 1 ] && sweep_log_ended "$name"; then
    echo "$name: finished"; continue
  elif [ -d "$RUNS/$name" ]; then
    state="restarted (resume: $steps; each seed continues from its checkpoints/last)"
  elif [ $fresh = 1 ]; then
    state="started (fresh machine: no runs)"
  else
    state="started (new sweep: no runs yet)"
  fi
  if [ "$limit" = --check ]; then
    echo "$name: would be $state: PE=$pe SEEDS=$seeds JOBS_PER_GPU=${jobs:-default}" \
         "LIMIT=$seconds EXTRA=$extra"
    continue
  fi
  if [ $mps_done = 0 ]; then  # once, before the first start
    mps_done=1
    if [ "${MPS:-auto}" = off ]; then echo "MPS: left alone (MPS=off)"
    elif [ "${MPS:-auto}" != on ] && [ $processes -le 1 ]; then
      echo "MPS: left alone (the plan runs one training process at a time; MPS=on starts it anyway)"
    elif [ $busy = 1 ]; then echo "$(bash "$here/gpu_mps.sh" status) (left as it is: sweeps are running on the GPU)"
    else bash "$here/gpu_mps.sh" start
    fi
  fi
  [ -f "$log" ] && mv "$log" "$log.previous"
  mkdir -p "$LOG_DIR"
  pid=$(env NAME="$name" PE="$pe" SEEDS="$seeds" JOBS_PER_GPU="$jobs" LIMIT="$seconds" EXTRA="$extra" OUT="$SWEEP_OUT" \
        RUNS="$RUNS" setsid nohup bash "$SWEEP_SCRIPT" > "$log" 2>&1 < /dev/null & echo $!)
  echo "$name: $state; pid $pid, log $log"
  # until the child has exec'd the sweep script it is a copy of this shell, which sweep_pids does not count: wait for
  # it (at most 10 s), or the monitor, on a loaded machine, finds "no sweep process alive" and gives up
  for _ in $(seq 1 100); do { [ -n "$(sweep_pids "$name")" ] || sweep_log_ended "$name"; } && break; sleep 0.1; done
done
[ "$limit" = --check ] && exit 0
left=$((limit - SECONDS)); [ $left -ge 0 ] || left=0
exec bash "$here/gpu_sweep_monitor.sh" "$left" "${names[@]}"
