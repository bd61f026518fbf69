#!/usr/bin/env bash
# The reproduction table's GPU runs (results/REPRODUCTION.md), one stage per 10-minute command on one H200:
#
#   STAGE=jsb     bash scripts/gpu_reproduce.sh  # JSB, paper model/recipe: PoPE (delta uniform) vs RoPE, 5 seeds each
#   STAGE=maestro bash scripts/gpu_reproduce.sh  # MAESTRO stand-in (10 offline performances), paper model with
#                                                # best-valid checkpointing, 2000 steps: PoPE d=U vs RoPE, 2 seeds each
#   STAGE=genome bash scripts/gpu_reproduce.sh   # genome-h200 (8 x 512, 1000 tokens): PoPE d=U (the paper's init
#                                                # for the genome) vs RoPE, and PoPE d=0 (the paper's init for length
#                                                # extrapolation), 2 seeds each; then zero-shot length extrapolation
#                                                # of all three at 1x..10x on the genome test split
#   STAGE=genome-more bash scripts/gpu_reproduce.sh  # genome-h200: the rest of the extrapolation field on the
#                                                # genome: ALiBi and NoPE (seed 0), a third seed of PoPE d=U, RoPE
#                                                # and PoPE d=0 (GENOME_MORE_SEED, 2), YaRN and PoPE+ft fine-tuned at
#                                                # 4x from that seed; zero-shot length extrapolation of all seven at
#                                                # 1x..10x; frequency usage of the three third seeds
#   STAGE=text   bash scripts/gpu_reproduce.sh   # text-256: RoPE, PoPE d=0 (3 seeds), PoPE d=U, ALiBi, NoPE (1);
#                                                # YaRN and PoPE+ft (fine-tune at 4x); pope eval length at 1x..20x;
#                                                # frequency usage; pope report
#   STAGE=text-ablations bash scripts/gpu_reproduce.sh  # the paper's OpenWebText ablations at text-256 scale:
#                                                # PoPE d=0 (full), identity magnitude (no softplus), ReLU magnitude,
#                                                # no delta (ABLATIONS), ABLATION_SEEDS (0-1) each, side by side;
#                                                # pope eval length at 1x..10x; pope report --against the full PoPE
#
# Data: the GPU machine reaches no network, so each stage's prepared dataset travels with the command. Build it
# here with `bash scripts/device_data.sh STAGE` (-> .device-data/STAGE, ignored by git; sizes: jsb 0.6 MiB,
# maestro 0.8 MiB, genome 23.2 MiB, text 6.6 MiB) and pass carry [".device-data/STAGE"] to the run. The stage
# then reads it through POPE_DATA_DIR (after re-hashing it against its manifest) and prepares nothing; without a
# carried folder it prepares from the offline sources in $POPE_CACHE (which need music21/miditok/tiktoken).
#
# Run a stage again on the same machine to continue it: every `pope train --seeds` call is `--resume` (finished
# seeds are skipped, unfinished ones continue from checkpoints/last), each seed stops itself after LIMIT seconds
# of training (train.max_seconds) with a checkpoint, and the evaluations of a stage run only on finished runs
# whose results are not there yet. The small files of every run under RUNS (metrics.jsonl, config/summary/env
# JSON, sweep logs, eval/ outputs and plots; no checkpoints) go into ONE archive $OUT/reproduce-$STAGE.tar.gz.
#
# Run times on one H200 (CUDA MPS on, `bash scripts/gpu_mps.sh start` first), measured 2026-12-01 at 5dd6de5:
# jsb: 78-134 s a run (3000 steps + 30 whole-split evaluations, 6 of the 10 runs at once), 295 s for the stage;
# maestro: 166-178 s a run (2000 steps, 40 evaluations, all 4 at once), ~200 s for the stage; its validation
# minimum came at step 350-500 of 2000, well inside the budget (results/maestro/README.md), so more seeds
# (MAESTRO_SEEDS=0-4) fit one command. genome and text, measured 2026-12-02 at 664e90d with both stages side by
# side in the background (scripts/gpu_reproduce_bg.sh, 13 training processes at once): genome-h200 (27.3M parameters,
# 64k tokens a step) 687 s a run (2000 steps, ~285 ms a step shared), the stage's 4 runs in ~12 min; text-256 (29.9M
# parameters, 8k tokens a step) 300-470 s a run shared, 74 s a run two at a time, each fine-tune (batch 64 x 1024,
# 500 steps) 96-161 s, the stage in ~15 min. GPU memory: each genome run held 14.5-17.1 GiB, each text run 7.2-8.8
# GiB, so the two stages at once (13 processes) overfilled the H200's 139 GiB and two text seeds failed at their start
# (CUDA out of memory; a rerun with --resume restarts them). Since 2026-12-04 the genome stage also trains PoPE d=0
# (6 runs, ~100 GiB together): run it alone, not beside the text stage. The maestro budget: the 318k training tokens are ~10
# steps an epoch, so 2000 steps are ~200 epochs, far past the validation minimum (the paper's own JSB and MAESTRO
# budgets are ~50 epochs); checkpoints/best keeps the minimum, and summary.json's best_step shows whether it lies
# well inside the budget (if it is near 2000, rerun with a larger MAESTRO_STEPS).
#
# The genome-more stage on one H200 (2026-12-04, 9ca91c5/fe1abe4, MPS on): its five training runs side by side took
# 444 s (NoPE) and would have taken ~11 min (PoPE at ~1,600 of 2,000 steps after 545 s); four of them (PoPE d=U,
# RoPE, PoPE d=0 seed 2 and ALiBi; GENOME_MORE_BASELINES=alibi GENOME_MORE_FINETUNE=0) took 450-496 s, and the
# length evaluation did not finish in the 530-s command that held them. A fresh machine starts a stage from step 0
# (checkpoints never leave the machine), so size each device command to end with results: three or four training
# runs and their evaluation, not five plus fine-tunes, unless the next command is certain to find the machine warm
# (it is given back 30 s after a command ends). Each fine-tune is batch 64 x 4000 tokens as 2 micro-batches of 32,
# 500 steps (one H100: YaRN 167 s at 278 ms a step, PoPE+ft 216 s at 372 ms). Two training runs side by side with
# their length evaluation took 294 s (ALiBi and NoPE, 2026-12-04 at 631cc68). One-command units: GENOME_MORE_SEED=
# GENOME_MORE_FINETUNE=0 (ALiBi and NoPE), GENOME_MORE_BASELINES= GENOME_MORE_THIRD=rope (RoPE seed 2 and its YaRN
# fine-tune), the same with GENOME_MORE_THIRD=pope-d0 (PoPE d=0 and PoPE+ft), and GENOME_MORE_THIRD=pope
# GENOME_MORE_FINETUNE=0 (PoPE d=U); each retrains its run of the third seed. It carries .device-data/genome like
# the genome stage.
# On one H100 (2026-12-05, 93efff1, MPS on): GENOME_MORE_BASELINES= GENOME_MORE_THIRD="pope rope" GENOME_MORE_FINETUNE=0
# (two runs side by side, their length evaluation and frequency analysis) took 386 s, GENOME_MORE_THIRD=pope-d0 with
# GENOME_MORE_FINETUNE=0 alone 224 s (given LOG_DIR=/tmp/l2 then: gpu_reproduce_bg.sh read the first unit's log as
# the stage's end; since 2026-12-05 it starts a stage again when the settings differ from those it ended with).
# With their fine-tunes (one H100, 2026-12-05, MPS on): GENOME_MORE_BASELINES= GENOME_MORE_THIRD=rope took 415 s
# (3e6d378), GENOME_MORE_BASELINES= GENOME_MORE_THIRD=pope-d0 517 s (28dacc4; 183 s of training, 216 s of PoPE+ft
# fine-tune, then the length evaluation and frequency analysis): close to the 540-s command it ran in.
#
# The text-ablations stage on one H200 (2026-12-04 at db3f89c, MPS on): its eight runs side by side took 140 ms a
# step and the stage, with its length evaluation, 359 s of one command; ABLATION_SEEDS=2 (four runs, 71 ms a step)
# 187 s in another (gpu_reproduce_bg.sh starts it again on a warm machine: its settings differ).
# It carries .device-data/text like the text stage.
#
# Settings (environment): STAGE (required: jsb, maestro, genome, genome-more, text or text-ablations), LIMIT
# (training seconds per seed and call; default 480 for jsb/maestro/genome/genome-more/text-ablations, 200 for text), JOBS_PER_GPU (default 4; the jsb and maestro stages run
# their two sweeps side by side with 3 and 2 each), JSB_PRESET (jsb), MAESTRO_PRESET (maestro), GENOME_PRESET
# (genome-h200), TEXT_PRESET (text-256), JSB_SEEDS (0-4), MAESTRO_SEEDS (0-1), GENOME_SEEDS (0-1), TEXT_SEEDS
# (0-2, RoPE and PoPE d=0), ABLATION_SEEDS (0-1), ABLATIONS (the text-ablations settings trained beside the full
# PoPE, default "identity relu no-delta"; also "wrap": delta zero-init, wrapped instead of clamped),
# GENOME_MORE_SEED (2; empty: no third seed, and then no fine-tunes),
# GENOME_MORE_BASELINES (the seed-0 baselines of genome-more, default "alibi nope"; any --pe specs),
# GENOME_MORE_THIRD (the settings of the third seed, default "pope rope pope-d0": PoPE d=U, RoPE, PoPE d=0),
# GENOME_MORE_FINETUNE (1; 0 skips its fine-tunes: YaRN from RoPE and PoPE+ft from PoPE d=0, those of
# GENOME_MORE_THIRD), MAESTRO_STEPS (2000, with warmup 100 and an evaluation every
# 50 steps), FT_STEPS (500), EXTRA (more arguments for every `pope train`, e.g. "--set train.device=cpu"), FT_EXTRA
# (more arguments for `pope finetune`; default "--set recipe.grad_accum=2" in the genome-more stage, nothing
# elsewhere), EVAL_ARGS (more arguments for `pope eval length`), DATA (the carried data folder, default
# .device-data/$STAGE, .device-data/genome for genome-more, .device-data/text for text-ablations), RUNS (/tmp/pope-runs), OUT (/tmp/out), ARCHIVE_ONLY (1: run nothing, only write the
# archive of what RUNS holds now, as $OUT/reproduce-$ARCHIVE_NAME.tar.gz; ARCHIVE_NAME defaults to STAGE).
# scripts/gpu_reproduce_bg.sh runs stages in the background across the device commands of one lease.
set -u
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STAGE=${STAGE:-}; EXTRA=${EXTRA:-}; FT_EXTRA=${FT_EXTRA:-}; EVAL_ARGS=${EVAL_ARGS:-}; JOBS_PER_GPU=${JOBS_PER_GPU:-4}
JSB_PRESET=${JSB_PRESET:-jsb}; GENOME_PRESET=${GENOME_PRESET:-genome-h200}; TEXT_PRESET=${TEXT_PRESET:-text-256}
JSB_SEEDS=${JSB_SEEDS:-0-4}; GENOME_SEEDS=${GENOME_SEEDS:-0-1}; TEXT_SEEDS=${TEXT_SEEDS:-0-2}; FT_STEPS=${FT_STEPS:-500}
ABLATION_SEEDS=${ABLATION_SEEDS:-0-1}; ABLATIONS=${ABLATIONS-identity relu no-delta}
# the text-ablations settings: name (its sweep is ablation-NAME) -> --pe spec; each is trained beside ablation-full
declare -A ABLATION_PE=([identity]=pope:delta_init=zero,magnitude=identity [relu]=pope:delta_init=zero,magnitude=relu
                        [no-delta]=pope:use_delta=false [wrap]=pope:delta_init=zero,delta_range=wrap)
MAESTRO_PRESET=${MAESTRO_PRESET:-maestro}; MAESTRO_SEEDS=${MAESTRO_SEEDS:-0-1}; MAESTRO_STEPS=${MAESTRO_STEPS:-2000}
GENOME_MORE_SEED=${GENOME_MORE_SEED-2}; GENOME_MORE_BASELINES=${GENOME_MORE_BASELINES-alibi nope}
GENOME_MORE_THIRD=${GENOME_MORE_THIRD-pope rope pope-d0}
GENOME_MORE_FINETUNE=${GENOME_MORE_FINETUNE:-1}; OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/pope-runs}
case "$STAGE" in
  jsb|maestro|genome) LIMIT=${LIMIT:-480}; DATA=${DATA:-.device-data/$STAGE} ;;
  genome-more) LIMIT=${LIMIT:-480}; DATA=${DATA:-.device-data/genome}; FT_EXTRA=${FT_EXTRA:---set recipe.grad_accum=2} ;;
  text) LIMIT=${LIMIT:-200}; DATA=${DATA:-.device-data/$STAGE} ;;
  text-ablations) LIMIT=${LIMIT:-480}; DATA=${DATA:-.device-data/text} ;;
  *) echo "gpu_reproduce.sh: STAGE must be jsb, maestro, genome, genome-more, text or text-ablations" \
          "(got '${STAGE}')" >&2; exit 2 ;;
esac
case "$LIMIT$FT_STEPS$JOBS_PER_GPU$MAESTRO_STEPS$GENOME_MORE_SEED$GENOME_MORE_FINETUNE" in
  *[!0-9]*) echo "gpu_reproduce.sh: LIMIT, FT_STEPS, JOBS_PER_GPU, MAESTRO_STEPS, GENOME_MORE_SEED and" \
              "GENOME_MORE_FINETUNE must be whole numbers" >&2
            exit 2 ;;
esac
if [ "$STAGE" = text-ablations ]; then
  for name in $ABLATIONS; do
    [ -n "${ABLATION_PE[$name]:-}" ] || { echo "gpu_reproduce.sh: ABLATIONS takes identity, relu, no-delta and" \
      "wrap, not '$name'" >&2; exit 2; }
  done
fi
# the third seed's settings: name (its sweep is genome-NAME) -> --pe spec; YaRN and PoPE+ft start from rope, pope-d0
declare -A THIRD_PE=([pope]=pope [rope]=rope [pope-d0]=pope:delta_init=zero)
third_names=(); [ -z "$GENOME_MORE_SEED" ] || read -r -a third_names <<<"$GENOME_MORE_THIRD"
if [ "$STAGE" = genome-more ]; then
  ft_sources=()  # the third seed's sweeps that the fine-tunes start from
  for name in "${third_names[@]}"; do
    [ -n "${THIRD_PE[$name]:-}" ] || { echo "gpu_reproduce.sh: GENOME_MORE_THIRD takes pope, rope and pope-d0," \
      "not '$name'" >&2; exit 2; }
    case $name in rope|pope-d0) ft_sources+=(genome-"$name") ;; esac
  done
  [ "$GENOME_MORE_FINETUNE" = 0 ] || [ "${#ft_sources[@]}" -gt 0 ] || { echo "gpu_reproduce.sh: the genome-more" \
    "fine-tunes start from the third seed's rope or pope-d0 run; with GENOME_MORE_SEED empty or neither in" \
    "GENOME_MORE_THIRD set GENOME_MORE_FINETUNE=0" >&2; exit 2; }
  [ "${#third_names[@]}" -gt 0 ] || [ -n "${GENOME_MORE_BASELINES// /}" ] || { echo "gpu_reproduce.sh: no third" \
    "seed (GENOME_MORE_SEED or GENOME_MORE_THIRD empty) and GENOME_MORE_BASELINES empty: the genome-more stage" \
    "would train nothing" >&2; exit 2; }
fi
[ "$MAESTRO_STEPS" -ge 200 ] || { echo "gpu_reproduce.sh: MAESTRO_STEPS must be at least 200 (got $MAESTRO_STEPS)" >&2; exit 2; }
pope() { python3 -m pope.cli "$@"; }
mkdir -p "$OUT" "$RUNS"
status=0

# data_ready NAME: the stage's dataset, from the carried folder $DATA when it holds NAME (every file re-hashed
# against its manifest; POPE_DATA_DIR points every later command there), else prepared from the offline sources
data_ready() {
  if [ -f "$DATA/$1/manifest.json" ]; then
    POPE_DATA_DIR=$(cd "$DATA" && pwd); export POPE_DATA_DIR
    echo "data: $1 from the carried folder $POPE_DATA_DIR/$1"
    pope data info "$1" --verify
  else
    echo "data: no $DATA/$1/manifest.json (bash scripts/device_data.sh $STAGE builds it); preparing $1 from \$POPE_CACHE"
    pope data prepare "$1" --no-progress
  fi
}
# sweep PRESET PE SEEDS NAME [JOBS]: one resumable seed sweep into $RUNS/NAME, logged in $RUNS/NAME.log
sweep() {
  # shellcheck disable=SC2086  # EXTRA is a list of arguments
  pope train "$1" --pe "$2" --seeds "$3" --out "$RUNS/$4" --resume --jobs-per-gpu "${5:-$JOBS_PER_GPU}" \
    --set train.max_seconds="$LIMIT" --set train.progress=false $EXTRA >"$RUNS/$4.log" 2>&1
  local rc=$?
  echo "sweep $4 exit status $rc"
  [ "$rc" -eq 0 ] || status=1
  return "$rc"
}
# wait_all: wait for every background sweep (started with `sweep ... & pids+=($!)`); a failed one fails the stage
pids=()
wait_all() {
  local pid; for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  pids=()
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
    || { status=1; return; }
  # each run keeps its copy as RUN/eval/length-DATA-test-SHORTEST-LONGEST.json, so text-long does not replace text
}

# finetune_at CONTEXT SEED SWEEP...: `pope finetune` of each sweep's seed-SEED at CONTEXT tokens into
# $RUNS/SWEEP-ftCONTEXT (RoPE -> YaRN, PoPE -> PoPE+ft: pope finetune picks the method), one after another (each
# alone on the GPU: a fine-tune at 4x the context holds ~4x a training run's activations); a finished fine-tune is
# skipped, an unfinished one resumed
finetune_at() {
  local context=$1 seed=$2 source run ft; shift 2
  [ -n "$context" ] || return 0
  for source in "$@"; do
    run="$RUNS/$source/seed-$seed"; ft="$RUNS/$source-ft$context"
    if [ -d "$run" ] && finished "$run" && ! { [ -d "$ft" ] && finished "$ft"; }; then
      local resume=(); [ -d "$ft/checkpoints/last" ] && resume=(--resume)
      # shellcheck disable=SC2086  # FT_EXTRA is a list of arguments
      pope finetune "$run" --context "$context" --steps "$FT_STEPS" --out "$ft" "${resume[@]}" \
        --set train.max_seconds="$LIMIT" --set train.progress=false $FT_EXTRA >"$ft.log" 2>&1 || status=1
    fi
  done
}

# frequencies_of DATA RUN...: `pope analyze frequencies` (magnitude per layer x frequency, learned delta) of each
# finished run on DATA's test split, unless the run already has it
frequencies_of() {
  local data=$1 run; shift
  for run in "$@"; do
    if [ -d "$run" ] && finished "$run" && [ ! -e "$run/eval/frequencies/frequency_usage.json" ]; then
      pope analyze frequencies "$run" --data "$data" --split test || status=1
    fi
  done
}

# report_all NAME PREFIX [ARG...]: one `pope report` of every sweep and single run $RUNS/PREFIX-*/ into
# $RUNS/report-NAME, with the ARGs (e.g. --against DIR)
report_all() {
  local name=$1 prefix=$2 reported=() run; shift 2
  for run in "$RUNS/$prefix"-*/; do [ -f "$run/sweep.json" ] || [ -f "$run/config.json" ] && reported+=("$run"); done
  [ "${#reported[@]}" -eq 0 ] || pope report "${reported[@]}" --out "$RUNS/report-$name" "$@" || status=1
}

[ "${ARCHIVE_ONLY:-0}" = 1 ] && STAGE=archive-only  # only the archive below: scripts/gpu_reproduce_bg.sh's partial results
case "$STAGE" in
  archive-only) ;;
  jsb)
    data_ready jsb || exit 1
    sweep "$JSB_PRESET" pope "$JSB_SEEDS" jsb-pope 3 & pids+=($!)
    sweep "$JSB_PRESET" rope "$JSB_SEEDS" jsb-rope 3 & pids+=($!)
    wait_all
    pope report "$RUNS/jsb-pope" "$RUNS/jsb-rope" --out "$RUNS/report-jsb" || status=1
    ;;
  maestro)  # best-valid checkpointing is the default (train.best_metric valid_loss): summary.json at_best_valid
    data_ready maestro || exit 1
    budget=""  # the cut budget; a key that EXTRA sets itself is left to EXTRA (pope train takes each key once)
    for setting in recipe.max_steps="$MAESTRO_STEPS" recipe.warmup_steps=100 recipe.eval_interval=50; do
      case " $EXTRA " in *" ${setting%%=*}="*) ;; *) budget="$budget --set $setting" ;; esac
    done
    EXTRA="$budget $EXTRA" sweep "$MAESTRO_PRESET" pope "$MAESTRO_SEEDS" maestro-pope 2 & pids+=($!)
    EXTRA="$budget $EXTRA" sweep "$MAESTRO_PRESET" rope "$MAESTRO_SEEDS" maestro-rope 2 & pids+=($!)
    wait_all
    pope report "$RUNS/maestro-pope" "$RUNS/maestro-rope" --out "$RUNS/report-maestro" || status=1
    ;;
  genome)
    data_ready genome || exit 1
    sweep "$GENOME_PRESET" pope "$GENOME_SEEDS" genome-pope & pids+=($!)
    sweep "$GENOME_PRESET" rope "$GENOME_SEEDS" genome-rope & pids+=($!)
    sweep "$GENOME_PRESET" pope:delta_init=zero "$GENOME_SEEDS" genome-pope-d0 & pids+=($!)
    wait_all
    length_eval genome genome "$(lengths genome-rope 1 2 4 8 10)" "$RUNS"/genome-pope/seed-* "$RUNS"/genome-rope/seed-* \
      "$RUNS"/genome-pope-d0/seed-*
    pope report "$RUNS/genome-pope" "$RUNS/genome-rope" "$RUNS/genome-pope-d0" --out "$RUNS/report-genome" || status=1
    ;;
  genome-more)  # the sweeps share the genome stage's names: merged, their seeds join that stage's
    data_ready genome || exit 1
    third=() baselines=() tuned=() sweeps=()  # the runs of the third seed, of the baselines, the fine-tunes
    for name in "${third_names[@]}"; do
      sweep "$GENOME_PRESET" "${THIRD_PE[$name]}" "$GENOME_MORE_SEED" genome-"$name" & pids+=($!)
      third+=("$RUNS"/genome-"$name"/seed-"$GENOME_MORE_SEED"); sweeps+=(genome-"$name")
    done
    for pe in $GENOME_MORE_BASELINES; do
      sweep "$GENOME_PRESET" "$pe" 0 genome-"$pe" & pids+=($!)
      baselines+=("$RUNS"/genome-"$pe"/seed-0); sweeps+=(genome-"$pe")
    done
    wait_all
    reference="" context=""  # the training length comes from the first sweep that started
    for reference in "${sweeps[@]}"; do context=$(lengths "$reference" 4); [ -z "$context" ] || break; done
    if [ "$GENOME_MORE_FINETUNE" != 0 ]; then
      finetune_at "$context" "$GENOME_MORE_SEED" "${ft_sources[@]}"
      for source in "${ft_sources[@]}"; do tuned+=("$RUNS/$source-ft$context"); done
    fi
    length_eval genome-more genome "$(lengths "$reference" 1 2 4 8 10)" "${third[@]}" "${baselines[@]}" "${tuned[@]}"
    frequencies_of genome "${third[@]}"
    report_all genome-more genome
    ;;
  text)
    data_ready text || exit 1
    sweep "$TEXT_PRESET" rope "$TEXT_SEEDS" text-rope & pids+=($!)
    sweep "$TEXT_PRESET" pope:delta_init=zero "$TEXT_SEEDS" text-pope-d0 & pids+=($!)
    sweep "$TEXT_PRESET" pope:delta_init=uniform 0 text-pope-du & pids+=($!)
    sweep "$TEXT_PRESET" alibi 0 text-alibi & pids+=($!)
    sweep "$TEXT_PRESET" nope 0 text-nope & pids+=($!)
    wait_all
    context=$(lengths text-rope 4)
    finetune_at "$context" 0 text-rope text-pope-d0
    text_runs=("$RUNS"/text-*/seed-* "$RUNS"/text-*-ft"$context")
    length_eval text text "$(lengths text-rope 1 2 4 8 10)" "${text_runs[@]}"
    length_eval text-long text "$(lengths text-rope 16 20)" "${text_runs[@]}"
    frequencies_of text "$RUNS"/text-rope/seed-0 "$RUNS"/text-pope-d0/seed-0 "$RUNS"/text-pope-du/seed-0
    report_all text text
    ;;
  text-ablations)  # each ablation beside the full PoPE (delta zero, the paper's init for text) of the same lease
    data_ready text || exit 1
    sweep "$TEXT_PRESET" pope:delta_init=zero "$ABLATION_SEEDS" ablation-full & pids+=($!)
    for name in $ABLATIONS; do
      sweep "$TEXT_PRESET" "${ABLATION_PE[$name]}" "$ABLATION_SEEDS" ablation-"$name" & pids+=($!)
    done
    wait_all
    length_eval ablations text "$(lengths ablation-full 1 2 4 8 10)" "$RUNS"/ablation-*/seed-*
    # where each setting's magnitudes and learned delta went, from its first seed of this call: the checkpoints
    # do not come back from the GPU machine, so this is the only time they can be read
    frequencies_of text "$RUNS"/ablation-*/seed-"${ABLATION_SEEDS%%[-,]*}"
    [ ! -f "$RUNS/ablation-full/sweep.json" ] || report_all text-ablations ablation --against "$RUNS/ablation-full"
    ;;
esac

(cd "$RUNS" && find . -maxdepth 5 \( -name metrics.jsonl -o -name '*.json' -o -name '*.log' -o -name '*.md' \
   -o -name '*.csv' -o -name '*.png' \) -not -path '*/checkpoints/*' -not -path '*/tensorboard/*' -print0 \
   | tar czf "$OUT/reproduce-${ARCHIVE_NAME:-$STAGE}.tar.gz" --null -T -)
ls -la "$OUT"
echo "stage $STAGE exit status $status"
exit $status
