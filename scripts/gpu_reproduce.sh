#!/usr/bin/env bash
# The reproduction table's GPU runs (results/REPRODUCTION.md), one stage per 10-minute command on one H200:
#
#   STAGE=jsb    bash scripts/gpu_reproduce.sh   # JSB, paper model/recipe: PoPE (delta uniform) vs RoPE, 5 seeds each
#   STAGE=genome bash scripts/gpu_reproduce.sh   # genome-h200 (8 x 512, 1000 tokens): PoPE vs RoPE, 2 seeds each,
#                                                # then zero-shot length extrapolation on the genome test split
#   STAGE=text   bash scripts/gpu_reproduce.sh   # text-256: RoPE, PoPE d=0 (3 seeds), PoPE d=U, ALiBi, NoPE (1);
#                                                # YaRN and PoPE+ft (fine-tune at 4x); pope eval length at 1x..20x;
#                                                # frequency usage; pope report
#
# Run a stage again on the same machine to continue it: every `pope train --seeds` call is `--resume` (finished
# seeds are skipped, unfinished ones continue from checkpoints/last), each seed stops itself after LIMIT seconds
# of training (train.max_seconds) with a checkpoint, and the evaluations of a stage run only on finished runs
# whose results are not there yet. The small files of every run under RUNS (metrics.jsonl, config/summary/env
# JSON, sweep logs, eval/ outputs and plots; no checkpoints) go into ONE archive $OUT/reproduce-$STAGE.tar.gz.
#
# Estimated run times (H200, from the model sizes; to be replaced by the measured ones): JSB 6 x 256 (4.8M
# parameters, batch 4 x <= 2048 tokens, dropout 0.2 so no CUDA graph) is launch-bound at ~25 ms a step:
# 3000 steps + 30 whole-split evaluations ~ 1.5-2 min alone, ~3-4 min with 5 seeds of each encoding sharing
# the GPU. genome-h200 (~27M parameters, 64k tokens a step, ~1e13 FLOP a step): ~0.1 s a step alone, 2000
# steps in ~7 min with 4 runs sharing the GPU. text-256 (6 x 384, 8k tokens a step): ~40 s alone, 9 runs in
# ~4 min; each fine-tune (batch 64 x 1024) ~2 min.
#
# Settings (environment): STAGE (required: jsb, genome or text), LIMIT (training seconds per seed and call;
# default 480 for jsb/genome, 200 for text), JOBS_PER_GPU (default 4; the jsb stage runs its two sweeps side by
# side with 3 each), JSB_PRESET (jsb), GENOME_PRESET (genome-h200), TEXT_PRESET (text-256), JSB_SEEDS (0-4),
# GENOME_SEEDS (0-1), TEXT_SEEDS (0-2, RoPE and PoPE d=0), FT_STEPS (500), EXTRA (more arguments for every
# `pope train`, e.g. "--set train.device=cpu"), FT_EXTRA (more arguments for `pope finetune`), EVAL_ARGS (more arguments for
# `pope eval length`), RUNS (/tmp/pope-runs), OUT (/tmp/out). The data must be prepared (or its offline
# sources present) in $POPE_CACHE: the GPU machine reaches no network.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STAGE=${STAGE:-}; EXTRA=${EXTRA:-}; FT_EXTRA=${FT_EXTRA:-}; EVAL_ARGS=${EVAL_ARGS:-}; JOBS_PER_GPU=${JOBS_PER_GPU:-4}
JSB_PRESET=${JSB_PRESET:-jsb}; GENOME_PRESET=${GENOME_PRESET:-genome-h200}; TEXT_PRESET=${TEXT_PRESET:-text-256}
JSB_SEEDS=${JSB_SEEDS:-0-4}; GENOME_SEEDS=${GENOME_SEEDS:-0-1}; TEXT_SEEDS=${TEXT_SEEDS:-0-2}; FT_STEPS=${FT_STEPS:-500}
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/pope-runs}
case "$STAGE" in
  jsb|genome) LIMIT=${LIMIT:-480} ;;
  text) LIMIT=${LIMIT:-200} ;;
  *) echo "gpu_reproduce.sh: STAGE must be jsb, genome or text (got '${STAGE}')" >&2; exit 2 ;;
esac
case "$LIMIT$FT_STEPS$JOBS_PER_GPU" in
  *[!0-9]*) echo "gpu_reproduce.sh: LIMIT, FT_STEPS and JOBS_PER_GPU must be whole numbers" >&2; exit 2 ;;
esac
pope() { python3 -m pope.cli "$@"; }
mkdir -p "$OUT" "$RUNS"
status=0

# sweep PRESET PE SEEDS NAME [JOBS]: one resumable seed sweep into $RUNS/NAME, logged in $RUNS/NAME.log
sweep() {
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  pope train "$1" --pe "$2" --seeds "$3" --out "$RUNS/$4" --resume --jobs-per-gpu "${5:-$JOBS_PER_GPU}" \
    --set train.max_seconds="$LIMIT" --set train.progress=false $EXTRA >"$RUNS/$4.log" 2>&1
  local rc=$?
  echo "sweep $4 exit status $rc"
  [ "$rc" -eq 0 ] || status=1
}
finished() {
  python3 -c "import sys; from pathlib import Path; from pope.train.sweep import run_finished
sys.exit(not run_finished(Path(sys.argv[1])))" "$1"
}
# lengths SWEEP FACTOR...: the training length of the sweep's runs (recipe.seq_len of a seed's config.json)
# times each factor, comma-separated (empty when no seed has started)
lengths() {
  local config; config=$(ls "$RUNS/$1"/seed-*/config.json 2>/dev/null | head -n 1); shift
  [ -n "$config" ] || return 0
  local n; n=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['recipe']['seq_len'])" "$config")
  local out=""; for f in "$@"; do out="$out${out:+,}$((n * f))"; done; echo "$out"
}
# length_eval NAME DATA LENGTHS RUN...: pope eval length over the finished runs, into $RUNS/length-NAME
length_eval() {
  local name=$1 data=$2 lens=$3; shift 3
  [ -n "$lens" ] || { echo "length $name: no run has started"; return; }
  local done_runs=(); for run in "$@"; do [ -d "$run" ] && finished "$run" && done_runs+=("$run"); done
  [ "${#done_runs[@]}" -gt 0 ] || { echo "length $name: no finished run yet"; return; }
  # shellcheck disable=SC2086
  pope eval length "${done_runs[@]}" --data "$data" --lengths "$lens" --out "$RUNS/length-$name" $EVAL_ARGS \
    || status=1
}

case "$STAGE" in
  jsb)
    pope data prepare jsb >/dev/null || exit 1
    sweep "$JSB_PRESET" pope "$JSB_SEEDS" jsb-pope 3 &
    sweep "$JSB_PRESET" rope "$JSB_SEEDS" jsb-rope 3 &
    wait
    pope report "$RUNS/jsb-pope" "$RUNS/jsb-rope" --out "$RUNS/report-jsb" || status=1
    ;;
  genome)
    pope data prepare genome >/dev/null || exit 1
    sweep "$GENOME_PRESET" pope "$GENOME_SEEDS" genome-pope
    sweep "$GENOME_PRESET" rope "$GENOME_SEEDS" genome-rope
    length_eval genome genome "$(lengths genome-rope 1 2 4 8 10)" "$RUNS"/genome-pope/seed-* "$RUNS"/genome-rope/seed-*
    pope report "$RUNS/genome-pope" "$RUNS/genome-rope" --out "$RUNS/report-genome" || status=1
    ;;
  text)
    pope data prepare text >/dev/null || exit 1
    sweep "$TEXT_PRESET" rope "$TEXT_SEEDS" text-rope &
    sweep "$TEXT_PRESET" pope:delta_init=zero "$TEXT_SEEDS" text-pope-d0 &
    sweep "$TEXT_PRESET" pope:delta_init=uniform 0 text-pope-du &
    sweep "$TEXT_PRESET" alibi 0 text-alibi &
    sweep "$TEXT_PRESET" nope 0 text-nope &
    wait
    context=$(lengths text-rope 4)
    for source in text-rope text-pope-d0; do  # RoPE -> YaRN, PoPE -> PoPE+ft (pope finetune picks the method)
      run="$RUNS/$source/seed-0"; ft="$RUNS/$source-ft$context"
      if [ -n "$context" ] && [ -d "$run" ] && finished "$run" && ! { [ -d "$ft" ] && finished "$ft"; }; then
        resume=(); [ -d "$ft/checkpoints/last" ] && resume=(--resume)
        # shellcheck disable=SC2086
        pope finetune "$run" --context "$context" --steps "$FT_STEPS" --out "$ft" "${resume[@]}" \
          --set train.max_seconds="$LIMIT" --set train.progress=false $FT_EXTRA >"$ft.log" 2>&1 || status=1
      fi
    done
    text_runs=("$RUNS"/text-*/seed-* "$RUNS"/text-*-ft"$context")
    length_eval text text "$(lengths text-rope 1 2 4 8 10)" "${text_runs[@]}"
    length_eval text-long text "$(lengths text-rope 16 20)" "${text_runs[@]}"
    for run in "$RUNS"/text-rope/seed-0 "$RUNS"/text-pope-d0/seed-0 "$RUNS"/text-pope-du/seed-0; do
      if [ -d "$run" ] && finished "$run" && [ ! -e "$run/eval/frequencies/frequency_usage.json" ]; then
        pope analyze frequencies "$run" --data text --split test || status=1
      fi
    done
    reported=(); for run in "$RUNS"/text-*/; do [ -f "$run/sweep.json" ] || [ -f "$run/config.json" ] && reported+=("$run"); done
    [ "${#reported[@]}" -eq 0 ] || pope report "${reported[@]}" --out "$RUNS/report-text" || status=1
    ;;
esac

(cd "$RUNS" && find . -maxdepth 5 \( -name metrics.jsonl -o -name '*.json' -o -name '*.log' -o -name '*.md' \
   -o -name '*.csv' -o -name '*.png' \) -not -path '*/checkpoints/*' -not -path '*/tensorboard/*' -print0 \
   | tar czf "$OUT/reproduce-$STAGE.tar.gz" --null -T -)
ls -la "$OUT"
echo "stage $STAGE exit status $status"
exit $status
