#!/usr/bin/env bash
# Watch seed sweeps started in the background on the GPU machine, across back-to-back device commands:
#
#   (PE=pope SEEDS=4-7 LIMIT=100000 setsid nohup bash scripts/gpu_sweep_indirect.sh > /tmp/sweep-pope.log 2>&1 &)
#   bash scripts/gpu_sweep_monitor.sh 540 pope          # first command; then the same line again, command after command
#
# gpu_sweep_monitor.sh SECONDS NAME...: about every 60 s, print each seed's step, step time and latest valid/test
# accuracy for the sweeps NAME... under $RUNS, and archive their small files (metrics.jsonl, JSON, logs; no
# checkpoints) into $OUT/sweep-NAME.tar.gz, so a command that ends (or a machine that goes away) loses at most a
# minute of curves. It returns after SECONDS (never later: its last wait is cut short; give <= 540 for a 600 s
# command) or as soon as every sweep log matching $LOGS shows that its sweep script has ended (the script's last
# step prints its fp32 re-score table). Start each concurrent sweep with its own log.
# Settings (environment): RUNS (/tmp/pope-runs), OUT (/tmp/out), LOGS (glob of the sweep logs, /tmp/sweep*.log).
set -u
limit=${1:?usage: gpu_sweep_monitor.sh SECONDS NAME...}; shift
[ $# -gt 0 ] || { echo "gpu_sweep_monitor.sh: name at least one sweep (its directory under \$RUNS)" >&2; exit 2; }
RUNS=${RUNS:-/tmp/pope-runs}; OUT=${OUT:-/tmp/out}; LOGS=${LOGS:-/tmp/sweep*.log}
mkdir -p "$OUT"
ended() {  # every sweep log exists and shows its script's end
  local log found=0
  for log in $LOGS; do
    [ -f "$log" ] || return 1
    grep -q "fp32 re-score" "$log" || return 1
    found=1
  done
  [ $found = 1 ]
}
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
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        evals = [r for r in records if r.get("kind") == "eval"]
        trains = [r for r in records if r.get("kind") == "train"]
        summary = run / "summary.json"
        finished = summary.exists() and json.loads(summary.read_text()).get("finished", False)
        last = evals[-1] if evals else {}
        step_ms = f"{trains[-1]['step_ms']:.2f}" if trains and "step_ms" in trains[-1] else "-"
        print(f"{name}/{run.name}: step {records[-1]['step'] if records else 0} finished={finished} "
              f"ms/step={step_ms} valid_acc={last.get('valid_accuracy', '-')} "
              f"test_acc={last.get('test_accuracy', '-')}", flush=True)
PY
}
while :; do
  status "$@"
  archive "$@"
  ended && echo "sweeps ended" && break
  left=$((limit - SECONDS))
  [ $left -le 0 ] && break
  for _ in $(seq 1 $((left < 60 ? left : 60))); do ended && break; sleep 1; done
done
archive "$@"
for log in $LOGS; do [ -f "$log" ] && { cp "$log" "$OUT/"; echo "== $log"; tail -12 "$log"; }; done
ls -la "$OUT"
