"""Host time of the kernel launchers alone (pope.kernels.forward / backward), and of the pope:: operators around
them as compiled code calls them, on CPU, with every kernel launch replaced by a no-op: the Python and
tensor-allocation work a call does around its launches, measured without a GPU (a GPU server's host is too noisy to
see changes of tens of microseconds; docs/kernels.md). In torch.compile's default mode a PoPE model's step waits on
this work when the host is slow: per layer one forward and one backward operator call.

    PYTHONPATH=src python benchmarks/launcher_host_time.py [--calls 3000] [--out DIR]
Prints microseconds per call at 8x12x1024x64 bf16, causal, without delta (delta's gradient adds a CPU reduction
that a GPU does on the device); with --out also DIR/launcher_host_time.txt, its provenance on the first line.
"""

from __future__ import annotations

import argparse
import os
import sys
import timeit

import torch

import pope.kernels as kernels
import pope.ops as ops  # registers the pope:: operators
from pope.kernels import direct_launch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_io import printed_to  # noqa: E402  (same directory: shared benchmark helpers)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--out", default=None, help="also write the result to DIR/launcher_host_time.txt")
    args = parser.parse_args(argv)
    direct_launch.launch = lambda *args, **meta: None  # no kernel runs: only the launchers' own host work is timed
    batch, heads, seq, head_dim = 8, 12, 1024, 64
    q, k, v, do = (torch.randn(batch, heads, seq, head_dim, dtype=torch.bfloat16) for _ in range(4))
    theta = kernels.frequencies(head_dim, 10000.0, "cpu")
    options = dict(causal=True, softmax_scale=head_dim**-0.5, q_offset=0, magnitude="softplus")
    # As a training step runs them (pope.settings' reuse_prepass): the forward returns its pre-pass's q', k' and
    # the backward takes them.
    out, lse, primes = kernels.forward(q, k, v, None, theta, **options, return_primes=True)
    forward_us = timeit.timeit(
        lambda: kernels.forward(q, k, v, None, theta, **options, return_primes=True), number=args.calls
    )
    backward_us = timeit.timeit(
        lambda: kernels.backward(do, q, k, v, None, out, lse, theta, **options, primes=primes), number=args.calls
    )
    # The operators as compiled code calls them (torch.ops.pope.*.default, under no_grad): the dispatcher and
    # torch.library's custom-op layers around the same launchers, what a compiled step's host waits on per layer.
    # (the operators take the same options positionally, in the schema's order: theta, causal, scale, offset, magnitude)
    operator_options = (theta, *options.values())
    forward_op, backward_op = (
        getattr(torch.ops.pope, f"flash_attention_{direction}_{ops.OPERATOR_CONTRACT}").default
        for direction in ("forward", "backward")
    )
    with torch.no_grad():
        forward_op_us = timeit.timeit(
            lambda: forward_op(q, k, v, None, *operator_options, None, None, 0, 0, True),
            number=args.calls,
        )
        backward_op_us = timeit.timeit(
            lambda: backward_op(do, q, k, v, None, out, lse, *operator_options, None, None, 0, 0, *primes),
            number=args.calls,
        )
    with printed_to(args.out, "launcher_host_time.txt"):
        print(
            f"launcher host time, launches mocked: forward {forward_us / args.calls * 1e6:.1f} us, "
            f"backward {backward_us / args.calls * 1e6:.1f} us per call"
        )
        print(
            f"operator host time (compiled code's call), launches mocked: forward "
            f"{forward_op_us / args.calls * 1e6:.1f} us, backward {backward_op_us / args.calls * 1e6:.1f} us per call"
        )


if __name__ == "__main__":
    main()
