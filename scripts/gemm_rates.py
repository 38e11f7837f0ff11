"""The int8 kernel's rate per weight format of one lean target: each distinct matrix (format, shape) timed alone at
several row counts (a step, verify passes, a prompt chunk) on the route the ladder chose here, streamed from memory
as a model's pass reads it (`rates.streamed`: copies past twice the last-level cache), rounds interleaved, medians;
then per format the time a decoding step spends in it and how close its one-row pass comes to the memory
bandwidth. What it is for: a format whose one-row pass is far below the bandwidth (on a Zen 3, Q6_K's: 28 % of the
1.5B's weights, 42 % of its step's products) is where a step's time goes. Not part of the package.

    .venv/bin/python scripts/gemm_rates.py qwen2.5-coder-1.5b --threads 2
    .venv/bin/python scripts/gemm_rates.py default --dtype int8 --rows 1,4,64
"""

import argparse
import statistics

import torch

from draftwise import machine
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean import kernels, ladder, rates
from draftwise.runtimes.lean.int8 import Int8Weight
from draftwise.runtimes.registry import load

ROUNDS = 3


def matrices(lm) -> dict[tuple, list[Int8Weight]]:
    """The target's int8 matrices by (format, rows out, inputs), each distinct weight once (a tied head is one)."""
    out: dict[tuple, list[Int8Weight]] = {}
    seen: set[int] = set()
    for _, m in lm.named_modules():
        if isinstance(m, Int8Weight) and m.q.data_ptr() not in seen:
            seen.add(m.q.data_ptr())
            out.setdefault((ladder.FORMATS[m.route_format], m.out_features, m.in_features), []).append(m)
    return out


def nbytes(w: Int8Weight) -> int:
    return sum(getattr(w, b).numel() * getattr(w, b).element_size() for b in Int8Weight.BUFFERS)


def parser() -> argparse.ArgumentParser:
    """The command line (docs checks parse the commands they show with it)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target")
    parser.add_argument("--dtype", default="q4", help="a lean integer precision: q4 (the file's blocks) or int8")
    parser.add_argument("--rows", default="1,2,4,8,64", help="rows of each product (tokens of a pass)")
    parser.add_argument("--threads", type=int, default=2)
    return parser


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(args.threads)
    rows = [int(r) for r in args.rows.split(",")]
    lm = load(args.target, ModelOptions(dtype=args.dtype)).lm
    groups = matrices(lm)
    got: dict[tuple, dict[int, list[float]]] = {key: {m: [] for m in rows} for key in groups}
    xs = {(k, m): torch.randn(m, k[2], generator=torch.Generator().manual_seed(m)) for k in groups for m in rows}
    for _ in range(ROUNDS):  # every cell once a round: drift on a shared host spreads over all of them
        for key, ws in groups.items():
            for m in rows:
                x = xs[key, m]
                got[key][m].append(rates.streamed(lambda w: kernels.int8_gemm(x, w), ws[0]))
    bandwidth = machine.bandwidth(args.threads)["read_gb_per_s"]
    print(f"matrix route here: {kernels.route().label()}; memory read {bandwidth:g} GB/s")
    step: dict[str, list[float]] = {}
    for (fmt, n, k), ws in groups.items():
        med = {m: statistics.median(v) for m, v in got[fmt, n, k].items()}
        cells = " | ".join(f"{m}: {med[m] * 1e3:.2f} ms {2 * m * n * k / med[m] / 1e9:.0f} GOPS" for m in rows)
        one = f", one row {nbytes(ws[0]) / med[1] / 1e9:.1f} GB/s" if 1 in med else ""
        print(f"{fmt} {n}x{k} ×{len(ws)}{one}: {cells}")
        if 1 in med:
            entry = step.setdefault(fmt, [0.0, 0.0])
            entry[0] += len(ws) * med[1]
            entry[1] += len(ws) * n * k
    total = sum(s for s, _ in step.values())
    for fmt, (s, weights) in sorted(step.items(), key=lambda kv: -kv[1][0]):
        print(
            f"{fmt}: {weights / 1e6:.0f}M weights, {s * 1e3:.1f} ms of a step's {total * 1e3:.1f} ms of products "
            f"({s / total:.0%}; {weights / sum(w for _, w in step.values()):.0%} of the weights)"
        )


if __name__ == "__main__":
    main()
