#!/usr/bin/env bash
# Stages of scripts/gpu_reproduce.sh in the background, so that several stages share the GPU and outlive one
# 10-minute device command. The same line goes into every device command of a lease:
#
#   OUT=$OUT bash scripts/gpu_reproduce_bg.sh 560 text genome      # carry .device-data/text and .device-data/genome
#
# gpu_reproduce_bg.sh SECONDS STAGE... first brings each stage to the state it should be in, one line each:
#   STAGE: ended (exit status N)   its log ends with gpu_reproduce.sh's "stage STAGE exit status N" and it ran with
#                                  this call's settings: left alone
#   STAGE: running (pid N)         its gpu_reproduce.sh is alive: left alone (the line names any setting of this call
#                                  that differs from the running stage's: call again after it ends to run those)
#   STAGE: started (pid N)         neither, or it ended with other settings (the line names them): started in its own
#                                  session (setsid nohup), resuming every run of it that $RUNS holds
#                                  (gpu_reproduce.sh always resumes and skips finished runs; on a fresh machine it
#                                  starts anew). The settings are the variables gpu_reproduce.sh reads (GENOME_MORE_THIRD,
#                                  ABLATION_SEEDS, EXTRA, ...; see settings_now below), recorded at each start in
#                                  $LOG_DIR/reproduce-STAGE.settings, so a second unit of a stage on a warm machine runs
#                                  without a LOG_DIR of its own.
# CUDA MPS is turned on before the first start when no stage is running (scripts/gpu_mps.sh; MPS=off skips it).
# Each stage runs with LIMIT=100000 training seconds per seed (it ends on its own, not at a command's end), its log
# in $LOG_DIR/reproduce-STAGE.log and its archive in $LOG_DIR/out-STAGE. Then it waits until every stage has ended
# or SECONDS have passed (give <= 560 for a 600 s command), and copies into $OUT, per stage, the log and the
# archive: the stage's own when it has ended, else one made now of what $RUNS holds so far (partial results come
# back even from a lease that ends mid-stage). Last, one line per stage. Exit status: 0 when every stage ended
# with 0, 3 when a stage is still running, 1 otherwise.
# Stages side by side share the GPU's memory: the text and genome stages together (13 training processes) overfilled
# an H200 (gpu_reproduce.sh's header has each run's memory); the sweeps requeue a seed that fails with CUDA out of
# memory at its start until another seed has finished, and a second call restarts whatever still failed.
# Settings (environment): OUT (this command's $OUT; default /tmp/out), RUNS (/tmp/pope-runs), LOG_DIR (/tmp),
# MPS (on), and anything gpu_reproduce.sh reads (GENOME_SEEDS, TEXT_SEEDS, ...), passed on to every stage.
set -u
usage="usage: gpu_reproduce_bg.sh SECONDS STAGE... (STAGE: jsb, maestro, genome, genome-more, text or text-ablations)"
limit=${1:-}; shift || true
case $limit in ''|*[!0-9]*) echo "gpu_reproduce_bg.sh: SECONDS must be a whole number, not '$limit'; $usage" >&2; exit 2 ;; esac
[ $# -gt 0 ] || { echo "gpu_reproduce_bg.sh: name at least one stage; $usage" >&2; exit 2; }
for stage in "$@"; do
  case $stage in jsb|maestro|genome|genome-more|text|text-ablations) ;; *) echo "gpu_reproduce_bg.sh: unknown stage '$stage'; $usage" >&2; exit 2 ;; esac
done
here=$(dirname "$0")
export RUNS=${RUNS:-/tmp/pope-runs}
OUT=${OUT:-/tmp/out}; LOG_DIR=${LOG_DIR:-/tmp}
mkdir -p "$OUT" "$LOG_DIR" "$RUNS"

log_of() { echo "$LOG_DIR/reproduce-$1.log"; }
settings_now() {  # the settings gpu_reproduce.sh reads, one "NAME=VALUE" or "NAME unset" line each (empty != unset)
  local name
  for name in JOBS_PER_GPU JSB_PRESET JSB_SEEDS MAESTRO_PRESET MAESTRO_SEEDS MAESTRO_STEPS GENOME_PRESET GENOME_SEEDS \
              GENOME_MORE_SEED GENOME_MORE_BASELINES GENOME_MORE_THIRD GENOME_MORE_FINETUNE TEXT_PRESET TEXT_SEEDS \
              ABLATIONS ABLATION_SEEDS FT_STEPS EXTRA FT_EXTRA EVAL_ARGS DATA; do
    if [ -n "${!name+set}" ]; then printf '%s=%s\n' "$name" "${!name}"; else printf '%s unset\n' "$name"; fi
  done
}
settings_changed() {  # STAGE: "OLD -> NEW; ..." for each setting that differs from those it was started with, or
  # nothing (also when none were recorded)
  local file="$LOG_DIR/reproduce-$1.settings" line name old out=""
  [ -f "$file" ] || return 0
  while IFS= read -r line; do
    name=${line%%[= ]*}
    old=$(grep -m 1 -E "^$name[= ]" "$file")
    [ "$old" = "$line" ] || out+="${out:+; }${old:-$name unrecorded} -> $line"
  done < <(settings_now)
  echo "$out"
}
ended_status() {  # STAGE: the exit status its log ends with, or nothing while it has not ended
  sed -n "s/^stage $1 exit status \([0-9]*\)$/\1/p" "$(log_of "$1")" 2>/dev/null | tail -n 1
}
alive() {  # STAGE: the pid of its running gpu_reproduce.sh, or nothing
  local pid; pid=$(cat "$LOG_DIR/reproduce-$1.pid" 2>/dev/null) || return 0
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null \
    | grep -q "gpu_reproduce.sh" && echo "$pid"
  return 0
}

running=0; for stage in "$@"; do [ -n "$(alive "$stage")" ] && running=1; done
mps_done=0
for stage in "$@"; do
  status=$(ended_status "$stage"); pid=$(alive "$stage"); changed=$(settings_changed "$stage"); why=""
  if [ -n "$pid" ]; then
    note=""; [ -z "$changed" ] || note="; left alone with the settings it started with, not those of this call"
    echo "$stage: running (pid $pid)${note:+$note ($changed): call again after it ends to run them}"
    continue
  fi
  if [ -n "$status" ]; then
    [ -n "$changed" ] || { echo "$stage: ended (exit status $status)"; continue; }
    why="; it had ended (exit status $status) with other settings: $changed"
  fi
  if [ $mps_done = 0 ] && [ $running = 0 ] && [ "${MPS:-on}" != off ]; then bash "$here/gpu_mps.sh" start; fi
  mps_done=1
  log=$(log_of "$stage"); [ -f "$log" ] && mv "$log" "$log.previous"
  pid=$(env STAGE="$stage" LIMIT=100000 OUT="$LOG_DIR/out-$stage" setsid nohup bash "$here/gpu_reproduce.sh" \
        > "$log" 2>&1 < /dev/null & echo $!)
  echo "$pid" > "$LOG_DIR/reproduce-$stage.pid"
  settings_now > "$LOG_DIR/reproduce-$stage.settings"
  # until the child has exec'd gpu_reproduce.sh it is a copy of this shell, which alive() does not count: wait for
  # it (at most 10 s), or a loaded machine ends the wait below at once and calls a starting stage "running"
  for _ in $(seq 1 100); do { [ -n "$(alive "$stage")" ] || [ -n "$(ended_status "$stage")" ]; } && break; sleep 0.1; done
  echo "$stage: started (pid $pid, log $log$why)"
done

while [ "$SECONDS" -lt "$limit" ]; do
  left=0; for stage in "$@"; do [ -n "$(alive "$stage")" ] && left=1; done
  [ $left = 0 ] && break
  sleep 10
done

exit_status=0
for stage in "$@"; do
  status=$(ended_status "$stage"); pid=$(alive "$stage")
  cp "$(log_of "$stage")" "$OUT/" 2>/dev/null
  if [ -n "$status" ] && [ -f "$LOG_DIR/out-$stage/reproduce-$stage.tar.gz" ]; then
    cp "$LOG_DIR/out-$stage/reproduce-$stage.tar.gz" "$OUT/"
  else
    STAGE=$stage OUT="$OUT" ARCHIVE_ONLY=1 ARCHIVE_NAME="$stage-partial" bash "$here/gpu_reproduce.sh" > /dev/null 2>&1
  fi
  if [ -n "$pid" ]; then state="running (pid $pid)"; exit_status=3
  elif [ -n "$status" ]; then state="ended (exit status $status)"; [ "$status" = 0 ] || [ $exit_status = 3 ] || exit_status=1
  else state="stopped without ending (the next call resumes it)"; [ $exit_status = 3 ] || exit_status=1
  fi
  echo "== $stage: $state after ${SECONDS}s; log tail:"
  tr "\r" "\n" < "$(log_of "$stage")" 2>/dev/null | tail -n 8
done
ls -la "$OUT"
exit $exit_status
