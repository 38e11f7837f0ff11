"""Plain decoding (and optionally one drafter) on several runtimes of one target, interleaved prompt by prompt in one
process, with each runtime's speedup over the first and a paired 95 % interval: what `design`'s last grid does, for
any runtimes you name.

  .venv/bin/python scripts/bench_runtimes.py --target default --runtimes lean:fp32,lean:int8,llama-server \
      --suite spec_bench --limit 8 --max-new-tokens 96 --threads 2 --out runs/int8/runtimes

A runtime is lean:PRECISION (draftwise AR on the lean engine), llama.cpp (draftwise AR on the target's GGUF) or
llama-server (llama-server's plain decoding of the target's GGUF); with `--drafter SPEC@γ`, each lean runtime also
runs that drafter.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.config import BenchConfig, BenchGridConfig
from draftwise.design import decide
from draftwise.stages import bench_grid


def config(runtime: str, args) -> BenchConfig:
    common = dict(
        target=args.target,
        suite=args.suite,
        limit=args.limit,
        max_new_tokens=args.max_new_tokens,
        threads=args.threads,
        seed=0,
    )
    engine, _, precision = runtime.partition(":")
    if engine == "lean":
        drafter, _, gamma = (args.drafter or "").rpartition("@") if args.drafter else (None, "", "1")
        return BenchConfig(
            **common, dtype=precision, backend="lean", drafter=drafter or None, gamma=int(gamma), baselines=("ar",)
        )
    if engine == "llama.cpp":
        return BenchConfig(**common, backend="llama.cpp", drafter=None, baselines=("ar",))
    return BenchConfig(**common, drafter=None, baselines=("llama-server",))


def parser() -> argparse.ArgumentParser:
    """The command line (docs checks parse the commands they show with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--runtimes", default="lean:fp32,lean:int8,llama-server")
    p.add_argument("--drafter", help="SPEC@γ run on each lean runtime beside its AR")
    p.add_argument("--suite", default="spec_bench")
    p.add_argument("--limit", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    return p


def main() -> None:
    args = parser().parse_args()
    names = args.runtimes.split(",")
    benches = [config(n, args) for n in names]
    grid = BenchGridConfig(bench=benches[0], rows=tuple(benches[1:]), row_names=tuple(names[1:]))
    out = bench_grid.run(grid, args.out)
    records = [json.loads(line) for line in (Path(out) / "records.jsonl").read_text().splitlines()]
    by = decide.timings(records, lambda r: f"{r.get('runtime') or names[0]}/{r['method']}")
    first = next(k for k in by if k.startswith(names[0] + "/") and k.endswith("/ar"))
    result = decide.compare(by, by[first], 0)
    print(f"\n{'option':<34}{'tokens/s':>10}  speedup over {first} [95 %]")
    for n, (pt, lo, hi) in sorted(result["speedup"].items(), key=lambda kv: -kv[1][0]):
        tok = sum(t for t, _ in by[n].values()) / sum(s for _, s in by[n].values())
        print(f"{n:<34}{tok:>10.1f}  {pt:.2f}x [{lo:.2f}-{hi:.2f}]")
    (Path(out) / "speedups.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
