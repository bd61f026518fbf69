# Sourced by scripts/gpu_sweeps.sh and scripts/gpu_sweep_monitor.sh: which processes of the machine belong to a
# background seed sweep. A sweep NAME is alive while any of these runs:
#   - its sweep script (argv[1] is $SWEEP_SCRIPT's file name, NAME and RUNS from its environment, defaulting as
#     scripts/gpu_sweep_indirect.sh does: NAME=${NAME:-${PE:-pope}}, RUNS=/tmp/pope-runs);
#   - its `pope train --seeds` process or one of its seeds (an argument `--out $RUNS/NAME` or `$RUNS/NAME/seed-N`),
#     so a seed left training by a killed script is never joined by a second process on the same run directory.
# Only argv is matched, never a whole command line: a shell whose command merely mentions the script is not a sweep.
# sweep_log_ended NAME: the sweep's log $LOG_DIR/sweep-NAME.log shows its script's last step (the fp32 re-score table
# that scripts/gpu_sweep_indirect.sh prints at its end).
# Settings (environment): RUNS (/tmp/pope-runs), SWEEP_SCRIPT (scripts/gpu_sweep_indirect.sh), LOG_DIR (/tmp).
RUNS=${RUNS:-/tmp/pope-runs}
SWEEP_SCRIPT=${SWEEP_SCRIPT:-scripts/gpu_sweep_indirect.sh}
LOG_DIR=${LOG_DIR:-/tmp}

sweep_log_ended() { grep -qs "fp32 re-score" "$LOG_DIR/sweep-$1.log"; }

sweep_pids() {  # NAME...: the ids of the live processes of these sweeps, one a line
  local dir pid name want i out runs script=${SWEEP_SCRIPT##*/}
  local -a argv environ
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    [ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] && continue
    mapfile -d "" -t argv 2>/dev/null < "$dir/cmdline" || continue
    [ ${#argv[@]} -ge 2 ] || continue  # a zombie has no argv
    name=
    if [ "${argv[1]##*/}" = "$script" ]; then
      mapfile -d "" -t environ 2>/dev/null < "$dir/environ" || continue
      local NAME= PE= runs_env=
      for i in "${environ[@]}"; do
        case $i in NAME=*) NAME=${i#NAME=} ;; PE=*) PE=${i#PE=} ;; RUNS=*) runs_env=${i#RUNS=} ;; esac
      done
      [ "${runs_env:-/tmp/pope-runs}" = "$RUNS" ] && name=${NAME:-${PE:-pope}}
    else
      out=
      for ((i = 0; i < ${#argv[@]} - 1; i++)); do [ "${argv[i]}" = --out ] && out=${argv[i + 1]}; done
      case $out in "$RUNS"/*) out=${out#"$RUNS"/}; name=${out%%/*} ;; esac
    fi
    [ -n "$name" ] || continue
    for want in "$@"; do [ "$name" = "$want" ] && { echo "$pid"; break; }; done
  done
}
