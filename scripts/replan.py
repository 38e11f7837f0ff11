"""A design run's start plan at other target steps: for each step (ms), whether the `build` phase keeps training and
the --minutes that would keep each stage it leaves out. Arithmetic over the run's config and probe record (nothing
is loaded or run), so it shows how close a run's machine came to training its drafters. Not part of the package.

    .venv/bin/python scripts/replan.py runs/pair-design 40 45 50 55 60 71
    .venv/bin/python scripts/replan.py runs/pair-design --items 71   (the stages' minutes with training kept)
    .venv/bin/python scripts/replan.py runs/pair-design --teacher   (the teacher's plan once gen-data had run)
"""

import itertools
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from draftwise.config import DesignConfig
from draftwise.config.base import from_dict
from draftwise.design import plan, requests

run = Path(sys.argv[1])
config = from_dict(DesignConfig, json.loads((run / "config.json").read_text()))
records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line.strip()]
probe = next(r for r in records if r["event"] == "probe")
pipeline = SimpleNamespace(base=config, done={}, dir=SimpleNamespace(append=lambda r: None))
items = "--items" in sys.argv
steps = [a for a in sys.argv[2:] if a not in ("--items", "--teacher")]
print(f"{run}: probed {probe['step_ms']:.1f} ms a step, --minutes {config.minutes:g}")
for ms in map(float, steps or [probe["step_ms"]]):
    planner = plan.Planner(pipeline, [{**probe, "step_ms": ms}])
    planner.before = probe["elapsed_s"]  # the plan was made after the probe
    planner.know(**requests.outline(config))
    sizes = planner.plan("build")
    keep = ", ".join(f"{k} with --minutes {m:g}" for k, m in planner.plans["build"]["keep_minutes"].items())
    print(
        f"{ms:6.1f} ms: training {'left out' if 'training' in sizes.dropped else 'kept'}; σ {sizes.sigma:.2f}"
        + (f"; left out, kept at: {keep}" if keep else "")
    )
    if items:  # this plan with training kept (its other drops as they are) at σ = SIGMA_KEEP, stage by stage
        full = plan.nominal(config, planner.outline.trained)
        kept = plan.scale(full, plan.SIGMA_KEEP, tuple(d for d in sizes.dropped if d != "training"))
        print(f"  with training kept: {planner.predicted_s(kept, {}) / 60:.1f} min")
        for item in planner.remaining(kept):
            print(f"    {item.kind:16s} x{item.count} {planner.seconds(item, {}) / 60:6.1f} min")


def built_planner(done: dict) -> plan.Planner:
    """A planner of the run after its build phase, `done` its finished stages: the candidates' counts, which the
    records do not hold, are the ones whose prices give the build plan's prediction."""
    build = next(r for r in records if r["event"] == "plan" and r["phase"] == "build")
    sizes = plan.Sizes(**{k: tuple(v) if k == "dropped" else v for k, v in build["sizes"].items()})
    for trained, untrained, features in itertools.product(range(4), range(6), range(2)):
        p = SimpleNamespace(base=config, done={}, dir=SimpleNamespace(append=lambda r: None))
        planner = plan.Planner(p, [probe])
        planner.know(**requests.outline(config))
        benched = trained + features + bool(config.drafter)
        planner.know(trained=trained, untrained=untrained, features=features, benched=benched, built=True)
        if abs(planner.predicted_s(sizes, {}) - build["predicted_s"]) < 1e-3:
            p.done = done
            return planner
    raise SystemExit("no candidate counts give the build plan's prediction")


if "--teacher" in sys.argv:  # what a plan between gen-data and the teacher (`build.build`) gives from this run
    gen = next(r for r in records if r.get("event") == "done" and r["stage"] == "gen-data")
    planner = built_planner({"gen-data": gen})
    planner.before = gen["elapsed_s"]
    built = next(r for r in records if r["event"] == "plan" and r["phase"] == "build")["sizes"]
    sizes = planner.plan("teacher")
    print(
        f"after gen-data ({gen['elapsed_s'] / 60:.1f} min, κ {planner.kappa()}): teacher {built['teacher_tokens']} → "
        f"{sizes.teacher_tokens} tokens, distillation {built['distill_minutes']} → {sizes.distill_minutes} min, "
        f"σ {built['sigma']} → {sizes.sigma}"
    )
