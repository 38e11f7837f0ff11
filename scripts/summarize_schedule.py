"""The README's round-scheduler figures from the grids of scripts/bench_schedule.sh: per engine and temperature,
static and scheduled SD over AR (tokens/s, prefill included) with 95 % paired-bootstrap intervals over prompts, the
scheduled run over the best static γ of the same drafter, the worst suite, the k* distribution and the calibration
per bin of â. Also reads a design's grids (`runs/design/stages/bench-select*`, `bench-temps`): one block per drafter."""

import json
import sys
from pathlib import Path

from draftwise import metrics
from draftwise.design import decide


def ratio_ci(a: list[dict], b: list[dict]) -> tuple[float, float, float]:
    """tokens/s of records a over records b: point and 95 % interval, the design's paired bootstrap over prompts."""

    def per_prompt(records):
        return decide.timings(records, lambda r: 0)[0]

    return tuple(decide.compare({"a": per_prompt(a)}, per_prompt(b))["speedup"]["a"])


for folder in sys.argv[1:]:
    records = [json.loads(line) for line in (Path(folder) / "records.jsonl").read_text().splitlines() if line.strip()]
    for t in sorted({r["temperature"] for r in records}):
        at = [r for r in records if r["temperature"] == t]
        ar = [r for r in at if r["method"] == "ar"]
        print(f"== {folder} T={t}: AR {metrics.tokens_per_s(ar):.1f} tok/s over {len(ar)} prompts")
        for drafter in sorted({r["drafter"] for r in at if r["method"] == "sd-scheduled"}):
            mine_d = [r for r in at if r["drafter"] == drafter]
            print(f"  {drafter.rsplit('/', 1)[-1][:60]}")
            static = {}
            for g in sorted({r["gamma"] for r in mine_d}):
                for m in ("sd", "sd-scheduled"):
                    mine = [r for r in mine_d if r["gamma"] == g and r["method"] == m]
                    if not mine:
                        continue
                    x, lo, hi = ratio_ci(mine, ar)
                    suites = metrics.per_suite(mine, ar)
                    worst = min(suites.items(), key=lambda kv: kv[1]["speedup_vs_ar"])
                    line = (
                        f"   {m:<13} γ={g}: {x:.3f}x AR [{lo:.3f}–{hi:.3f}], "
                        f"worst suite {worst[0]} {worst[1]['speedup_vs_ar']:.2f}x"
                    )
                    if m == "sd":
                        static[g] = mine
                    else:
                        best = max(static, key=lambda k: metrics.tokens_per_s(static[k]))
                        y, ylo, yhi = ratio_ci(mine, static[best])
                        sched = metrics.schedule([rd for r in mine for rd in r["rounds"]])
                        big = [c for c in sched["calibration"] if c["positions"] >= 100]
                        gaps = ", ".join(
                            f"{c['bin']}: {c['predicted']:.2f}/{c['observed']:.2f} (n={c['positions']})" for c in big
                        )
                        line += (
                            f"; over best static (γ={best}) {y:.3f}x [{ylo:.3f}–{yhi:.3f}]; k* {sched['k']}, "
                            f"verified {100 * sched['verified_fraction']:.0f} %, paused {sched['paused_rounds']}; "
                            f"calibration predicted/observed per bin ≥100: {gaps}; "
                            f"worst |gap| {max((abs(c['gap']) for c in big), default=float('nan')):.3f}"
                        )
                    print(line)
