#!/usr/bin/env bash
# GPU check of stopping by signal (the CPU tests cover one process and gloo), on a 2-GPU machine:
#   1. one GPU, compile + whole-step CUDA graph: SIGINT after some steps -> exit 130, checkpoints/last at the
#      last logged step, `--resume` finishes the run; losses equal a straight run within the GPU's run-to-run noise
#   2. torchrun 2-GPU NCCL DDP: SIGTERM to torchrun -> both ranks stop at the same step with a checkpoint; resume
# Writes $OUT/stop_check.json. Run from the repository root.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from pope.data.indirect_indexing import write_splits; write_splits('/tmp/ii-small', 0, {'train': 20000, 'valid': 1000, 'test': 1000})"
common=(indirect-indexing-tiny --pe pope --set train.data_dir=/tmp/ii-small --set recipe.max_steps=3000
        --set recipe.eval_interval=1000 --set train.log_interval=1 --set train.progress=false --set train.tensorboard=false)
rm -rf /tmp/s0 /tmp/s1 /tmp/s2
wait_steps() {  # wait until $1/metrics.jsonl has $2 lines
  for _ in $(seq 600); do [ -f "$1/metrics.jsonl" ] && [ "$(wc -l < "$1/metrics.jsonl")" -ge "$2" ] && return; sleep 0.2; done
}
CUDA_VISIBLE_DEVICES=0 python3 -m pope.cli train "${common[@]}" --out /tmp/s0 > /tmp/s0.log 2>&1
CUDA_VISIBLE_DEVICES=0 python3 -m pope.cli train "${common[@]}" --out /tmp/s1 > /tmp/s1.log 2>&1 & pid=$!
wait_steps /tmp/s1 200; kill -INT $pid; wait $pid; echo "single-GPU exit status $? (expect 130)" | tee /tmp/s1.status
grep "stopped at step" /tmp/s1.log
CUDA_VISIBLE_DEVICES=0 python3 -m pope.cli train "${common[@]}" --out /tmp/s1 --resume > /tmp/s1b.log 2>&1; echo "resume exit $?"
python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m pope.cli train "${common[@]}" --out /tmp/s2 > /tmp/s2.log 2>&1 & pid=$!
wait_steps /tmp/s2 200; kill -TERM $pid; wait $pid; echo "torchrun exit status $?"
grep "stopped at step" /tmp/s2.log
python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m pope.cli train "${common[@]}" --out /tmp/s2 --resume > /tmp/s2b.log 2>&1; echo "DDP resume exit $?"
python3 - <<'PY'
import json, os, torch
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/metrics.jsonl")) if r["kind"] == "train"}
def stopped_step(log):
    lines = [l for l in open(log) if l.startswith("stopped at step ")]
    return int(lines[-1].split()[3].rstrip(";")) if lines else None
straight, single, ddp = losses("/tmp/s0"), losses("/tmp/s1"), losses("/tmp/s2")
result = {"single": {"stopped_at": stopped_step("/tmp/s1.log"), "steps_after_resume": sorted(single) == list(range(1, 3001)),
                     "max_rel_diff_vs_straight": max(abs(single[s] - straight[s]) / abs(straight[s]) for s in straight),
                     "status": open("/tmp/s1.status").read().strip()},
          "ddp": {"stopped_at": stopped_step("/tmp/s2.log"), "steps_after_resume": sorted(ddp) == list(range(1, 3001))}}
json.dump(result, open(os.environ.get("OUT", "/tmp/out") + "/stop_check.json", "w"), indent=2)
print(json.dumps(result, indent=2))
PY
