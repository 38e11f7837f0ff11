"""Every option of a bench or bench-grid run folder against one of them, with a paired 95 % interval (a bootstrap
over prompts, as `design` decides): e.g. every lean-int8 method and llama-server built-in over llama-server's plain
decoding.

  .venv/bin/python scripts/speedups.py runs/int8/spec-q4_1 --over llama-server
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwise.design import decide
from draftwise.stages.bench_grid import label


def name(r: dict) -> str:
    """An option: its method, with its drafter and γ when it has one, and its runtime when it is a row's."""
    what = r["method"] + (f" {label(r['drafter'], 40)} γ={r['gamma']}" if r.get("drafter") else "")
    return f"{r['runtime']}/{what}" if r.get("runtime") else what


def parser() -> argparse.ArgumentParser:
    """The command line (docs checks parse the commands they show with it)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="a bench or bench-grid run folder")
    p.add_argument("--over", default="ar", help="the option every other is compared with (default: ar)")
    return p


def main() -> None:
    args = parser().parse_args()
    records = [json.loads(line) for line in (Path(args.run) / "records.jsonl").read_text().splitlines() if line.strip()]
    by = decide.timings([r for r in records if r.get("temperature", 0.0) == 0], name)
    result = decide.compare(by, by[args.over], 0)
    print(f"{'option':<64}{'tokens/s':>10}  over {args.over} [95 %]  ({result['prompts']} prompts)")
    for n, (pt, lo, hi) in sorted(result["speedup"].items(), key=lambda kv: -kv[1][0]):
        tok = sum(t for t, _ in by[n].values()) / sum(s for _, s in by[n].values())
        print(f"{n:<64}{tok:>10.1f}  {pt:.2f}x [{lo:.2f}-{hi:.2f}]")


if __name__ == "__main__":
    main()
