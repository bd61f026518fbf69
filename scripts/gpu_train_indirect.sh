#!/usr/bin/env bash
# The paper's indirect-indexing runs (issue 3) on a 2-GPU machine: PoPE on GPU 0 and RoPE on GPU 1 at
# the same time, seed ${SEED:-0}, the full `indirect-indexing` preset (100k steps). Each run stops
# itself after LIMIT seconds with a checkpoint (train.max_seconds); calling the script again on the same
# machine resumes both (--resume). When a run has finished, `pope eval accuracy` re-scores its best
# checkpoint on the held-out test file. Metrics (not weights) are copied to $OUT.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; RUNS=${RUNS:-/tmp/pope-runs}; LIMIT=${LIMIT:-520}; SEED=${SEED:-0}
mkdir -p "$OUT" "$RUNS"
splits=$(python3 -c "from pope.data.indirect_indexing import ensure_splits; print(ensure_splits())")  # once, before both runs
echo "splits: $splits"
pids=()
for pe in pope rope; do
  gpu=0; [ "$pe" = rope ] && gpu=1
  run="$RUNS/$pe-seed$SEED"; resume=(); [ -f "$run/config.json" ] && resume=(--resume)
  CUDA_VISIBLE_DEVICES=$gpu python3 -m pope.cli train indirect-indexing --pe "$pe" --seed "$SEED" --out "$run" "${resume[@]}" \
    --set train.max_seconds="$LIMIT" --set train.progress=false --set train.eval_batch_size=1000 \
    --set train.checkpoint_interval=25000 --set train.log_interval=500 > "$RUNS/$pe.log" 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || echo "a run exited with status $?"; done
for pe in pope rope; do
  run="$RUNS/$pe-seed$SEED"
  echo "== $pe =="; grep -E "kind=eval|error|Error" "$RUNS/$pe.log" | tail -25
  cp "$run/metrics.jsonl" "$OUT/$pe-seed$SEED.jsonl"
  python3 - "$run" "$OUT/$pe-seed$SEED.run.json" <<'PY'
import json, sys, glob, os
run, target = sys.argv[1], sys.argv[2]
record = {"config": json.load(open(f"{run}/config.json")), "summary": json.load(open(f"{run}/summary.json")),
          "env": [json.load(open(p)) for p in sorted(glob.glob(f"{run}/env*.json"))]}
json.dump(record, open(target, "w"), indent=2)
print("summary", json.dumps({k: record["summary"][k] for k in ("step", "finished", "seconds", "final")}))
PY
  if grep -q '"finished": true' "$run/summary.json"; then
    CUDA_VISIBLE_DEVICES=0 python3 -m pope.cli eval accuracy "$run" --data "$splits/test.txt" | tee -a "$OUT/accuracy.txt"
  fi
done
