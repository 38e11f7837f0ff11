"""A decoding step, verify passes over 2, 4 and 8 tokens and a prompt's prefill of one target at several lean
precisions (at q4: the activation bits its loader chooses, or those asked for), on the matrix route the ladder chose
here or on each path forced (`--paths`, a test-only switch: DRAFTWISE_MATRIX_PATH), in one process, interleaved
(rounds of each in turn, medians): the figures of docs/results.md's q4, activations and matrix-route tables.

    .venv/bin/python scripts/step_costs.py default --dtypes int8,q4 --threads 2
    .venv/bin/python scripts/step_costs.py qwen2.5-coder-1.5b --dtypes q4 --activations 16,8 --prefill 197
    .venv/bin/python scripts/step_costs.py default --dtypes q4 --prefill 277 --paths 'ladder;avx512;avx512-seq'
"""

import argparse
import os
import statistics
import time

import torch

from draftwise import machine
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean import kernels, q4
from draftwise.runtimes.lean.activations import bits_of, with_activations
from draftwise.runtimes.registry import load

CONTEXT, PASSES, ROUNDS = 128, (1, 2, 4, 8), 8


def timed(lm, ids, n: int, reps: int = 10) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        lm.forward(ids[:, CONTEXT : CONTEXT + n], CONTEXT)  # the cache past CONTEXT is written over each time
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def prefill(lm, ids, n: int) -> float:
    """One prompt of n tokens from an empty cache, its cache filled (no logits: what a request's first token waits
    for before its last position's pass)."""
    lm.reset(1, max(n, CONTEXT) + 2 * max(PASSES))
    start = time.perf_counter()
    lm.forward(ids[:, :n], 0, n_logits=0)
    seconds = time.perf_counter() - start
    lm.forward(ids[:, :CONTEXT], 0)  # the verify passes' context again
    return seconds


def models(target: str, dtypes: list[str], activations: list[int]) -> dict:
    """Each precision's model (q4: at each asked activation bits, else at the loader's: `q4-a16`, `q4-a8`)."""
    out = {}
    for d in dtypes:
        for bits in (activations or [None]) if d == q4.NAME else [None]:
            lm = load(target, ModelOptions(dtype=d)).lm
            lm = with_activations(lm, bits) if bits else lm
            out[f"{d}-a{bits_of(lm)}" if d == q4.NAME else d] = lm
    return out


def on(path: str) -> None:
    """The matrix route every later pass takes: the ladder's ('ladder') or one path forced ('avx512', 'avx2,bf16')."""
    os.environ.pop(kernels.PATH_ENV, None)
    if path != "ladder":
        os.environ[kernels.PATH_ENV] = path
    kernels.route.cache_clear()


def parser() -> argparse.ArgumentParser:
    """The command line (docs checks parse the commands they show with it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("--dtypes", default="int8,q4")
    parser.add_argument("--activations", default="", help="q4's activation bits to compare, e.g. 16,8")
    parser.add_argument("--prefill", type=int, default=0, help="also time a prompt of this many tokens")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--paths", default="ladder", help="matrix routes, ';'-separated: ladder (its choice), or a path forced: avx512"
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(args.threads)
    bits = [int(b) for b in args.activations.split(",") if b]
    paths = args.paths.split(";")
    loaded = models(args.target, args.dtypes.split(","), bits)
    lms = {f"{d}@{p}" if len(paths) > 1 else d: (lm, p) for d, lm in loaded.items() for p in paths}
    length = max(CONTEXT + max(PASSES), args.prefill)
    ids = torch.randint(100, 10000, (1, length), generator=torch.Generator().manual_seed(0))
    for lm, path in lms.values():
        on(path)
        lm.reset(1, max(length, CONTEXT + 2 * max(PASSES)))
        lm.forward(ids[:, :CONTEXT], 0)
        timed(lm, ids, 1, reps=5)  # warm-up
    got = {d: {n: [] for n in (*PASSES, "prefill")} for d in lms}
    for _ in range(ROUNDS):
        for d, (lm, path) in lms.items():
            on(path)
            for n in PASSES:
                got[d][n].append(timed(lm, ids, n))
            if args.prefill:
                got[d]["prefill"].append(prefill(lm, ids, args.prefill))
    bandwidth = machine.bandwidth(args.threads)["read_gb_per_s"]  # after the passes: nothing else was running
    on("ladder")
    print(f"matrix route here: {kernels.route().label()}")
    for d, (lm, _) in lms.items():
        step = statistics.median(got[d][1])
        passes = " / ".join(f"{statistics.median(got[d][n]) / step:.2f}" for n in PASSES[1:])
        share = machine.share(1 / step, lm.weight_bytes(), {"bandwidth": {"read_gb_per_s": bandwidth}})
        first = (
            f"; prefill of {args.prefill} tokens {statistics.median(got[d]['prefill']):.3f} s" if args.prefill else ""
        )
        print(
            f"{d}: step {step * 1e3:.2f} ms ({1 / step:.1f} tokens/s), {lm.weight_bytes() / 1e6:.0f} MB of weights a "
            f"step ({share:.0%} of {bandwidth:g} GB/s); verify over {'/'.join(map(str, PASSES[1:]))} tokens = "
            f"{passes} steps{first}"
        )


if __name__ == "__main__":
    main()
