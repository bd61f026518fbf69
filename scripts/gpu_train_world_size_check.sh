#!/usr/bin/env bash
# Resume on another number of GPUs (NCCL), one device call on a machine with >= 2 GPUs, a few minutes:
#   straight: 40 steps on 1 GPU; fsdp-2to1: 20 steps on 2 GPUs (FSDP2), --resume on 1; fsdp-1to2: 20 steps on 1 GPU,
#   --resume on 2 (FSDP2); ddp-2to1: as fsdp-2to1 with DDP. indirect-indexing-tiny, fp32 (autocast none, no compile, no
#   CUDA graph), so the only difference is reduction order. Passes when every step's loss is within 1e-4 relative of
#   the straight run (fp32 2-GPU DDP vs 1 GPU measured 1.2e-7 over 40 steps, benchmarks/experiments/
#   2026-11-30-trainer-gpu-checks/train_ddp_nccl_h200.json; GPU kernels are not bitwise
#   deterministic). Writes $OUT/world_size_check.json; exits 1 on a failure.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/world-size-check}; rm -rf "$WORK"; mkdir -p "$WORK"
python3 -c "from pope.data.indirect_indexing import write_splits; write_splits('$WORK/ii', 0, {'train': 20000, 'valid': 1000, 'test': 1000})"
common=(indirect-indexing-tiny --pe pope --set "train.data_dir=$WORK/ii" --set recipe.max_steps=40
        --set recipe.eval_interval=40 --set train.log_interval=1 --set train.autocast=none --set train.compile=false
        --set train.cuda_graph=false --set train.progress=false --set train.tensorboard=false)
train() {  # NGPU RUN_DIR ARGS...: one pope train call on NGPU GPUs, its log beside the run
    local n=$1 dir=$2; shift 2
    CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) python3 -m torch.distributed.run --standalone --nproc_per_node="$n" \
        -m pope.cli train "${common[@]}" "$@" --out "$dir" >> "$dir.log" 2>&1 || { echo "FAILED: $dir ($*)"; tail -20 "$dir.log"; }
}
train 1 "$WORK/straight"
for case in fsdp:2:1 fsdp:1:2 ddp:2:1; do
    IFS=: read -r parallel first second <<< "$case"
    dir="$WORK/$parallel-${first}to$second"
    train "$first" "$dir" --set "train.parallel=$parallel" --set train.stop_at_step=20
    train "$second" "$dir" --set "train.parallel=$parallel" --resume
done
WORK=$WORK python3 - <<'PY'
import json, os, sys
work = os.environ["WORK"]
def losses(name):
    path = f"{work}/{name}/metrics.jsonl"
    return {r["step"]: r["loss"] for r in map(json.loads, open(path)) if r["kind"] == "train"} if os.path.exists(path) else {}
straight, result = losses("straight"), {}
for name in ("fsdp-2to1", "fsdp-1to2", "ddp-2to1"):
    run = losses(name)
    diffs = [abs(run[s] - straight[s]) / abs(straight[s]) for s in sorted(straight) if s in run]
    env = f"{work}/{name}/env.resume-20.json"
    result[name] = {"steps": len(run), "max_rel_diff": max(diffs, default=None),
                    "max_rel_diff_after_resume": max(diffs[20:], default=None),
                    "world_sizes": [json.load(open(env))[k] for k in ("resumed_from_world_size", "world_size")]
                    if os.path.exists(env) else None,
                    "ok": len(run) == len(straight) == 40 and bool(diffs) and max(diffs) < 1e-4}
json.dump(result, open(os.environ["OUT"] + "/world_size_check.json", "w"), indent=2)
print(json.dumps(result, indent=2))
sys.exit(0 if all(r["ok"] for r in result.values()) else 1)
PY
