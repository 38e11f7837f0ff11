"""Where a bench run's SD rounds spent their time against the profile that priced them: per drafter, the mean verify
pass by proposal length beside the profile's curve; for a hybrid, its model rounds right after lookup rounds (the
catch-up) beside the others, and the catch-up `cost.catch_up_s` prices. Arithmetic over records. Not part of the
package.

    .venv/bin/python scripts/round_costs.py runs/design/stages/profile runs/design/stages/bench-select
"""

import json
import statistics
import sys
from pathlib import Path

from draftwise import cost, metrics
from draftwise.stages.predict import in_order

profile, bench = Path(sys.argv[1]), Path(sys.argv[2])
entry = json.loads((profile / "profile.json").read_text())["batches"]["1"]
curve = cost.verify_curve(entry)
records = [json.loads(line) for line in (bench / "records.jsonl").read_text().splitlines() if line.strip()]
print(f"AR step (profile): {entry['ar_step_ms']:.1f} ms")
for drafter in dict.fromkeys(r["drafter"] for r in records if r["method"] == "sd"):
    rounds = in_order([r for r in records if r["method"] == "sd" and r["drafter"] == drafter])
    by: dict[int, list[float]] = {}
    for r in rounds:
        by.setdefault(r["drafted"], []).append(1e3 * r["verify_s"])
    cells = ", ".join(f"{g}: {statistics.mean(v):.1f} / {curve(g):.1f}" for g, v in sorted(by.items()))
    print(f"{drafter[:60]}: verify ms by tokens drafted, measured / profiled: {cells}")
    sources = {metrics.source_of(r) for r in rounds}
    if "model" not in sources or not sources - {"model", ""}:
        continue
    after, others, fed, prompt = [], [], 0, None
    for r in rounds:
        if r["prompt_id"] != prompt:
            fed, prompt = 0, r["prompt_id"]
        source = metrics.source_of(r)
        if source == "model":
            (after if fed else others).append(r["draft_s"])
            fed = 0
        elif source:
            fed += r["emitted"]
    step = statistics.mean(others)
    measured = sum(after) - len(after) * step
    priced = cost.catch_up_s(rounds, lambda g: curve(g) / 1e3, step)
    print(
        f"  model rounds after lookup rounds: {len(after)}, {1e3 * statistics.mean(after):.1f} ms on average against "
        f"{1e3 * step:.1f} for the other {len(others)}; catch-up measured {measured:.2f} s, priced {priced:.2f} s"
    )
