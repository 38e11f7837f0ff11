"""The `design` report's sections on the selection grid: TAR and speedup per task for every candidate, and the lookup
drafters (their tuned settings, predicted beside measured, and what a larger suffix corpus gained)."""

from __future__ import annotations

import json
from pathlib import Path

from ... import metrics
from ...report.doc import Doc
from ...report.fmt import num as _f
from ...rundir import read_records
from ...stages.bench_grid import as_method
from ..measure import limit_of, method_of
from ..pipeline import DesignFolder
from . import charts


def select_points(p: DesignFolder) -> dict[str, dict]:
    """{candidate name: its point summary in the selection grid (T = 0)}; a scheduled option's is its static option's
    point seen through the scheduled method (its figures where the point's static SD figures are)."""
    specs = p.done["bench-select"]["drafters"]
    points = json.loads((p.folder("bench-select") / "grid.json").read_text())["points"]
    by_spec = {r["drafter"]: r for r in points}
    return {name: as_method(by_spec[spec], method_of(p, name)) for name, spec in specs.items() if spec in by_spec}


def tasks_section(doc: Doc, p: DesignFolder, plots: Path, footer: str) -> dict[str, dict[str, dict]]:
    """TAR and speedup per task of every benchmarked candidate; returns {name: per_task}."""
    c, specs = p.config, p.done["bench-select"]["drafters"]
    records = [r for r in read_records(p.folder("bench-select") / "records.jsonl") if r["temperature"] == 0]
    ar = [r for r in records if r["method"] == "ar"]
    tasks = {
        name: metrics.per_suite([r for r in records if r["method"] == method_of(p, name) and r["drafter"] == spec], ar)
        for name, spec in specs.items()
    }
    suites = sorted({s for t in tasks.values() for s in t})
    doc.h("TAR and speedup per task (T=0)")
    doc.p(
        f"Every benchmarked candidate beside AR on the same {limit_of(p, 'bench-select')} eval prompts "
        f"({c.bench_suites}), interleaved prompt by prompt, {c.max_new_tokens} new tokens at most, prefill included; "
        "per task: the candidate's tokens/s over AR's on that task's prompts, and its TAR. Cells: TAR / speedup."
    )
    doc.table(
        ["task"] + list(tasks),
        [
            [s]
            + [
                f"{_f(t[s]['tar'])} / {_f(t[s]['speedup_vs_ar'], '.2f', 'x')}" if s in t else "-"
                for t in tasks.values()
            ]
            for s in suites
        ],
    )
    doc.img(
        charts.speedup_per_task(
            {n: {s: v["speedup_vs_ar"] for s, v in t.items()} for n, t in tasks.items()}, plots, footer
        ),
        "Speedup over draftwise AR per task and candidate (T=0)",
    )
    return tasks


def lookup_section(doc: Doc, p: DesignFolder) -> list[dict]:
    """The lookup candidates: tuning (predicted from replayed rounds) beside their measured selection-grid points, and
    the suffix corpus; returns predicted-vs-measured rows for the plot."""
    if "tune-lookup" not in p.done:
        return []
    tune = json.loads((p.folder("tune-lookup") / "tune.json").read_text())["rows"]
    points, chosen = select_points(p), p.done["tune-lookup"]
    doc.h("Lookup drafters")
    doc.p(
        "No weights: n-gram (prompt lookup over the request) and suffix (the request's n-grams plus a suffix index "
        "over the target's own continuations of train prompts) propose a run of up to γ tokens where their index "
        "matches, q one-hot on each proposed token (the acceptance rule stays exact). Settings were chosen before any "
        "benchmark: each was replayed exactly over the target's greedy text of "
        f"{limit_of(p, 'agree-lookup')} eval prompts (greedy SD emits exactly that text) and priced with the "
        "profile's verify times. Best settings per method (predicted), then measured in the selection grid:"
    )
    rows, pred_rows = [], []
    for method in dict.fromkeys(r["method"] for r in tune):  # each family tuned, in the order it was tuned
        ranked = sorted((r for r in tune if r["method"] == method), key=lambda r: -r["predicted_tokens_per_s"])[:3]
        for r in ranked:
            picked = chosen.get(method, {}).get("spec") == r["spec"] and chosen[method]["gamma"] == r["gamma"]
            m = points.get(method) if picked else None
            rows.append(_tuned_row(method, r, picked, m))
            if m and m["methods"]["sd"].get("decode_tokens_per_s"):
                pred_rows.append(
                    {
                        "drafter": method,
                        "gamma": r["gamma"],
                        "predicted": r["predicted_tokens_per_s"],
                        "measured": m["methods"]["sd"]["decode_tokens_per_s"],
                    }
                )
    doc.table(
        [
            "method",
            "settings",
            "γ",
            "TAR (replay)",
            "α",
            "rounds proposing",
            "predicted SD / AR",
            "benchmarked",
            "measured SD / AR",
            "measured TAR",
            "measured rounds proposing",
            "proposal ms",
        ],
        rows,
    )
    doc.p(
        "Predicted SD / AR excludes prefill (decode only); measured includes it. A round without a proposal is a plain "
        "AR step. Proposal ms: median time of one round's whole proposal in the engine."
    )
    _corpus_section(doc, p)
    return pred_rows


def _tuned_row(method: str, r: dict, picked: bool, m: dict | None) -> list:
    """One tuned setting: its replayed figures and, when it was picked, what the selection grid measured (`m`)."""
    return [
        method,
        r["spec"].split(":", 1)[0] + short(r["spec"]),
        r["gamma"],
        _f(r["tar"]),
        _f(r["alpha"], ".2f"),
        _f(100 * (r["proposed_fraction"] or 0), ".0f", " %"),
        _f(r["predicted_speedup"], ".2f", "x"),
        "yes" if picked else "",
        _f(m and m["speedup_vs_ar"], ".2f", "x"),
        _f(m and m["tar"]),
        _f(m and 100 * (m["methods"]["sd"].get("proposed_fraction") or 0), ".0f", " %"),
        _f(m and m["methods"]["sd"].get("propose_ms"), ".3f"),
    ]


def short(spec: str) -> str:
    """A spec's settings without the corpus path."""
    body = spec.split(":", 1)[1] if ":" in spec else ""
    if spec.startswith("suffix"):
        return " " + ",".join(x for x in body.split(",") if "=" in x)
    if spec.startswith("hybrid"):
        model, _, lookup = body.rpartition("+")
        return f" {Path(model).name} + {lookup.split(':', 1)[0]}{short(lookup)}"
    return " " + body


def _corpus_section(doc: Doc, p: DesignFolder) -> None:
    gain, index = p.done.get("corpus-gain"), p.done.get("suffix-index")
    if not gain or not index:
        return
    doc.h("The suffix corpus: how much the target's own outputs are worth", 3)
    curve = ", ".join(
        f"{t:,} tokens → {v:.1f} tokens/s" for t, v in zip(gain["corpus_tokens"], gain["predicted_tokens_per_s"])
    )
    verdict = (
        "so gen-data was extended once with as many new train prompts (gen-data-more)"
        if gain["more"]
        else "below the threshold, so gen-data was not extended"
    )
    doc.p(
        f"Predicted suffix-drafter tokens/s (γ=4, default settings) with a quarter, half and all of gen-data's "
        f"continuations as its corpus: {curve}. The last doubling gained {100 * gain['gain_last_doubling']:+.1f} % "
        f"(threshold {100 * gain['threshold']:.1f} %), {verdict}; gen-data took {gain['gen_data_seconds']:.0f} s. "
        f"Final index: {index['sequences']} sequences, {index['tokens']:,} tokens, "
        f"built in {index['build_seconds']:.2f} s."
    )
