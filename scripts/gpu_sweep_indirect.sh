#!/usr/bin/env bash
# A seed sweep of the `indirect-indexing` preset on the GPU machine, in chunks that fit one command:
#
#   PE=pope SEEDS=0-3 bash scripts/gpu_sweep_indirect.sh          # run it again on the same machine to continue
#
# Each call runs/resumes `pope train indirect-indexing --pe $PE --seeds $SEEDS --out $RUNS/$NAME --resume`
# (finished seeds are skipped, unfinished ones continue from checkpoints/last, missing ones start), each seed
# stopping itself after LIMIT seconds of training (train.max_seconds) with a checkpoint; $JOBS_PER_GPU seeds share
# each visible GPU. Then, for every finished seed not scored yet, its final checkpoint is scored in fp32 on the
# first 10k training examples and on the test split (RUN/eval/task_accuracy.json: the memorisation gap), and a PoPE
# seed's delta is summarised (RUN/eval/delta_state.json, `pope analyze delta`: the entries outside [-2pi, 0]). The small
# files of every seed (metrics.jsonl, config/summary/env JSON, eval/, logs; no checkpoints) go into ONE archive
# $OUT/sweep-$NAME.tar.gz, and a table of each seed's step and latest valid/test accuracy is printed.
# To run longer than one command: start it in the background (setsid nohup ... > /tmp/sweep-NAME.log) and watch it
# with scripts/gpu_sweep_monitor.sh, which archives the small files every minute.
#
# Settings (environment): PE (default pope), SEEDS (0-3), NAME (run directory name under RUNS; default $PE; give
# variants their own, e.g. NAME=pope-fp32 EXTRA="--set train.autocast=none"), EXTRA (more `--set` arguments),
# LIMIT (training seconds per call, default 520: process start-up (~20 s), the final checkpoint, scoring and the
# archive fit in the rest of the 10-minute command), JOBS_PER_GPU (default: pope's DEFAULT_JOBS_PER_GPU),
# RUNS (/tmp/pope-runs), OUT (/tmp/out). Task variants go through the dataset spec, e.g.
# EXTRA="--set recipe.dataset=indirect-indexing:fresh=true --set model.vocab_size=66" (pope.data.indirect_indexing).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PE=${PE:-pope}; SEEDS=${SEEDS:-0-3}; NAME=${NAME:-$PE}; EXTRA=${EXTRA:-}; LIMIT=${LIMIT:-520}
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/pope-runs}
jobs=(); [ -n "${JOBS_PER_GPU:-}" ] && jobs=(--jobs-per-gpu "$JOBS_PER_GPU")
mkdir -p "$OUT" "$RUNS"
sweep="$RUNS/$NAME"
sets=()  # the GPU settings, each unless EXTRA sets that key itself (a key may be given once)
for item in train.max_seconds="$LIMIT" train.eval_batch_size=1000 train.checkpoint_interval=25000 train.log_interval=500; do
  case " $EXTRA" in *" ${item%%=*}="*) ;; *) sets+=(--set "$item") ;; esac
done
# shellcheck disable=SC2086  # EXTRA is a list of arguments
python3 -m pope.cli train indirect-indexing --pe "$PE" --seeds "$SEEDS" --out "$sweep" --resume "${jobs[@]}" \
  "${sets[@]}" $EXTRA
echo "sweep exit status $?"
python3 - "$sweep" "$RUNS" <<'PY'
import json, sys
from pathlib import Path
from pope.eval.delta_state import DELTA_STATE_FILE, write_delta_state
from pope.eval.runs import TASK_ACCURACY_FILE, score_task_accuracy, task_splits_of
from pope.train.sweep import run_finished

sweep, runs = Path(sys.argv[1]), Path(sys.argv[2])
configs = sorted(sweep.glob("seed-*/config.json"))
if not configs:
    sys.exit(f"no seed of {sweep} has started (see the sweep output above)")
splits = task_splits_of(configs[0].parent)  # a task variant (e.g. min_len=20,max_len=32) has its own
train_10k = runs / f"train-10k-{splits.name}.txt"
if not train_10k.exists():
    with open(splits / "train.txt") as source:
        train_10k.write_text("".join(line for _, line in zip(range(10_000), source)))
print(f"{'seed':>6} {'step':>7} {'status':<11} {'valid_acc':>9} {'test_acc':>9} {'train10k_acc*':>13} {'test_acc*':>9}")
for run in sorted(sweep.glob("seed-*/"), key=lambda p: int(p.name.split("-")[1])):
    if run_finished(run) and not (run / TASK_ACCURACY_FILE).exists():
        score_task_accuracy(run, {"train": train_10k, "test": splits / "test.txt"})
    pe = json.loads((run / "config.json").read_text())["pe"] if (run / "config.json").exists() else ""
    if run_finished(run) and pe.split(":")[0] == "pope" and not (run / DELTA_STATE_FILE).exists():
        write_delta_state(run / "checkpoints" / "last")  # PoPE's delta at the end: how much left [-2pi, 0]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()] \
        if (run / "metrics.jsonl").exists() else []
    evals = [r for r in records if r["kind"] == "eval"]
    last = evals[-1] if evals else {}
    scored = json.loads((run / TASK_ACCURACY_FILE).read_text())["splits"] if (run / TASK_ACCURACY_FILE).exists() else {}
    cell = lambda value: f"{value:9.4f}" if isinstance(value, float) else f"{'-':>9}"
    print(f"{run.name:>6} {records[-1]['step'] if records else 0:>7} "
          f"{'finished' if run_finished(run) else 'unfinished':<11} {cell(last.get('valid_accuracy'))} "
          f"{cell(last.get('test_accuracy'))} {cell(scored.get('train', {}).get('accuracy')):>13} "
          f"{cell(scored.get('test', {}).get('accuracy'))}")
print("* fp32 re-score of checkpoints/last on the first 10k training examples and the test split (finished seeds)")
PY
(cd "$RUNS" && find "$NAME" -maxdepth 3 \( -name metrics.jsonl -o -name '*.json' -o -name '*.log' \) \
   -not -path '*/checkpoints/*' -print0 | tar czf "$OUT/sweep-$NAME.tar.gz" --null -T -)
ls -la "$OUT"
