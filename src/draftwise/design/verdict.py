"""The design's verdict — deploy the chosen drafter, or plain decoding — recorded once, so that the report's opening,
its sections and the export all say the same thing.

  recommend    the chosen drafter's speedup over AR in the selection grid is above 1 beyond noise (the lower end of
               its 95 % interval > 1); otherwise the verdict is plain decoding, with the best candidate's figure beside
  per task     the chosen drafter's speedup and TAR per suite (the same grid), and its spec_bench headline
  candidates   for every benchmarked candidate: measured c (a model's draft step / AR step; for a lookup or a hybrid the
               draft time per drafting round, in AR steps), α and proposal statistics, and the cost model's break-even
               (`cost.break_even_tar`, `break_even_alpha`, `break_even_draft`): the TAR (and the i.i.d. α) it would
               need at its measured draft cost and proposal lengths, and the draft cost it could afford at its TAR;
               its predicted speedup at i.i.d. α = 0.3 / 0.5 / 0.7 (`cost.speedup_at`) — what the verdict states
               instead of acceptance when the target's weights are random (`random_weights`: a real model's shape, whose
               costs are real and whose acceptance means nothing)
  learning     for every trained candidate (its `distill-<name>` or `feature-<name>` stage logged evaluations): its
               learning curve and when more training would pay (`learning.predict`): the teacher tokens and minutes
               of training here after which its agreement (≈ greedy α) reaches its break-even α, and the α at which
               the cost model predicts it as fast as the best lookup measured (`cost.alpha_for_speedup`)
"""

from __future__ import annotations

import json

from .. import cost, learning
from ..rundir import read_records
from ..sd.families import SERIAL, drafter_kind
from ..stages.bench_grid import as_method, label
from . import cuts
from .measure import grid_points, method_of, summary
from .target import target_of

TRAINING = ("distill", "feature")  # the stages that train a candidate, each logging its learning curve
ALPHAS = (0.3, 0.5, 0.7)  # the acceptances a candidate's speedup is predicted at, from its measured costs


def verify_steps(p, stage: str = "profile"):
    """t_verify(g) in AR steps at batch 1 (a profile stage's interleaved ratios; g = 0: one AR step)."""
    entry = json.loads((p.folder(stage) / "profile.json").read_text())["batches"]["1"]
    points = [(0, 1.0)] + sorted((int(g), r) for g, r in entry["verify_over_ar_step"].items())
    return lambda g: cost.interpolate([x for x, _ in points], [y for _, y in points], g)


def candidate(point: dict, kind: str, speedup: list[float], t_verify, method: str = "sd") -> dict:
    """One benchmarked candidate's measured costs and its break-even, from its selection-grid point (`method`: static
    SD, or the scheduled variant measured in the same point; its proposal lengths are what the scheduler verified)."""
    sd = point["methods"][method]
    lengths = _lengths(sd)
    drafting = sum(n for g, n in lengths.items() if g)
    ar_s = point["ar_step_ms"] / 1e3
    afford = cost.break_even_draft(lengths, sd["tar"], t_verify)  # per drafting round, at its measured TAR
    if kind in SERIAL:  # γ serial steps (a model's forwards, a feature head's passes): c per token
        c = sd["draft_step_ms"] / point["ar_step_ms"]
        afford = afford / max((g for g in lengths if g), key=lengths.get) if afford is not None else None  # per token
    else:  # one proposal per drafting round, whatever its length
        c = sd["draft_s"] / drafting / ar_s if drafting else 0.0
    t_draft = _draft_time(kind, c)
    return {
        "kind": kind,
        "method": method,
        "gamma": point["gamma"],
        "speedup": speedup,
        "tar": sd["tar"],
        "alpha": sd["alpha"],
        "c": c,
        "proposed_fraction": sd.get("proposed_fraction"),
        "mean_proposal": sum(g * n for g, n in lengths.items()) / drafting if drafting else 0.0,
        "tar_needed": cost.break_even_tar(lengths, t_draft, t_verify),
        "alpha_needed": cost.break_even_alpha(lengths, t_draft, t_verify),
        "c_affordable": afford,
        "predicted": {f"{a:g}": cost.speedup_at(lengths, t_draft, t_verify, a) for a in ALPHAS},
    }


def _lengths(sd: dict) -> dict[int, int]:
    """Rounds per proposal length of a bench method's summary."""
    return {int(g): n for g, n in sd["proposal_lengths"].items()}


def _draft_time(kind: str, c: float):
    """Draft time of a round proposing g tokens, in AR steps: g serial steps of c (a model or a feature head), else one
    proposal."""
    return (lambda g: g * c) if kind in SERIAL else (lambda g: c if g else 0.0)


def training_records(p, name: str) -> list[dict]:
    """The records of the stage that trained candidate `name` — `distill-more-<name>` (a cut trained on from its
    pilot, its pilot's records carried on: `cut_stages.focus`), `distill-<name>` (pruned + distilled) or
    `feature-<name>` (a feature-level head), whichever logged evaluations; [] for a candidate not trained here."""
    for folder in (cuts.more_stage(name), *(f"{stage}-{name}" for stage in TRAINING)):
        records = read_records(p.folder(folder) / "records.jsonl")
        if any(r.get("event") == "eval" for r in records):
            return records
    return []


def rival(cands: dict) -> tuple[str, float] | None:
    """The lookup candidate with the best measured speedup, when it beats plain decoding (a slower lookup is beaten
    by any drafter that pays, so it sets no target of its own)."""
    lookups = {n: x["speedup"][0] for n, x in cands.items() if x["kind"] == "lookup"}
    best = max(lookups, key=lookups.get, default=None)
    return (best, lookups[best]) if best is not None and lookups[best] > 1.0 else None


def outlook(name: str, entry: dict, point: dict, t_verify, records: list[dict], best: tuple[str, float] | None):
    """A trained candidate's learning-curve outlook (`learning.predict`), from its training records and its verdict
    entry: its break-even α, and the α at which the cost model — at its measured draft cost and proposal lengths —
    predicts it `best`'s measured speedup (prefill included in that figure, so the target is a little generous)."""
    beat = (
        cost.alpha_for_speedup(
            _lengths(point["methods"][entry["method"]]), _draft_time(entry["kind"], entry["c"]), t_verify, best[1]
        )
        if best
        else None
    )
    where = f"the best lookup ({best[0]}, {best[1]:.2f}×)" if best else None
    return learning.predict(records, entry["alpha_needed"], beat, name=name, rival=where)


def _add_learning(p, cands: dict, points: dict, specs: dict, t_verify) -> None:
    """Each trained candidate's `learning` entry, beside its break-even."""
    best = rival(cands)
    for n, x in cands.items():
        records = training_records(p, n) if x["kind"] not in ("lookup", "hybrid") else []
        if records:
            x["learning"] = outlook(n, x, points[specs[n]], t_verify, records, best)


def decide(p, gamma: int) -> dict:
    decision = p.done["select-drafter"]
    chosen, specs = decision["chosen"], p.done["bench-select"]["drafters"]
    points = {r["drafter"]: r for r in grid_points(p, "bench-select")}
    t_verify = verify_steps(p)
    cands = {
        n: candidate(points[specs[n]], drafter_kind(specs[n]), decision["speedup"][n], t_verify, method_of(p, n))
        for n in decision["speedup"]
    }
    _add_learning(p, cands, points, specs, t_verify)
    speedup, method = decision["speedup"][chosen], method_of(p, chosen)
    headline = summary(p, "bench-headline")["methods"][method]["speedup_vs_ar"] if "bench-headline" in p.done else None
    random = target_of(p.config).random_weights
    return {
        "recommend": speedup[1] > 1.0 and not random,  # a drafter is not chosen by acceptance on random weights
        "drafter": chosen,
        "spec": specs[chosen],
        "kind": drafter_kind(specs[chosen]),
        "method": method,
        "gamma": gamma,
        "grid_gamma": cands[chosen]["gamma"],
        "speedup": speedup,
        "headline_speedup": headline,
        "per_task": as_method(points[specs[chosen]], method).get("by_suite") or {},
        "candidates": cands,
        "random_weights": random,
        "rule": "deploy when the chosen drafter's speedup over AR is above 1 beyond noise (95 % interval, paired "
        "bootstrap over prompts); otherwise plain decoding",
    }


def sentence(v: dict, describe_spec=lambda spec: label(spec, 80)) -> str:
    """The verdict in one sentence (the report opens with it, the export README too); specs by their short label, so
    no path of the machine that ran the design appears."""
    pt, lo, hi = v["speedup"]
    tasks = ", ".join(
        f"{s} {x['speedup_vs_ar']:.2f}×" for s, x in sorted(v["per_task"].items()) if x.get("speedup_vs_ar") is not None
    )
    grid_gamma = v.get("grid_gamma", v["gamma"])
    at = (
        ""
        if grid_gamma == v["gamma"]
        else f" (in the selection grid, at γ = {grid_gamma}; the γ grid then chose {v['gamma']})"
    )
    if v.get("method", "sd") != "sd":
        at += " with the round scheduler (each round verifies the prefix its verify curve and calibration price best)"
    if v.get("random_weights"):
        return predicted(v, describe_spec)
    if v["recommend"]:
        return (
            f"Deploy {v['drafter']} ({describe_spec(v['spec'])}, γ = {v['gamma']}): {pt:.2f}× plain decoding on "
            f"this machine [95 % interval {lo:.2f}–{hi:.2f}]{at} over the eval mix of every task"
            + (f", {v['headline_speedup']:.2f}× on spec_bench" if v.get("headline_speedup") is not None else "")
            + (f"; per task: {tasks}." if tasks else ".")
        )
    return (
        f"Use plain decoding: no candidate beats it here beyond noise. The best, {v['drafter']} "
        f"({describe_spec(v['spec'])}, γ = {v['gamma']}), measured {pt:.2f}× [{lo:.2f}–{hi:.2f}]{at}."
    )


def predicted(v: dict, describe_spec=lambda spec: label(spec, 80)) -> str:
    """The verdict on a target of random weights: its measured acceptance means nothing, so each candidate's break-even
    α and the speedup the cost model predicts at α = 0.3 / 0.5 / 0.7 from its measured costs, marked as predicted."""
    parts = []
    for name, x in sorted(v["candidates"].items(), key=lambda kv: -kv[1]["predicted"][f"{ALPHAS[-1]:g}"]):
        need = f"break-even α {x['alpha_needed']:.2f}" if x["alpha_needed"] is not None else "no break-even α"
        at = " / ".join(f"{x['predicted'][f'{a:g}']:.2f}×" for a in ALPHAS)
        parts.append(f"{name} (γ = {x['gamma']}): {need}, {at}")
    alphas = " / ".join(f"{a:g}" for a in ALPHAS)
    return (
        "The target's weights are random: what any drafter measured on it says nothing of a real model of this shape, "
        "so no drafter is chosen by it. Predicted from the measured costs (draft step, verify curve; batch 1, "
        f"prefill left out), speedup over plain decoding at α = {alphas}: " + "; ".join(parts) + " (predicted)."
    )
