"""A decoding step and verify passes over 2, 4 and 8 tokens of one target at several lean precisions, in one process,
interleaved (rounds of each precision in turn, medians): the figures of docs/results.md's q4 table.

    .venv/bin/python scripts/step_costs.py default --dtypes int8,q4 --threads 2
"""

import argparse
import statistics
import time

import torch

from draftwise import machine
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load

CONTEXT, PASSES, ROUNDS = 128, (1, 2, 4, 8), 8


def timed(lm, ids, n: int, reps: int = 10) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        lm.forward(ids[:, CONTEXT : CONTEXT + n], CONTEXT)  # the cache past CONTEXT is written over each time
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("--dtypes", default="int8,q4")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = {d: load(args.target, ModelOptions(dtype=d)).lm for d in args.dtypes.split(",")}
    ids = torch.randint(100, 10000, (1, CONTEXT + max(PASSES)), generator=torch.Generator().manual_seed(0))
    for lm in models.values():
        lm.reset(1, CONTEXT + 2 * max(PASSES))
        lm.forward(ids[:, :CONTEXT], 0)
        timed(lm, ids, 1, reps=5)  # warm-up
    got = {d: {n: [] for n in PASSES} for d in models}
    for _ in range(ROUNDS):
        for d, lm in models.items():
            for n in PASSES:
                got[d][n].append(timed(lm, ids, n))
    bandwidth = machine.bandwidth(args.threads)["read_gb_per_s"]  # after the passes: nothing else was running
    for d, lm in models.items():
        step = statistics.median(got[d][1])
        passes = " / ".join(f"{statistics.median(got[d][n]) / step:.2f}" for n in PASSES[1:])
        share = machine.share(1 / step, lm.weight_bytes(), {"bandwidth": {"read_gb_per_s": bandwidth}})
        print(
            f"{d}: step {step * 1e3:.2f} ms ({1 / step:.1f} tokens/s), {lm.weight_bytes() / 1e6:.0f} MB of weights a "
            f"step ({share:.0%} of {bandwidth:g} GB/s); verify over {'/'.join(map(str, PASSES[1:]))} tokens = "
            f"{passes} steps"
        )


if __name__ == "__main__":
    main()
