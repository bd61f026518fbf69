#!/usr/bin/env bash
# Watch seed sweeps running in the background on the GPU machine, across back-to-back device commands. Start and
# watch them with scripts/gpu_sweeps.sh (which calls this script); by hand:
#
#   (NAME=pope SEEDS=4-7 LIMIT=100000 setsid nohup bash scripts/gpu_sweep_indirect.sh > /tmp/sweep-pope.log 2>&1 &)
#   bash scripts/gpu_sweep_monitor.sh 540 pope          # first command; then the same line again, command after command
#
# gpu_sweep_monitor.sh SECONDS NAME...: about every 60 s, print each seed's step, step time, the time the rest of
# its schedule takes at that step time (left=, evaluations not counted: whether it fits the lease) and latest
# valid/test accuracy for the sweeps NAME... under $RUNS, and archive their small files (metrics.jsonl, JSON, logs; no
# checkpoints) into $OUT/sweep-NAME.tar.gz, so a command that ends (or a machine that goes away) loses at most a
# minute of curves. It returns after SECONDS (never later: its last wait is cut short; give <= 540 for a 600 s
# command), or as soon as
#   - every sweep's log $LOG_DIR/sweep-NAME.log shows that its sweep script has ended (the script's last step
#     prints its fp32 re-score table) and none of its processes is left: "sweeps ended", exit 0;
#   - no process of the sweeps is alive any more although a log lacks that end (a crash, a killed script): it
#     says which, exit 1; scripts/gpu_sweeps.sh resumes them;
# and at once, exit 3, when none of the sweeps has a directory under $RUNS and none of their processes runs: a
# fresh machine (the previous one was given back, and its runs with it), with nothing to watch.
# Settings (environment): RUNS (/tmp/pope-runs), OUT (/tmp/out), LOG_DIR (the sweep logs' directory, /tmp),
# SWEEP_SCRIPT (the sweep script whose processes count as alive, scripts/gpu_sweep_indirect.sh).
set -u
limit=${1:?usage: gpu_sweep_monitor.sh SECONDS NAME...}; shift
[ $# -gt 0 ] || { echo "gpu_sweep_monitor.sh: name at least one sweep (its directory under \$RUNS)" >&2; exit 2; }
case $limit in
  ''|*[!0-9]*) echo "gpu_sweep_monitor.sh: SECONDS must be a whole number, not '$limit'" >&2; exit 2 ;;
esac
RUNS=${RUNS:-/tmp/pope-runs}; OUT=${OUT:-/tmp/out}; LOG_DIR=${LOG_DIR:-/tmp}
# shellcheck source=scripts/gpu_sweep_processes.sh
. "$(dirname "$0")/gpu_sweep_processes.sh"
mkdir -p "$OUT"
unended() {  # the sweeps NAME... whose log is missing or lacks the end of its script, or whose script still runs
  local name
  for name in "$@"; do
    sweep_log_ended "$name" && [ -z "$(sweep_pids "$name")" ] || echo "$name"
  done
}
if [ -z "$(sweep_pids "$@")" ]; then
  present=0
  for name in "$@"; do [ -d "$RUNS/$name" ] && present=1; done
  if [ $present = 0 ]; then
    echo "gpu_sweep_monitor.sh: nothing to watch: no sweep $* under $RUNS and no sweep process (a fresh machine? the" \
         "previous one was given back); start the sweeps again (scripts/gpu_sweeps.sh does it)"
    exit 3
  fi
fi
archive() {
  local name
  for name in "$@"; do
    [ -d "$RUNS/$name" ] || continue
    (cd "$RUNS" && find "$name" -maxdepth 3 \( -name metrics.jsonl -o -name '*.json' -o -name '*.log' \) \
       -not -path '*/checkpoints/*' -print0 | tar czf "$OUT/sweep-$name.tar.gz" --null -T -)
  done
}
status() {
  python3 - "$RUNS" "$@" <<'PY'
import json, sys
from pathlib import Path
runs = Path(sys.argv[1])
for name in sys.argv[2:]:
    for run in sorted((runs / name).glob("seed-*/"), key=lambda p: int(p.name.split("-")[1])):
        path = run / "metrics.jsonl"
        records = []
        for line in (path.read_text().splitlines() if path.exists() else []):
            try:
                records.append(json.loads(line))
            except ValueError:
                pass  # the line being written
        evals = [r for r in records if r.get("kind") == "eval"]
        trains = [r for r in records if r.get("kind") == "train"]
        summary = run / "summary.json"
        finished = summary.exists() and json.loads(summary.read_text()).get("finished", False)
        last = evals[-1] if evals else {}
        step = records[-1]["step"] if records else 0
        step_ms = trains[-1].get("step_ms") if trains else None
        # the time the rest of the schedule takes at the last step time (without evaluations): whether it fits
        try:
            total = json.loads((run / "config.json").read_text())["recipe"]["max_steps"]
        except (OSError, ValueError, KeyError):
            total = None
        left = (f"{(total - step) * step_ms / 1000:.0f}s" if step_ms is not None and total is not None
                and not finished else "-")
        print(f"{name}/{run.name}: step {step} finished={finished} "
              f"ms/step={'-' if step_ms is None else f'{step_ms:.2f}'} left={left} "
              f"valid_acc={last.get('valid_accuracy', '-')} test_acc={last.get('test_accuracy', '-')}", flush=True)
PY
}
verdict=0
while :; do
  status "$@"
  archive "$@"
  [ -z "$(unended "$@")" ] && echo "sweeps ended" && break
  if [ -z "$(sweep_pids "$@")" ]; then
    [ -z "$(unended "$@")" ] && echo "sweeps ended" && break  # it ended between the two looks
    echo "no sweep process alive, but $(unended "$@" | tr '\n' ' ')did not end (a crash or a kill? see the log tails" \
         "below); scripts/gpu_sweeps.sh resumes them"
    verdict=1; break
  fi
  left=$((limit - SECONDS))
  [ $left -le 0 ] && break
  for i in $(seq 1 $((left < 60 ? left : 60))); do
    [ -z "$(unended "$@")" ] && break
    [ $((i % 5)) = 0 ] && [ -z "$(sweep_pids "$@")" ] && break  # every 5 s: a crash is noticed soon, cheaply
    sleep 1
  done
done
archive "$@"
for name in "$@"; do
  log=$LOG_DIR/sweep-$name.log
  [ -f "$log" ] && { cp "$log" "$OUT/"; echo "== $log"; tail -12 "$log"; }
done
ls -la "$OUT"
exit $verdict
