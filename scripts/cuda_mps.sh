#!/usr/bin/env bash
# CUDA MPS (Multi-Process Service), for seed sweeps that share one GPU (pope train --seeds ... --jobs-per-gpu N):
#
#   bash scripts/cuda_mps.sh start     # before starting the sweeps; every CUDA process started afterwards uses it
#   bash scripts/cuda_mps.sh status
#   bash scripts/cuda_mps.sh stop
#
# Without MPS, processes on one GPU time-slice it: four runs of a small model (indirect-indexing) take as long side
# by side as one after another. Under MPS their kernels share the SMs at the same time, which is what a model too
# small to fill the GPU needs (benchmarks/results/sweep_throughput.csv: +12 % steps per second with two processes).
# MPS changes no device setting (compute mode, clocks, MIG stay as they are); it is a user-space daemon that ends
# with `stop` or with the machine. Numerics are those of the same kernels without it.
# `start` prints one line and exits 0 only when MPS is on and a CUDA context opens through it; otherwise it leaves
# MPS off and exits 1 (the sweeps then run as before, time-sliced). Runs record it: env.json "cuda_mps".
# Settings (environment): CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps, the driver's own default, so clients
# need no setting), CUDA_MPS_LOG_DIRECTORY (default /tmp/nvidia-mps-log).
set -u
action=${1:-}
export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
export CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/nvidia-mps-log}
control=nvidia-cuda-mps-control
cuda_works() {  # a CUDA context opens and runs a kernel (through MPS when it is on)
  timeout 120 python3 -c "import torch; assert torch.ones(8, device='cuda').sum().item() == 8" >/dev/null 2>&1
}
running() { pgrep -f "^$control" >/dev/null 2>&1 || pgrep -x "nvidia-cuda-mps" >/dev/null 2>&1; }
stop() { echo quit | "$control" >/dev/null 2>&1; for _ in $(seq 20); do running || return 0; sleep 0.5; done; }
case "$action" in
  start)
    if ! command -v "$control" >/dev/null 2>&1; then
      echo "MPS: off ($control is not on this machine); processes sharing a GPU time-slice it"; exit 1
    fi
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    running || "$control" -d || { echo "MPS: off ($control -d failed)"; exit 1; }
    if ! cuda_works; then
      stop
      echo "MPS: off (the daemon started but a CUDA context through it failed; stopped it:" \
           "$(tail -n 3 "$CUDA_MPS_LOG_DIRECTORY/control.log" 2>/dev/null | tr '\n' ' '))"
      exit 1
    fi
    echo "MPS: on (pipes in $CUDA_MPS_PIPE_DIRECTORY; server list: $(echo get_server_list | "$control" 2>/dev/null | tr '\n' ' '))"
    ;;
  status)
    if running; then echo "MPS: on"; else echo "MPS: off"; fi
    ;;
  stop)
    if running; then stop; fi
    if running; then echo "MPS: still running"; exit 1; fi
    echo "MPS: off"
    ;;
  *)
    echo "usage: cuda_mps.sh start|status|stop" >&2; exit 2
    ;;
esac
