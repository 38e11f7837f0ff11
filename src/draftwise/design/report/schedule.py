"""The `design` report's section on the round scheduler (`sd.schedule`): per runtime and temperature, each scheduled
lookup beside its static settings and AR on the same prompts, the distribution of k* (tokens a round verified of its
proposal), and the calibration — predicted acceptance â against the acceptance observed, per bin of â."""

from __future__ import annotations

import json
from pathlib import Path

from ...report.doc import Doc
from ...report.fmt import num as _f
from ...report.plots import _save, plt
from ...stages.bench import SCHEDULED
from ...stages.bench_grid import label
from ..pipeline import DesignFolder
from .per_row import rows_of

MIN_POSITIONS = 100  # a calibration bin is judged when it holds this many observed positions
PLOT_POSITIONS = 30  # and drawn when it holds this many


def scheduled_points(p: DesignFolder) -> list[dict]:
    """Every grid point of the design that ran the scheduler: its engine, temperature and both SD summaries."""
    stages = [("bench-select", "lean"), ("bench-temps", "lean")] + [
        (f"bench-select@{v['engine']}", v["engine"]) for v in rows_of(p)
    ]
    out = []
    for stage, engine in stages:
        path = p.folder(stage) / "grid.json"
        if stage not in p.done or not path.exists():
            continue
        for r in json.loads(path.read_text())["points"]:
            if (r["methods"].get(SCHEDULED) or {}).get("schedule"):  # none where no round had a proposal to price
                out.append(
                    {
                        "engine": engine,
                        "temperature": r["temperature"],
                        "drafter": label(r["drafter"], 40),
                        "gamma": r["gamma"],
                        "scheduled": r["methods"][SCHEDULED],
                        "static": r["methods"]["sd"],
                        "ar": r["methods"]["ar"],
                    }
                )
    return out


def worst_gap(calibration: list[dict]) -> dict | None:
    big = [c for c in calibration if c["positions"] >= MIN_POSITIONS]
    return max(big, key=lambda c: abs(c["gap"])) if big else None


def calibration_plot(points: list[dict], folder: Path, footer: str) -> Path:
    """Reliability curves: observed against predicted acceptance per bin, one per point; bins of fewer than
    PLOT_POSITIONS positions are left out (a handful of positions is noise, not calibration)."""
    fig, ax = plt.subplots(figsize=(6, 5))
    for x in points:
        cal = [c for c in x["scheduled"]["schedule"]["calibration"] if c["positions"] >= PLOT_POSITIONS]
        ax.plot(
            [c["predicted"] for c in cal],
            [c["observed"] for c in cal],
            "o-",
            lw=1,
            alpha=0.8,
            label=f"{x['engine']} T={x['temperature']:g} {x['drafter'][:16]}",
        )
    ax.plot([0, 1], [0, 1], color="0.6", lw=1)
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1),
        xlabel="predicted acceptance â (bin mean)",
        ylabel="observed acceptance",
        title=f"Round scheduler calibration (bins of ≥ {PLOT_POSITIONS} positions)",
    )
    ax.legend(fontsize=6)
    return _save(fig, folder / "schedule_calibration.png", footer)


def section(doc: Doc, p: DesignFolder, plots: Path, footer: str) -> None:
    points = scheduled_points(p)
    if not points:
        return
    doc.h("The round scheduler")
    start = p.done.get("calibrate-lookup", {}).get("positions", {})
    doc.p(
        "Each tuned lookup also ran under the round scheduler, in the same grid point as its static settings (same γ, "
        "the same prompts, interleaved): each round verifies the prefix k* of the proposal that maximises expected "
        "tokens per second, E[N | k] / t_verify(k), with this engine's profiled verify curve and the proposal's "
        "calibrated acceptance â; k* = 0 is a plain AR step, so a proposal that does not pay is not verified. The "
        "acceptance rule is untouched (greedy output stays AR's). Calibration started from the tuned lookups replayed "
        "over the target's text (`stages/calibrate-lookup/calibration.json`: "
        + ", ".join(f"{n} positions at T={t}" for t, n in start.items())
        + ") and was updated from each run's own rounds. Speedups are tokens/s over AR on the point's prompts."
    )
    rows = []
    for x in points:
        s, sched = x["scheduled"], x["scheduled"]["schedule"]
        ar = x["ar"]["tokens_per_s"]
        worst = worst_gap(sched["calibration"])
        total = sum(sched["k"].values())
        ks = ", ".join(f"{k}: {100 * n / total:.0f} %" for k, n in sched["k"].items())
        rows.append(
            [
                x["engine"],
                f"{x['temperature']:g}",
                x["drafter"],
                x["gamma"],
                _f(s["tokens_per_s"] / ar, ".2f", "x"),
                _f(x["static"]["tokens_per_s"] / ar, ".2f", "x"),
                _f(s["tokens_per_s"] / x["static"]["tokens_per_s"], ".2f", "x"),
                ks,
                _f(100 * (sched["verified_fraction"] or 0), ".0f", " %"),
                sched["paused_rounds"],
                f"{worst['gap']:+.3f} ({worst['bin']})" if worst else "no bin ≥ 100",
            ]
        )
    doc.table(
        [
            "engine",
            "T",
            "drafter",
            "γ",
            "scheduled / AR",
            "static / AR",
            "scheduled / static",
            "k* (share of rounds)",
            "proposed tokens verified",
            "paused rounds",
            f"worst calibration gap, bins ≥ {MIN_POSITIONS}",
        ],
        rows,
    )
    doc.p(
        "Calibration gap = mean predicted â − mean observed acceptance over the positions of one bin of â (observed: "
        "1[x = the target's argmax] at T = 0, min(1, p(x)) at T > 0, for every reached position)."
    )
    doc.img(calibration_plot(points, plots, footer), "Predicted vs observed acceptance of the round scheduler")
