"""`design`'s report: report.md and a self-contained report.html, derived from the stage folders' raw results.

The document is a list of blocks rendered twice (Markdown and HTML), so both always say the same thing.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ... import metrics
from ...errors import DraftwiseError
from ...report import machine as machine_section
from ...report.doc import Doc
from ...report.fmt import interval as _interval
from ...report.fmt import num as _f
from .. import fastest, rows, study
from ..build import read_candidates
from ..measure import SCHEDULED as SCHEDULED_NAME
from ..measure import limit_of
from ..pipeline import CANDIDATES, DesignFolder
from ..verdict import sentence
from . import answer, budget, charts, learning, lookup, models, per_row, schedule
from .costs import accuracy_section, time_section
from .models import LEFT_OUT, decision_text, read_json, stage_records

DEFINITIONS = (
    "Definitions: TAR = tokens emitted per SD round (accepted + the recovered or bonus token; AR = 1); "
    "α = accepted / drafted; agreement = teacher-forced top-1 match rate with the target's greedy continuation; "
    "tokens/s counts new tokens over wall time including prefill unless it says decode."
)


def _tar_by_suite(records: list[dict], method: str = "sd") -> dict[str, float]:
    by: dict[str, list] = {}
    for r in records:
        if r["method"] == method:
            by.setdefault(r["suite"], []).extend(r["rounds"])
    return {s: metrics.tar(rs) for s, rs in sorted(by.items()) if rs}


def write(p: DesignFolder) -> Path:
    """report.md and report.html (and their plots) of a design run folder, from the folder alone."""
    cands, specs = read_candidates(p)
    out, c = p.path, p.config
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    traffic = f" --prompts {shlex.quote(c.prompts)}" if c.prompts else ""
    command = f"draftwise design --target {c.target}{traffic} --minutes {c.minutes:g} --out {shlex.quote(str(out))}"
    footer = f"{command}; {out}"
    prof = read_json(p.folder("profile") / "profile.json")
    chosen, gamma = p.done["select-drafter"]["chosen"], p.done["select-gamma"]["chosen"]
    points = lookup.select_points(p)
    doc = Doc()
    doc.h(f"draftwise design: {c.target}", 1)
    _verdict(doc, p, plots, footer)
    per_row.section(doc, p, plots, footer)
    _machine(doc, p)
    doc.p(f"Reproduce: `{command}`. Every stage's raw records are in `stages/`. {DEFINITIONS}")
    budget.section(doc, p, plots, footer)
    _headline(doc, p, chosen, gamma, specs)
    tasks = lookup.tasks_section(doc, p, plots, footer)
    _chosen_section(doc, p, tasks, points, chosen, plots, footer)
    acc_points, kv = models.section(doc, p, cands, specs, prof, (chosen, gamma), plots, footer)
    models.batch_dividend(doc, p, cands)
    learning.section(doc, p, plots, footer)
    time_section(doc, p, prof, kv, plots, footer)
    accuracy_section(doc, p, acc_points, plots, footer)
    if "select-vocab" in p.done:
        _head_and_lookahead(doc, p)

    _export_section(doc, p)
    (out / "report.md").write_text(doc.markdown(out))
    (out / "report.html").write_text(doc.html(f"draftwise design: {c.target}"))
    return out / "report.md"


def _machine(doc: Doc, p: DesignFolder) -> None:
    """The machine (machine.json) and every runtime's plain decoding in the last grid against its bandwidth limit."""
    path = p.path / "machine.json"
    m = read_json(path) if path.exists() else None
    lean = fastest.lean_name(p.config)
    recs = stage_records(p.folder(fastest.STAGE)) if fastest.STAGE in p.done else []
    plain = machine_section.plain_speeds(
        [r for r in recs if r["method"] in rows.PLAIN], lambda r: f"{r.get('runtime') or lean}/{r['method']}"
    )
    machine_section.section(doc, m, plain, fastest.describe)
    if (p.path / study.FILE).exists():
        decision = read_json(p.path / study.FILE)
        doc.p(f"The study ran at {decision['dtype']} (`--dtype auto`): {decision['reason']}.")


def _chosen_section(
    doc: Doc, p: DesignFolder, tasks: dict, points: dict, chosen: str, plots: Path, footer: str
) -> None:
    """The chosen drafter's TAR per task and its speed at each temperature, then the round scheduler's section."""
    method = p.done["verdict"].get("method", "sd")
    tar = {0.0: {s: v["tar"] for s, v in tasks.get(chosen, {}).items()}}
    sd0, ar0 = points[chosen]["methods"]["sd"], points[chosen]["methods"]["ar"]
    speed_rows = [
        [
            "0",
            p.done["bench-select"]["gammas"][chosen],
            _f(sd0["tokens_per_s"]),
            _f(ar0["tokens_per_s"]),
            _f(sd0["tokens_per_s"] / ar0["tokens_per_s"], ".2f", "x"),
            _f(sd0.get("tar")),
            _f(sd0.get("alpha"), ".3f"),
        ]
    ]
    if "bench-temps" in p.done:
        temps = stage_records(p.folder("bench-temps"))
        for r in read_json(p.folder("bench-temps") / "grid.json")["points"]:
            t = r["temperature"]
            tar[t] = _tar_by_suite([x for x in temps if x["temperature"] == t], method)
            sd, ar = r["methods"][method], r["methods"]["ar"]
            speed_rows.append(
                [
                    f"{t:g}",
                    r["gamma"],
                    _f(sd["tokens_per_s"]),
                    _f(ar["tokens_per_s"]),
                    _f(sd["tokens_per_s"] / ar["tokens_per_s"], ".2f", "x"),
                    _f(sd.get("tar")),
                    _f(sd.get("alpha"), ".3f"),
                ]
            )
    doc.h("The chosen drafter per task and temperature")
    suites = sorted({s for per in tar.values() for s in per})
    doc.table(["task"] + [f"TAR at T={t:g}" for t in tar], [[s] + [_f(tar[t].get(s)) for t in tar] for s in suites])
    doc.table(["T", "γ", "SD tokens/s", "AR tokens/s", "SD / AR", "TAR", "α"], speed_rows)
    schedule.section(doc, p, plots, footer)
    refine = limit_of(p, "bench-temps") if "bench-temps" in p.done else None
    doc.p(
        f"T=0: the selection grid ({limit_of(p, 'bench-select')} prompts); T>0: {_f(refine, 'd')} prompts, sampled SD "
        "(lossless: each emitted token follows the target's distribution), the same seeds for SD and AR."
    )
    doc.img(charts.tar_per_task(tar, plots, footer), "TAR per task and temperature")


def render(out: str | Path) -> Path:
    """Re-render a finished design folder's report (nothing is rerun)."""
    folder = Path(out)
    if not (folder / CANDIDATES).exists() or not (folder / "config.json").exists():
        raise DraftwiseError(
            f"{folder} is not a finished design run folder (no {CANDIDATES}): run or resume "
            f"`draftwise design ... --out {folder}` first"
        )
    return write(DesignFolder(folder))


def _export_section(doc: Doc, p: DesignFolder) -> None:
    """Where the export is and what it holds."""
    out = p.path
    doc.h("Export")
    v = p.done["verdict"]
    where = out / "export" if v["recommend"] else next((out / "export").glob("not-recommended-*"))
    doc.p(
        (
            "`export/` holds the recommendation: "
            if v["recommend"]
            else f"SD is not recommended here, so `export/README.md` says so and `export/{where.name}/` keeps, "
            "for reference only, "
        )
        + "how to run the chosen drafter elsewhere (transformers, vLLM, draftwise; every path relative to "
        "its folder)" + (", with the drafter's checkpoint in `drafter/`." if (where / "drafter").exists() else ".")
    )
    vllm = where / "vllm_speculative_config.json"
    if vllm.exists():
        doc.code(vllm.read_text().strip())
    else:  # a feature head: nothing but the draftwise engine loads it (docs/feature.md)
        doc.p("No vLLM config: a feature-level head runs on the draftwise engine only (docs/feature.md).")


def _headline(doc: Doc, p: DesignFolder, chosen: str, gamma: int, specs: dict[str, str]) -> None:
    """The chosen drafter on the spec_bench eval mix against draftwise AR and transformers' own methods."""
    doc.h("Headline (spec_bench eval mix, T=0)")
    if "bench-headline" not in p.done:
        doc.p(LEFT_OUT)
        return
    headline = read_json(p.folder("bench-headline") / "summary.json")["methods"]
    ar, hf = headline["ar"]["tokens_per_s"], headline.get("hf-generate", {}).get("tokens_per_s")
    decision, g = p.done["select-drafter"], p.done["select-gamma"]
    doc.p(f"Chosen drafter: {chosen} ({specs[chosen]}), γ = {gamma}. {decision_text(decision)} γ: {decision_text(g)}")
    rows = []
    for name, label in (
        ("sd", f"SD, {chosen.removesuffix(SCHEDULED_NAME)}, γ={gamma}"),
        ("sd-scheduled", f"SD with the round scheduler, {chosen}, γ={gamma}"),
        ("ar", "AR, draftwise engine"),
        ("hf-generate", "AR, transformers generate()"),
        ("hf-assisted", f"transformers assisted, {chosen}"),
        ("hf-prompt-lookup", f"transformers prompt lookup, γ={gamma}"),
    ):
        s = headline.get(name)
        if s:
            rows.append(
                [
                    label,
                    _f(s["tokens_per_s"]),
                    _f(s["tokens_per_s"] / ar, ".2f", "x"),
                    _f(s["tokens_per_s"] / hf if hf else None, ".2f", "x"),
                    _f(s.get("tar")),
                    _f(s["identical_to_ar"] * 100 if s.get("identical_to_ar") is not None else None, ".0f", "%"),
                ]
            )
    doc.table(["method", "tokens/s", "vs draftwise AR", "vs transformers AR", "TAR", "same tokens as AR"], rows)


def _head_and_lookahead(doc: Doc, p: DesignFolder) -> None:
    """Reduced draft heads of the chosen drafter (one grid beside AR) and adaptive lookahead."""
    doc.h("Reduced-vocabulary draft head and adaptive lookahead")
    d = p.done["select-vocab"]
    points = {r["drafter"]: r for r in read_json(p.folder("bench-vocab") / "grid.json")["points"]}
    rows = []
    for size, spec in sorted(p.done["bench-vocab"]["drafters"].items(), key=lambda kv: -int(kv[0]) or float("-inf")):
        r = points[spec]
        rows.append(
            [
                "full" if size == "0" else size,
                _f(r["draft_step_ms"]),
                _f(r["tar"]),
                _f(r["tokens_per_s"]),
                _interval(d["speedup"].get(int(size), d["speedup"].get(size))),
            ]
        )
    doc.table(["draft vocabulary", "draft step ms", "TAR", "SD tokens/s", "SD / AR [95 %]"], rows)
    doc.p(
        f"Chosen draft vocabulary: {'full' if d['chosen'] == 0 else d['chosen']}. {decision_text(d)} The target "
        "verifies over its full vocabulary, so output is unchanged."
    )
    if "bench-adaptive" in p.done:
        a = read_json(p.folder("bench-adaptive") / "summary.json")
        cfg = read_json(p.folder("bench-adaptive") / "config.json")
        sd = a["methods"]["sd"]
        rounds = [
            rd for rec in stage_records(p.folder("bench-adaptive")) if rec["method"] == "sd" for rd in rec["rounds"]
        ]
        drafted = sum(rd["drafted"] for rd in rounds) / max(1, len(rounds))
        doc.table(
            ["lookahead", "TAR", "drafted per round", "SD tokens/s", "SD / AR"],
            [
                [
                    f"adaptive: γ ≤ {cfg['gamma']}, stop when q(token) < τ = {cfg['draft_stop']:g}",
                    _f(sd.get("tar")),
                    _f(drafted),
                    _f(sd["tokens_per_s"]),
                    _f(sd["speedup_vs_ar"], ".2f", "x"),
                ]
            ],
        )
        doc.p(
            "τ = c (the drafter's step over the target's, measured): one more draft step costs c target steps and "
            "pays off in expectation only when the drafter's own probability of its token exceeds that."
        )


def _verdict(doc: Doc, p: DesignFolder, plots: Path, footer: str) -> None:
    """The decision first: what to run on this machine against the fastest plain decoding here, then the lean
    runtime's own verdict and every candidate's costs and break-even."""
    v, f = p.done["verdict"], p.done.get("fastest")
    doc.h("Verdict")
    if f:
        answer.section(doc, p, f, plots, footer)
        doc.h(f"The draftwise lean engine at {p.config.dtype}", 3)
    method = v.get("method", "sd") if v["recommend"] else "ar"
    doc.p(sentence(v) + fastest.versus(f, fastest.lean_name(p.config), method))
    table = [_candidate_row(name, x) for name, x in v["candidates"].items()]
    doc.table(
        [
            "candidate",
            "kind",
            "γ",
            "SD / AR [95 %]",
            "TAR",
            "α",
            "c (draft cost, AR steps)",
            "rounds proposing",
            "mean proposal",
            "TAR needed at its c",
            "α needed at its c (i.i.d.)",
            "c affordable at its TAR",
        ],
        table,
    )
    doc.p(
        "Break-even from the cost model (batch 1, AR-step units, the profile's verify pass per γ): a round must emit "
        "as many tokens as the AR steps it costs (draft + verify). TAR needed: at the candidate's measured draft cost "
        "and proposal lengths; α needed: the same as an i.i.d. per-token acceptance (acceptances that come in runs, as "
        "a lookup's long matches do, earn more than i.i.d. α suggests); c affordable: the draft cost per token (model) "
        "or per drafting round (lookup, hybrid) at which its measured TAR only breaks even ('none': its verify passes "
        "alone cost more than it emits). The rule: " + v["rule"] + "."
    )


def _candidate_row(name: str, x: dict) -> list:
    """A candidate of the lean verdict: its measured speedup, TAR, α, draft cost and break-even figures."""
    lookup = x["kind"] != "model"
    return [
        name,
        x["kind"],
        x["gamma"],
        _interval(x["speedup"]),
        _f(x["tar"]),
        _f(x["alpha"], ".2f"),
        _f(x["c"], ".4f" if lookup else ".3f") + (" per round" if lookup else " per token"),
        _f(100 * x["proposed_fraction"], ".0f", " %") if lookup and x["proposed_fraction"] is not None else "-",
        _f(x["mean_proposal"], ".1f"),
        _f(x.get("tar_needed")),
        _f(x["alpha_needed"], ".2f") if x["alpha_needed"] is not None else "none",
        _f(x["c_affordable"], ".3f") if x["c_affordable"] is not None else "none",
    ]
