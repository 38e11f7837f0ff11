"""A design's cuts of the sibling (`cuts`) as stages: each cut pruned, its draft step timed where several compete, and
distilled for a pilot, then the one the learning curves rank first trained on for the minutes the others leave
(`cuts.focus`)."""

from __future__ import annotations

from dataclasses import replace

from .. import cost
from ..config import DistillConfig
from ..rundir import read_records
from ..runtimes.base import ModelOptions
from ..runtimes.checkpoint import drafter_options
from ..runtimes.registry import load
from ..shapes import Shape
from ..stages import distill, prune
from . import cuts
from .candidates import Candidate
from .pipeline import Pipeline, Stages
from .plan import probe
from .target import target_of


def distill_cut(p: Stages, cand: Candidate, n_cuts: int, prerank: bool = False) -> None:
    """A shape cut from the sibling at fp32 (calibrated on the target's continuations) and distilled on those
    continuations' top-k (gen-data's) and the train text the target scored teacher-forced as studied (`cuts`): all its
    minutes, or a pilot's where `n_cuts` compete for the rest (none where they are ranked untrained, `prerank`; no
    stop rule then: the ranking after decides)."""
    prune_config = cuts.prune_config(p.config, cand, str(p.folder("gen-data")), p.sizes.elimination_tokens)
    p.stage(f"prune-{cand.name}", lambda f: prune.run(prune_config, f))
    if n_cuts > 1 and p.config.plan:  # the plan's probe of the target is what the step is divided by
        time_step(p, cand)
    c = cuts.predicted_c(cand.shape, Shape.of(target_of(p.config).model_config()))  # a worker holds no target
    minutes = cuts.pilot_minutes(p.sizes.distill_minutes, n_cuts, prerank)
    config = distill_config(p, cand, minutes, 0.0 if n_cuts > 1 else cost.optimistic_break_even(c))
    p.stage(f"distill-{cand.name}", lambda f: distill.run(config, f), predicted_c=round(c, 4))


def time_step(p: Stages, cand: Candidate) -> None:
    """The pruned cut's draft step (stage `step-<name>`: `draft_ms`), timed as the plan times the target's decode
    step (`plan.probe`: the same prompt and decode length) on the runtime the benchmarks run it, so that the cuts are
    ranked at a measured c (`cut_c`). Why: the bytes a step reads (`cuts.predicted_c`) leave out the layers' own
    cost, so cuts of equal parameters price alike: a Zen 4 design priced its 8- and 24-layer cuts at c 0.087 both,
    then measured 0.198 and 0.223. The step depends on the shape alone, so the untrained cut times it."""
    spec = str(p.folder(f"prune-{cand.name}") / "reduced")
    options = drafter_options(spec, ModelOptions(p.config.dtype, p.config.device))
    p.stage(f"step-{cand.name}", lambda f: {"draft_ms": round(1e3 * probe(load(spec, options)), 3)})


def cut_c(p: Pipeline, name: str) -> float:
    """Cut `name`'s draft step over the target's: its timed step (`time_step`) over the plan's probe of the target,
    else its weights' bytes over the target's (`cuts.predicted_c`: no plan, or a run from before the timing)."""
    step = p.done.get(f"step-{name}")
    if step and p.planner and p.planner.step_s:
        return step["draft_ms"] / (1e3 * p.planner.step_s)
    return p.done[f"distill-{name}"]["predicted_c"]


def distill_config(p: Stages, cand: Candidate, minutes: float, stop_below: float) -> DistillConfig:
    data = str(p.folder("gen-data"))
    teacher_data = f"{data},{p.folder('teacher')}" if "teacher" in p.done else data  # both: the target's own text
    return cuts.distill_config(p.config, str(p.folder(f"prune-{cand.name}")), teacher_data, data, minutes, stop_below)


def focus(p: Pipeline, cands: list[Candidate], prerank: bool = False) -> None:
    """After the cuts' pilots: the cut their learning curves rank first trains on from its pilot for the minutes the
    others leave, or, ranked untrained (`prerank`), for all the training minutes (`cuts.focus`; a decision record,
    then `cuts.more_stage`). Ranked untrained, it keeps a single cut's stop rule: it trains on where its curve pays."""
    cut = [x for x in cands if x.source]
    if len(cut) < 2:
        return
    minutes = p.sizes.distill_minutes * (1 if prerank else (1 - cuts.PILOT_SHARE) * len(cut))

    def decide(folder) -> dict:  # the pilots' records read once, when the decision is made (a rerun reads its record)
        pilots = {
            x.name: (
                cut_c(p, x.name),
                read_records(p.folder(f"distill-{x.name}") / "records.jsonl"),
            )
            for x in cut
        }
        return cuts.focus(pilots, minutes, prerank)

    decision = p.stage("focus-cuts", decide)
    chosen = decision["chosen"]
    if chosen:
        cand = next(x for x in cut if x.name == chosen)
        c = next(r["c"] for r in decision["ranking"] if r["name"] == chosen)
        stop = cost.optimistic_break_even(c) if decision.get("prerank") else 0.0
        config = replace(distill_config(p, cand, minutes, stop), resume_from=str(p.folder(f"distill-{chosen}")))
        p.stage(cuts.more_stage(chosen), lambda f: distill.run(config, f))
