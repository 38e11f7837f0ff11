"""The `design` report's section on the time budget (`design/plan`): what each phase's plan set, what it left
out, how its predictions held, and the elapsed time against `--minutes`, from the run's own plan and done records."""

from __future__ import annotations

from pathlib import Path

from ...report.doc import Doc
from ...report.fmt import num as _f
from ...report.plots import _save, plt
from .. import cuts
from ..pipeline import DesignFolder
from ..plan import DECIDED, FLOORS

DROPPED = {
    "repeats": "re-measuring passes of tied options",
    "accuracy": "the accuracy sanity check",
    "serve": "the deploy command measured through `draftwise serve` (HTTP)",
    "batch": "the batch dividend",
    "gen-data-more": "more gen-data for the suffix corpus",
    "headline": "the headline against transformers",
    "temperatures": "the chosen drafter's own grid at the temperatures above 0 (the last grid measures every "
    "temperature of the traffic whatever the budget)",
    "extra-rows": "the llama.cpp rows beyond the target's own file",
    "reduced-heads": "reduced draft heads and adaptive lookahead",
    "llama.cpp": "every llama.cpp row's own verdict (its plain decodings are still measured in the last grid)",
    "scheduler": "the scheduled lookup candidates",
    "control": "the deep-narrow control (only the predicted-fastest shape was trained)",
    "training": "every trained candidate (sweep, pruning, distillation): untrained and lookup drafters only",
}
TRAINING = ("control", "training")  # drops that mean nothing where the study takes its candidates as they are

SHOWN = {  # the sizes a phase's plan sets, as its table heads them
    "gen_prompts": "gen prompts",
    "teacher_tokens": "teacher tokens",
    "distill_minutes": "distill min",
    "feature_minutes": "feature min",
    "elimination_tokens": "eliminated positions",
    "agree_limit": "agree prompts",
    "tune_prompts": "tune prompts",
    "bench_limit": "bench prompts",
    "refine_limit": "refine prompts",
    "headline_limit": "headline prompts",
    "accuracy_items": "accuracy items",
}


def section(doc: Doc, p: DesignFolder, plots: Path, footer: str) -> None:
    """The budget against the time the stages took, each phase's plan, and what the budget left out."""
    planner = p.planner
    plans = list(planner.plans.values()) if planner else []  # in the order they were made
    doc.h("Time budget")
    if not plans:
        doc.p(f"Sizes fixed (`--fixed-sizes`): `--minutes {p.base.minutes:g}` sized only the data and distillation.")
        return
    budget, used = 60 * p.base.minutes, p.elapsed()
    trains = p.base.trains or cuts.source(p.base) is not None  # a q4 study trains nothing but a sibling's cuts
    dropped = [d for d in left_out(plans) if trains or d not in TRAINING]
    doc.p(
        f"`--minutes {p.base.minutes:g}`: the stages took {used / 60:.1f} minutes up to this report "
        f"({used / budget:.0%} of the budget; export and report writing come after). Before each phase the plan "
        f"sized every stage still to come to the time left, from a probe AR step of {_f(1e3 * planner.step_s)} ms and "
        "the measured ÷ predicted time of the stages already finished (per family of stages)."
    )
    keep = keep_minutes(plans)
    said = [DROPPED.get(d, d) + (f" (`--minutes {keep[d]:g}` would keep it)" if d in keep else "") for d in dropped]
    doc.p("Left out by the budget: " + ("; ".join(said) + "." if said else "nothing."))
    _plans_table(doc, plans)
    doc.p(
        "σ scales every count from its full size (the config's) down to its floor ("
        + ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in FLOORS.items())
        + "); above 1 only data and "
        "distillation grow. A phase's sizes hold for its stages (a resumed run reuses its plan)."
    )
    _families_table(doc, p.planner)
    if said := memory_sentence(p.done):
        doc.p(said)
    doc.img(timeline(p, plans, budget, plots, footer), "Elapsed time per finished stage against the budget")


def _plans_table(doc, plans: list[dict]) -> None:
    """Each phase's plan: time used, left and planned, σ, and the sizes it set."""
    rows = []
    for r in plans:
        s = r["sizes"]
        rows.append(
            [
                r["phase"],
                _f(r["elapsed_s"] / 60, ".1f"),
                _f(r["left_s"] / 60, ".1f"),
                _f(r["predicted_s"] / 60, ".1f"),
                _f(s["sigma"], ".2f"),
            ]
            + [_f(s[k], "g") for k in SHOWN]
        )
    doc.table(
        [
            "phase",
            "min used",
            "min left",
            "min planned",
            "σ",
            *SHOWN.values(),
        ],
        rows,
    )


def _families_table(doc, planner) -> None:
    """Per family of stages: what the finished ones took against what was predicted before any correction."""
    fam = {
        k: (int(s["stages"]), s["seconds"], s["predicted"] + s["exact"])
        for k, s in planner.families().items()
        if k != "*"
    }
    doc.table(
        ["family", "stages", "measured min", "predicted min (before corrections)", "measured ÷ predicted"],
        [
            [k, n, _f(a / 60, ".2f"), _f(b / 60, ".2f"), _f(a / b if b else None, ".2f")]
            for k, (n, a, b) in sorted(fam.items(), key=lambda kv: -kv[1][1])
        ],
    )


def memory_sentence(done: dict[str, dict]) -> str:
    """The stages that held the most memory (`memory.Peak`: each stage's own high-water mark in the design's
    process), empty for a run that recorded none."""
    peaks = sorted(((r["peak_gb"], name) for name, r in done.items() if "peak_gb" in r), reverse=True)
    if not peaks:
        return ""
    most = ", ".join(f"{name} {gb:.1f} GB" for gb, name in peaks[:3])
    return (
        f"Memory: the design's process peaked at {peaks[0][0]:.1f} GB resident. The stages that held the most: {most} "
        "(each stage's own peak, which counts what the process held when it began; a stage run in a child process "
        "counts only the parent's share)."
    )


def left_out(plans: list[dict]) -> list[str]:
    """The drops that took effect: each in the plan of the phase where its stages were due (`plan.DECIDED`; a further
    llama.cpp row in its own phase)."""
    out = []
    for r in plans:
        for d in r["sizes"]["dropped"]:
            if DECIDED.get(d) == r["phase"] or d == "extra-rows" and r["phase"].startswith("row-"):
                out.append(d)
    return list(dict.fromkeys(out))


def keep_minutes(plans: list[dict]) -> dict[str, float]:
    """{drop: the --minutes that would have kept it}, from the plan of the phase it took effect in (`plan.keep_minutes`;
    a run planned before the figure was recorded has none)."""
    return {d: m for r in plans for d, m in r.get("keep_minutes", {}).items()}


def timeline(p: DesignFolder, plans: list[dict], budget: float, folder: Path, footer: str) -> Path:
    """Elapsed minutes at each finished stage, each phase's planned finish, and the budget with its ±10 % band."""
    done = sorted((r["elapsed_s"], r["stage"]) for r in p.done.values() if "elapsed_s" in r)
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.axhspan(0.9 * budget / 60, 1.1 * budget / 60, color="0.9", label="budget ±10 %")
    ax.axhline(budget / 60, color="0.4", lw=1)
    ax.plot(range(1, len(done) + 1), [t / 60 for t, _ in done], marker=".", label="elapsed at each finished stage")
    xs, ys = [], []
    for r in plans:
        at = sum(1 for t, _ in done if t <= r["elapsed_s"])
        xs.append(at + 0.5)
        ys.append((r["elapsed_s"] + r["predicted_s"]) / 60)
    ax.scatter(xs, ys, marker="x", color="C3", label="a phase's planned finish")
    ax.set(
        xlabel="finished stages",
        ylabel="minutes",
        ylim=(0, max([budget / 60 * 1.2] + ys + [t / 60 for t, _ in done]) * 1.05),
        title=f"Time budget: {budget / 60:g} minutes",
    )
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig, folder / "time_budget.png", footer)
