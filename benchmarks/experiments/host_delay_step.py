"""Is the GPT-2 training step (torch.compile default mode) bound by PoPE's host time? Adds a busy-wait of N
microseconds of host time to every call of the PoPE operators (forward and backward; 12 layers, so 24 calls a
step) and times the step at each N. A slope near 1 (step ms per added host ms) means the step waits on the
host: each microsecond the operators' Python saves is a microsecond off the step. A slope near 0 means the GPU
is the bottleneck and host savings would not show.

    PYTHONPATH=src python3 benchmarks/experiments/host_delay_step.py [--delays-us 0,50,100] [--steps 20]
Prints one line per delay and the fitted slope; no files written.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from train_step_owt import step_time  # noqa: E402

from pope import ops  # noqa: E402


def busy_wait(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def delayed(function, seconds: float):
    def wrapper(*args, **kwargs):
        busy_wait(seconds)
        return function(*args, **kwargs)
    return wrapper


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delays-us", default="0,50,100")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--compile-mode", default="default", choices=["default", "reduce-overhead"])
    args = parser.parse_args(argv)
    originals = (ops._forward, ops._backward_kernels)
    points = []
    for delay in (float(x) for x in args.delays_us.split(",")):
        # The operators call ops._forward / ops._backward_kernels by module attribute: patching them delays both.
        ops._forward, ops._backward_kernels = (delayed(f, delay * 1e-6) for f in originals)
        row = step_time("pope:backend=triton", batch=8, seq_len=1024, steps=args.steps, warmup=3,
                        compile_mode=args.compile_mode)
        points.append((delay * 24 / 1e3, row["ms_per_step"]))
        print(f"host delay {delay:6.1f} us per operator call ({delay * 24 / 1e3:.2f} ms a step): "
              f"{row['ms_per_step']:.2f} ms/step", flush=True)
    ops._forward, ops._backward_kernels = originals
    if len(points) > 1:
        (x0, y0), (x1, y1) = points[0], points[-1]
        print(f"slope: {(y1 - y0) / (x1 - x0):.2f} step ms per added host ms")


if __name__ == "__main__":
    main()
