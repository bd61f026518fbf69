#!/usr/bin/env bash
# GPU checks of code paths the CPU tests cannot reach (issue 3), small and quick:
#   1. resume with torch.compile + whole-step CUDA graph: 200 steps straight vs 100 + --resume 100
#   2. 2-GPU NCCL DDP with torch.compile and bf16 vs 1 GPU (compiled, graph off), 40 steps
# Prints per-step loss differences; writes $OUT/resume_check.json.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 -c "from pope.data.indirect_indexing import write_splits; write_splits('/tmp/ii-small', 0, {'train': 20000, 'valid': 1000, 'test': 1000})"
common=(indirect-indexing-tiny --pe pope --set train.data_dir=/tmp/ii-small --set recipe.max_steps=200
        --set recipe.eval_interval=100 --set train.log_interval=1 --set train.progress=false --set train.tensorboard=false)
rm -rf /tmp/r1 /tmp/r2 /tmp/d1 /tmp/d2
CUDA_VISIBLE_DEVICES=0 python3 -m pope.cli train "${common[@]}" --out /tmp/r1 > /tmp/r1.log 2>&1 || tail -30 /tmp/r1.log
CUDA_VISIBLE_DEVICES=0 python3 -m pope.cli train "${common[@]}" --set train.stop_at_step=100 --out /tmp/r2 > /tmp/r2.log 2>&1 || tail -30 /tmp/r2.log
CUDA_VISIBLE_DEVICES=0 python3 -m pope.cli train "${common[@]}" --out /tmp/r2 --resume > /tmp/r2b.log 2>&1 || tail -30 /tmp/r2b.log
ddp=(indirect-indexing-tiny --pe pope --set train.data_dir=/tmp/ii-small --set recipe.max_steps=40
     --set recipe.eval_interval=40 --set train.log_interval=1 --set train.progress=false --set train.tensorboard=false
     --set train.compile=true --set train.cuda_graph=false)
CUDA_VISIBLE_DEVICES=0 python3 -m pope.cli train "${ddp[@]}" --out /tmp/d1 > /tmp/d1.log 2>&1 || tail -30 /tmp/d1.log
python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m pope.cli train "${ddp[@]}" --out /tmp/d2 > /tmp/d2.log 2>&1 || tail -30 /tmp/d2.log
python3 - <<'PY'
import json, os
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/metrics.jsonl")) if r["kind"] == "train"}
def compare(a, b):
    return {s: abs(a[s] - b[s]) / abs(a[s]) for s in sorted(a) if s in b}
r1, r2 = losses("/tmp/r1"), losses("/tmp/r2")
resume = compare(r1, r2)
d1, d2 = losses("/tmp/d1"), losses("/tmp/d2")
ddp = compare(d1, d2)
env1, env2 = json.load(open("/tmp/r2/env.json")), json.load(open("/tmp/r2/env.resume-100.json"))
result = {"resume": {"steps": [len(r1), len(r2)], "max_rel_diff_steps_1_100": max(resume[s] for s in range(1, 101)),
                     "rel_diff_101_105": [resume[s] for s in range(101, 106)],
                     "max_rel_diff_101_200": max(resume[s] for s in range(101, 201)),
                     "final_loss": [r1[200], r2[200]], "compile": env1["compile"], "cuda_graph": env1["cuda_graph"],
                     "resumed_env_cuda_graph": env2["cuda_graph"]},
          "ddp_compiled_bf16": {"steps": [len(d1), len(d2)], "max_rel_diff": max(ddp.values()),
                                "final_loss": [d1[40], d2[40]]}}
json.dump(result, open(os.environ["OUT"] + "/resume_check.json", "w"), indent=2)
print(json.dumps(result, indent=2))
PY
