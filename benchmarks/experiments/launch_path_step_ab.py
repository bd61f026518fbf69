"""The GPT-2 training step (torch.compile, default mode) with PoPE's direct kernel launches through Triton's
Python launcher (pope.settings' raw_launch off: every TMA descriptor encoded again per launch) and through the C
launcher with kept encodings (raw_launch on), in one process on ONE compiled model, alternating blocks of steps, so the
host's drift between runs and leases (a step read 23 ms in one lease and 27-29 ms in the next) cancels.

    PYTHONPATH=src python3 benchmarks/experiments/launch_path_step_ab.py [--blocks 6] [--steps 10]
Prints each block and the median per setting; no files written.
"""
import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from train_step_owt import build_train_step, time_steps  # noqa: E402

from pope.settings import SETTINGS  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=6)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    train_step, _ = build_train_step("pope:backend=triton", batch=8, seq_len=1024)
    for _ in range(3):
        train_step()
    results = {False: [], True: []}
    for block in range(args.blocks):
        for raw in ((False, True) if block % 2 == 0 else (True, False)):
            SETTINGS.raw_launch = raw
            SETTINGS.caches.direct_launches.clear()  # entries keep the launch path they were made with
            train_step()  # the first launch of each site goes through Triton: not timed
            ms, _ = time_steps(train_step, args.steps)
            results[raw].append(ms)
            print(f"block {block} raw launch {'on ' if raw else 'off'}: {ms:.2f} ms/step", flush=True)
    off, on = statistics.median(results[False]), statistics.median(results[True])
    print(f"median ms/step: Triton's launcher {off:.2f}, C launcher with kept encodings {on:.2f} ({on / off:.3f}x)")


if __name__ == "__main__":
    main()
