#!/usr/bin/env bash
# Multi-GPU scaling matrix (benchmarks/scaling.py under torchrun): for each case PRESET:PARALLEL[:GRAD_ACCUM] and each world
# size in NGPUS (default 1 2 4 8, those up to the visible GPU count), one torchrun call timing PoPE and RoPE at the
# preset's global batch; rows appended to $OUT/scaling.csv, then the efficiency table and $OUT/scaling.png.
# Each torchrun call is limited to CALL_TIMEOUT seconds (default 570) so it fits a 10-minute device call; to keep a
# whole device call under 10 minutes, give one case and one world size per call, e.g.
#   NGPUS=8 CASES=owt-774m:fsdp:4 PES=pope scripts/gpu_scaling.sh
# GRAD_ACCUM (recipe.grad_accum) keeps the global batch and splits it into more micro-batches, so the one-GPU run of
# owt-774m (64 x 1024 tokens per step) fits in memory; the default case gives it 4.
# Environment: CASES (default "owt-124m:ddp owt-774m:fsdp:4"), NGPUS ("1 1 2 4 8" runs one GPU twice: its own loss noise), PES (default "pope rope"), STEPS (20),
# WARMUP (5), LOSS_STEPS (25), EXTRA (more benchmarks/scaling.py arguments, e.g. "--no-compile"),
# OUT (default benchmarks/results). Run from the repository root; on a copy without .git set POPE_GIT_COMMIT.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${OUT:-benchmarks/results}; mkdir -p "$OUT"
CASES=${CASES:-"owt-124m:ddp owt-774m:fsdp:4"}
PES=${PES:-"pope rope"}
CALL_TIMEOUT=${CALL_TIMEOUT:-570}
visible=$(python3 -c "import torch; print(torch.cuda.device_count())")
if [ "$visible" -lt 1 ]; then echo "gpu_scaling.sh: no CUDA GPU visible" >&2; exit 1; fi
NGPUS=${NGPUS:-"1 2 4 8"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
pe_args=(); for pe in $PES; do pe_args+=(--pe "$pe"); done
status=0
for case in $CASES; do
    IFS=: read -r preset parallel accum <<< "$case"
    accum_args=(); if [ -n "${accum:-}" ]; then accum_args=(--set "recipe.grad_accum=$accum"); fi
    for n in $NGPUS; do
        if [ "$n" -gt "$visible" ]; then echo "skip $preset $parallel x$n: only $visible GPUs visible"; continue; fi
        echo "== $preset $parallel on $n GPU(s) =="
        # shellcheck disable=SC2086  # EXTRA is a list of arguments
        CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((n - 1))) timeout "$CALL_TIMEOUT" \
            python3 -m torch.distributed.run --standalone --nproc_per_node="$n" benchmarks/scaling.py \
            --preset "$preset" --parallel "$parallel" "${pe_args[@]}" "${accum_args[@]}" --steps "${STEPS:-20}" --warmup "${WARMUP:-5}" \
            --loss-steps "${LOSS_STEPS:-25}" --out "$OUT" ${EXTRA:-} || { echo "FAILED: $preset $parallel x$n (rc $?)"; status=1; }
    done
done
python3 benchmarks/scaling.py --plot --out "$OUT" || status=1
exit $status
