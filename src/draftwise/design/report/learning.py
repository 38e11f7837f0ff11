"""The design report's "When would training pay?": for each trained candidate, the learning-curve outlook its verdict
entry recorded (`verdict.outlook`) in one sentence, and its held-out agreement against teacher tokens with the fitted
curve extended to the tokens its predictions need, its break-even α and the α that would beat the best lookup."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ... import learning
from ...report.doc import Doc
from ...report.plots import plot_learning_fits
from ...rundir import read_records
from ...stages.teacher import throughput
from ..pipeline import DesignFolder
from ..verdict import training_records

NOTE = (
    "Teacher-forced top-1 agreement on held-out text is the greedy per-token acceptance α, so the curve of agreement "
    "against teacher tokens predicts α after more training. Fitted: a(t) = a_inf − b·(t + t0)^(−c), a power law "
    "saturating at a plateau a_inf that the drafter's shape sets (fewer than 3 evaluations, or no rise: no "
    "prediction). Break-even α: the cost model's, at the candidate's measured draft cost and proposal lengths (the "
    "verdict table); the α to beat a lookup: where the same cost model predicts the lookup's measured speedup. Minutes "
    "at the training rate measured here (the train steps' own time, evaluations left out)."
)


def section(doc: Doc, p: DesignFolder, plots: Path, footer: str) -> None:
    """One sentence per trained candidate and one plot; nothing when no candidate was trained (or the verdict was
    recorded before learning curves were)."""
    entries = {n: x["learning"] for n, x in p.done["verdict"]["candidates"].items() if x.get("learning")}
    if not entries:
        return
    doc.h("When would training pay?")
    for n, x in entries.items():
        doc.p(x["sentence"] + stop_sentence(training_records(p, n)))
    for text in (focus_sentence(p.done.get("focus-cuts")), rates_sentence(p, list(entries))):
        if text:
            doc.p(text)
    doc.p(NOTE)
    series = [series_of(n, x, training_records(p, n)) for n, x in entries.items()]
    doc.img(
        plot_learning_fits(series, plots / "learning_fits.png", footer),
        "Held-out agreement vs teacher tokens, fitted curves extended to the predictions, break-even α (dotted) and "
        "the α that would beat the best lookup (dash-dot)",
    )


def rates_sentence(p: DesignFolder, names: list[str]) -> str:
    """What the training data and the training cost here: the teacher's tokens/s (tokens the target scored, at its
    precision) and each candidate's trained tokens/s (its train steps' own time)."""
    parts = []
    teacher_records = read_records(p.folder("teacher") / "records.jsonl")
    for source, t in throughput(teacher_records).items():
        if t["tokens_per_s"]:
            parts.append(f"the teacher scored {source} at {t['tokens_per_s']:.0f} tokens/s")
    prec = next((r["precision"] for r in teacher_records if "precision" in r), None)
    if parts and prec:
        parts[-1] += f" ({prec})"
    for n in names:
        train = [r for r in training_records(p, n) if r.get("event") == "train"]
        seconds = sum(r["seconds"] for r in train)
        if seconds:
            parts.append(f"{n} trained at {train[-1]['tokens'] / seconds:.0f} tokens/s")
    return f"Rates on this machine: {'; '.join(parts)}." if parts else ""


def focus_sentence(decision: dict | None) -> str:
    """Which cut the pilots' learning curves ranked first and were trained on (`cut_stages.focus`)."""
    if not decision:
        return ""
    if decision.get("prerank"):
        return prerank_sentence(decision)
    ranked = "; ".join(
        f"{x['name']} {x['agreement_now']:.2f} now → {x['predicted_agreement']:.2f} predicted at "
        f"{learning.tokens_text(x['tokens_at_end'])} tokens ({x['predicted_speedup']:.2f}× at c {x['c']:.2f})"
        for x in decision["ranking"]
    )
    then = (
        f"{decision['chosen']} was trained on from its pilot for {decision['minutes']:g} more minutes"
        if decision["chosen"]
        else f"none was predicted to pay with {decision['minutes']:g} more minutes, so none was trained on"
    )
    return (
        f"The cuts trained a pilot each, then were ranked by what their learning curves predict if one alone trained "
        f"on (the cost model's speedup at that agreement, a verify pass at one AR step): {ranked}. {then}."
    )


def prerank_sentence(decision: dict) -> str:
    """Which cut its agreement before training ranked first, where the budget trained one (`cuts`, `prerank`)."""
    ranked = "; ".join(
        f"{x['name']} {x['agreement_now']:.2f} ({x['predicted_speedup']:.2f}× at c {x['c']:.2f})"
        for x in decision["ranking"]
    )
    return (
        f"The minutes fitted one cut's training, so both cuts were pruned and ranked by held-out agreement before "
        f"any training, priced by the cost model: {ranked}. {decision['chosen']} was trained for all "
        f"{decision['minutes']:g} minutes; the other was not trained."
    )


def stop_sentence(records: list[dict]) -> str:
    """The stop rule's verdict, when it stopped the candidate's training after the pilot (`distill.stopped`)."""
    stop = next((r for r in records if r.get("event") == "stopped"), None)
    if stop is None:
        return ""
    return (
        f" Its training was stopped after the pilot ({learning.tokens_text(stop['tokens'])} teacher tokens): the "
        f"curve predicted an agreement of {stop['predicted']:.3f} by the budget's end "
        f"({learning.tokens_text(stop['tokens_at_end'])} tokens), below the {stop['needed']:.3f} its break-even "
        "needs at the draft cost predicted for its shape (a verify pass of one AR step: optimistic)."
    )


def series_of(name: str, entry: dict, records: list[dict]) -> dict:
    """What the plot draws for one candidate: its measured points and its fitted curve from 0 to the furthest
    predicted token count (at least 3× the tokens trained, to show its bend; at most `learning.HORIZON`× them; none
    for an invalid curve)."""
    curve = learning.Curve.from_dict(entry["curve"])
    pts = learning.points(records)
    predicted = [x["tokens"] for x in entry["predictions"] if x["tokens"] is not None]
    until = min(max([3 * curve.tokens_seen, *predicted]), learning.HORIZON * curve.tokens_seen)
    first = min((t for t, _ in pts if t > 0), default=None)
    fit = None
    if curve.valid and first is not None:
        ts = np.concatenate([[0.0], np.geomspace(first / 10, until, 120)])
        fit = list(zip(ts.tolist(), np.asarray(curve.predict(ts)).tolist()))
    return {
        "name": name,
        "points": pts,
        "fit": fit,
        "alpha_needed": entry.get("alpha_needed"),
        "alpha_to_beat": entry.get("alpha_to_beat"),
    }
