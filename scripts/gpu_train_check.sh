#!/usr/bin/env bash
# GPU check for the trainer (issue 3), one device call on a 2-GPU machine:
#   1. step-time benchmark of the indirect-indexing preset (benchmarks/train_step.py)
#   2. a 2-GPU NCCL DDP run of a small preset against a 1-GPU run with the same global batch (fp32)
# Results go to $OUT (train_step.json, ddp.json). Run from the repository root.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "from pope.data.indirect_indexing import ensure_splits; print('splits', ensure_splits())"

echo "== DDP (NCCL) vs one GPU =="
python3 -c "from pope.data.indirect_indexing import write_splits; write_splits('/tmp/ii-small', 0, {'train': 20000, 'valid': 1000, 'test': 1000})"
common=(indirect-indexing-tiny --pe pope --set train.data_dir=/tmp/ii-small --set recipe.max_steps=40
        --set recipe.eval_interval=40 --set train.log_interval=1 --set train.autocast=none --set train.compile=false
        --set train.cuda_graph=false --set train.progress=false --set train.tensorboard=false)
rm -rf /tmp/ddp1 /tmp/ddp2
CUDA_VISIBLE_DEVICES=0 python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m pope.cli train "${common[@]}" --out /tmp/ddp1 > /tmp/ddp1.log 2>&1 || tail -20 /tmp/ddp1.log
python3 -m torch.distributed.run --standalone --nproc_per_node=2 -m pope.cli train "${common[@]}" --out /tmp/ddp2 > /tmp/ddp2.log 2>&1 || tail -20 /tmp/ddp2.log
python3 - <<'PY'
import json, os
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/metrics.jsonl")) if r["kind"] == "train"}
a, b = losses("/tmp/ddp1"), losses("/tmp/ddp2")
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
env = json.load(open("/tmp/ddp2/env.json"))
result = {"steps": len(a), "max_rel_loss_diff": worst, "first": [a[1], b[1]], "last": [a[max(a)], b[max(b)]],
          "world_size": env["world_size"], "device_name": env["device_name"], "ok": worst < 1e-4 and len(a) == len(b)}
json.dump(result, open(os.environ["OUT"] + "/ddp.json", "w"), indent=2)
print("DDP", json.dumps(result))
PY

echo "== step-time benchmark =="
python3 benchmarks/train_step.py --steps 200 --out "$OUT/train_step.json" \
    --cases "${BENCH_CASES:-pope@eager;pope@graph;pope@compile;pope@compile+graph;pope:backend=reference@compile+graph;rope@eager;rope@compile+graph}"
