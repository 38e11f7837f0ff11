"""The design report's sections on model drafters: each candidate's costs, agreement and measured speedup, the shapes
the cost model chose, wide-shallow against deep-narrow at equal parameters, and the batch dividend."""

from __future__ import annotations

import json
from pathlib import Path

from ...report.doc import Doc
from ...report.fmt import interval as _interval
from ...report.fmt import num as _f
from ...rundir import read_records
from ...shapes import Shape
from .. import decide, measure
from ..estimate import predicted
from ..pipeline import DesignFolder
from ..verdict import training_records
from . import charts, lookup

KV_CONTEXT = 1024
LEFT_OUT = "Not measured: the time budget left it out (see *Time budget*)."  # a left-out section says only this


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def stage_records(folder: Path) -> list[dict]:
    """A stage folder's raw records (none when it has no records.jsonl)."""
    return read_records(folder / "records.jsonl")


def section(
    doc: Doc, p, cands, specs: dict[str, str], prof: dict, choice: tuple[str, int], plots: Path, footer: str
) -> tuple[list[dict], dict[str, float]]:
    """The model drafters' table and charts; returns the accuracy points and KV megabytes per sequence it gathered."""
    chosen, gamma = choice
    b1, points = prof["batches"]["1"], lookup.select_points(p)
    acc = accuracy_by_model(stage_records(p.folder("accuracy")))
    doc.h("Model drafters")
    rows, pred_rows, acc_points, kv = [], [], [], {}
    if "shape" in prof["target"]:
        kv["target"] = Shape(**prof["target"]["shape"]).kv_bytes(KV_CONTEXT) / 1e6
    for cand in (x for x in cands if x.role not in ("lookup", "hybrid")):
        row, kv[cand.name], pred, acc_point = _model_row(p, cand, specs[cand.name], b1, points, acc)
        rows.append(row)
        pred_rows += pred
        acc_points.append(acc_point)
    doc.table(
        [
            "drafter",
            "role",
            "shape",
            "non-emb params",
            f"KV MB/seq @{KV_CONTEXT}",
            "step ms",
            "c",
            "distill agreement",
            "agreement (eval)",
            "greedy TAR γ=4",
            "γ* predicted (tok/s)",
            "measured SD / AR [95 %]",
            "measured TAR",
            "MMLU",
            "HellaSwag",
        ],
        rows,
    )
    doc.p(
        f"Target: AR step {b1['ar_step_ms']:.2f} ms; MMLU {_f(acc.get(('target', 'mmlu')), '.2f')}, HellaSwag "
        f"{_f(acc.get(('target', 'hellaswag')), '.2f')}. c = drafter step / target step. Agreement and greedy TAR from "
        "`agree` (teacher-forced on the target's greedy eval continuations); measured figures from the selection grid."
    )
    pred_rows += lookup.lookup_section(doc, p)
    ar_mix = next(iter(points.values()))["methods"]["ar"]["tokens_per_s"]  # same prompts as the bars
    doc.img(
        charts.tokens_per_s(_bars(p, points, chosen, gamma), ar_mix, plots, footer),
        "SD tokens/s per drafter and γ (T=0, prefill included) with AR on the selection grid's prompts",
    )
    if pred_rows:
        doc.img(charts.predicted_vs_measured(pred_rows, plots, footer), "Predicted vs measured decode tokens/s")
    _shapes(doc, p, cands, specs, b1)
    doc.h("Wide-shallow vs deep-narrow at equal non-embedding parameters")
    sweep_path = p.folder("sweep") / "sweep.json"
    fit = read_json(sweep_path).get("fits", {}).get("1") if sweep_path.exists() else None
    for line in _wide_vs_deep(p, cands, specs, b1, fit):
        doc.p(line)
    return acc_points, kv


def _bars(p: DesignFolder, points: dict[str, dict], chosen: str, gamma: int) -> list[dict]:
    """Tokens/s of every option of the selection grid, and of the chosen drafter at each γ of its refinement."""
    bars = [
        {
            "drafter": name,
            "gamma": r["gamma"],
            "tokens_per_s": r["tokens_per_s"],
            "chosen": name == chosen and r["gamma"] == gamma,
        }
        for name, r in points.items()
    ]
    if "bench-gamma" in p.done:
        bars += [
            {
                "drafter": chosen,
                "gamma": r["gamma"],
                "tokens_per_s": r["tokens_per_s"],
                "chosen": r["gamma"] == gamma,
                "refine": True,
            }
            for r in read_json(p.folder("bench-gamma") / "grid.json")["points"]
        ]
    return bars


def _model_row(
    p: DesignFolder, cand, spec: str, b1: dict, points: dict, acc: dict
) -> tuple[list, float, list[dict], dict]:
    """One model candidate's table row, KV MB per sequence, predicted-vs-measured point and accuracy point."""
    d = b1["drafters"][spec]
    shape = Shape(**d["shape"]) if d.get("shape") else None  # None: a feature head (no decoder stack, no cache)
    kv = shape.kv_bytes(KV_CONTEXT) / 1e6 if shape else 0.0
    agree_summary = read_json(p.folder(f"agree-{cand.name}") / "agree.json")
    pred = predicted(p, spec, cand.name)
    g_pred = max(pred, key=pred.get) if pred else None
    at = points.get(cand.name)
    pred_rows = []
    if at and at["gamma"] in pred and at["methods"]["sd"].get("decode_tokens_per_s"):
        pred_rows.append(
            {
                "drafter": cand.name,
                "gamma": at["gamma"],
                "predicted": pred[at["gamma"]],
                "measured": at["methods"]["sd"]["decode_tokens_per_s"],
            }
        )
    before = after = None
    evals = [r for r in training_records(p, cand.name) if r.get("event") == "eval"]
    trained = bool(evals)  # pruned + distilled, or a feature head
    if trained:
        before, after = evals[0]["agreement"], evals[-1]["agreement"]
    tar4 = agree_summary["predicted_greedy_tar"].get("4")
    mmlu, hellaswag = acc.get((cand.name, "mmlu")), acc.get((cand.name, "hellaswag"))
    row = [
        cand.name,
        cand.role,
        shape.describe() if shape else "head on the target's features",
        _f(d["params"]["non_embedding"] / 1e6, ".2f", "M") if d.get("params") else "-",
        _f(kv, ".1f"),
        _f(d["step_ms"]),
        _f(d["step_ms"] / b1["ar_step_ms"], ".2f"),
        f"{_f(before, '.3f')} → {_f(after, '.3f')}" if trained else "untrained",
        _f(agree_summary["agreement"], ".3f"),
        _f(tar4),
        f"{g_pred} ({_f(pred.get(g_pred), '.1f')})",
        _interval(p.done["select-drafter"]["speedup"].get(cand.name))
        if at
        else "not benchmarked (predicted below the best model drafter)",
        _f(at and at["tar"]),
        _f(mmlu, ".2f"),
        _f(hellaswag, ".2f"),
    ]
    return row, kv, pred_rows, {"drafter": cand.name, "tar": tar4, "mmlu": mmlu, "hellaswag": hellaswag}


def batch_dividend(doc: Doc, p: DesignFolder, cands) -> None:
    """Each trained candidate at the largest batch its SD footprint allows in `memory`, SD beside AR at that batch."""
    c = p.config
    measured = [x for x in cands if f"max-batch-{x.name}" in p.done]
    rows = [_batch_row(p, x) for x in measured]
    capped = [x.name for x in measured if p.done[f"max-batch-{x.name}"]["capped"]]
    if not rows:
        if any(x.trained for x in cands):  # trained candidates, no batch decision: the budget left it out
            doc.h("Batch dividend")
            doc.p(LEFT_OUT)
        return
    doc.h("Batch dividend")
    doc.table(
        [
            "candidate",
            "role",
            "weights held MB, target + drafter",
            "drafter KV MB/seq",
            "target KV MB/seq",
            f"largest batch in {budget(c, p.done[f'max-batch-{measured[0].name}']['memory'])} at context {c.context}",
            "benchmarked batch",
            "γ",
            "SD decode tokens/s",
            "AR decode tokens/s",
            "SD / AR (decode)",
            "SD tokens/s with prefill",
            "AR tokens/s with prefill",
        ],
        rows,
    )
    doc.p(
        f"Largest batch = (memory − target weights − drafter weights) // (target + drafter KV of {c.context} "
        f"positions per sequence), at {c.dtype}: the weights as the loaded models hold them (measured, the embedding "
        "table included), the KV at its precision. Tokens/s is the total across the batch: new tokens of all its "
        "sequences over the wall time of the batched generation without (decode) and with its prefill, which pads "
        "every prompt to the batch's longest (a batch runs until its last sequence finishes); SD "
        f"and AR decode the same spec_bench eval prompts (T=0, at least two full batches, {c.max_new_tokens} new "
        f"tokens at most, prompts at their own length: {c.context} positions only sizes the footprint). γ is the γ* "
        "predicted at that batch from the profile at that batch and the candidate's greedy TAR: the verify pass grows "
        "with the batch, so γ* shrinks."
        + (
            f" Capped at batch_cap = {c.batch_cap} (the largest batch benchmarked on this machine): "
            + ", ".join(capped)
            + "."
            if capped
            else ""
        )
    )


def budget(config, memory: int) -> str:
    """`--memory` as the report names it: auto as the bytes it stood for here."""
    return f"{memory / 2**30:.1f} GiB (this machine's memory)" if config.memory == "auto" else config.memory


def _batch_row(p: DesignFolder, cand) -> list:
    """A trained candidate's batch decision and, when it ran, SD and AR at that batch."""
    d = p.done[f"max-batch-{cand.name}"]
    stage = f"bench-{cand.name}-batch"
    s = read_json(p.folder(stage) / "summary.json")["methods"] if stage in p.done else {}
    sd, ar = s.get("sd", {}), s.get("ar", {})
    return [
        cand.name,
        cand.role,
        f"{d['weight_bytes_target'] / 1e6:.0f} + {d['weight_bytes_drafter'] / 1e6:.0f}",
        _f(d["kv_bytes_per_seq_drafter"] / 1e6, ".2f"),
        _f(d["kv_bytes_per_seq_target"] / 1e6, ".2f"),
        d["max_batch"] or "does not fit",
        d["batch"] or "-",
        p.done[stage]["gamma"] if stage in p.done else "-",
        _f(sd.get("decode_tokens_per_s")),
        _f(ar.get("decode_tokens_per_s")),
        _f(_ratio(sd.get("decode_tokens_per_s"), ar.get("decode_tokens_per_s")), ".2f", "x"),
        _f(sd.get("tokens_per_s")),
        _f(ar.get("tokens_per_s")),
    ]


def _ratio(a, b):
    return a / b if a and b else None


def _cost_model_split(dw: dict, dn: dict, fit: dict) -> str:
    """The sweep's fitted step model, split into per-layer overhead and weight bytes, for a wide/deep pair."""
    parts = []
    for d in (dw, dn):
        shape = Shape(**d["shape"])
        mb = shape.layers * shape.layer_params() * fit.get("bytes_per_value", 4) / 1e6
        parts.append((shape.layers * fit["layer_overhead_ms"], mb * fit["ms_per_layer_mb"], mb))
    (ow, bw, mw), (on, bn, mn) = parts
    return (
        f" Cost model (sweep fit, batch 1): layer overhead {ow:.2f} vs {on:.2f} ms, layer weight bytes {mw:.1f} vs "
        f"{mn:.1f} MB → {bw:.2f} vs {bn:.2f} ms; the LM head is the same for both."
    )


def accuracy_by_model(records: list[dict]) -> dict[tuple[str, str], float]:
    by: dict[tuple[str, str], list[int]] = {}
    for r in records:
        by.setdefault((r["model"], r["task"]), []).append(r["correct"])
    return {k: sum(v) / len(v) for k, v in by.items()}


def _wide_vs_deep(p: DesignFolder, cands, specs, b1, fit: dict | None) -> list[str]:
    """Each wide/deep pair, decided by the selection's own rule (paired intervals, then the cheaper step): when the
    chosen drafter is one of the pair, the section names it, so the report tells one story."""
    decision, lines = p.done["select-drafter"], []
    pairs = zip([x for x in cands if x.role == "wide-shallow"], [x for x in cands if x.role == "deep-narrow"])
    for w, n in pairs:
        if w.name not in decision["speedup"] or n.name not in decision["speedup"]:
            continue
        dw, dn = b1["drafters"][specs[w.name]], b1["drafters"][specs[n.name]]
        if decision["chosen"] in (w.name, n.name):
            winner, how = decision["chosen"], "the selection chose it: " + decision_text(decision)
        else:
            pair = decide.choose(_pair(p, decision, w.name, n.name), lambda x: tuple(decision["cost"][x]))
            winner, how = pair["chosen"], pair["why"] + f" (the lead's 95 % interval {_lead(pair)})"
        loser = n.name if winner == w.name else w.name
        lines.append(
            f"{winner} over {loser} at equal non-embedding parameters ({dw['params']['non_embedding'] / 1e6:.1f}M vs "
            f"{dn['params']['non_embedding'] / 1e6:.1f}M): measured {_interval(decision['speedup'][w.name])} vs "
            f"{_interval(decision['speedup'][n.name])} over AR; {how}. Draft step {dw['step_ms']:.2f} ms ({w.name}, "
            f"{dw['layers']} layers) vs {dn['step_ms']:.2f} ms ({n.name}, {dn['layers']} layers): a layer costs a "
            "fixed overhead beside its weight bytes, and a narrower model reads fewer bytes, its LM head included."
            + (_cost_model_split(dw, dn, fit) if fit else "")
        )
    return lines or ["(no benchmarked wide/deep pair among the candidates)"]


def _shapes(doc: Doc, p: DesignFolder, cands, specs, b1) -> None:
    """The shapes the cost model ranked before training, beside what the trained ones measured."""
    if "choose-shapes" not in p.done:
        return
    d, decision = p.done["choose-shapes"], p.done["select-drafter"]
    trained = {Shape(**x.shape.__dict__): x for x in cands if x.trained}
    rows = []
    for rank, s in enumerate(d["ranking"], 1):
        shape = Shape(**{k: v for k, v in s.items() if k != "predicted_ms"})
        cand = trained.get(shape)
        step = b1["drafters"][specs[cand.name]]["step_ms"] if cand else None
        rows.append(
            [
                rank,
                shape.describe(),
                _f(s["predicted_ms"]),
                cand.name if cand else "",
                _f(step),
                _interval(decision["speedup"].get(cand.name)) if cand else "",
            ]
        )
    doc.h("Shapes chosen by the cost model")
    measured = sorted((x for x in trained.values()), key=lambda x: b1["drafters"][specs[x.name]]["step_ms"])
    order = " < ".join(f"{x.name} {b1['drafters'][specs[x.name]]['step_ms']:.2f} ms" for x in measured)
    pairs = sorted(
        (ms, trained[Shape(**s)].name) for ms, s in zip(d["predicted_ms"], d["shapes"]) if Shape(**s) in trained
    )
    held = [n for _, n in pairs] == [x.name for x in measured]
    control = (
        "and its equal-parameter control"
        if len(pairs) > 1
        else "only (the time budget left out its equal-parameter control)"
    )
    doc.p(
        f"Before any training, the sweep's fitted step model (batch 1, {d['head']:,}-token head) ranked every shape of "
        f"{d['budget'] / 1e6:.2f}M non-embedding parameters; the design trained the predicted-fastest {control} "
        "(predicted " + ", ".join(f"{n} {ms:.2f} ms" for ms, n in pairs) + "). Measured draft "
        f"steps (profile): {order} — the predicted order {'held' if held else 'did not hold'}."
    )
    doc.table(
        ["predicted rank", "shape", "predicted step ms", "trained as", "measured step ms", "measured SD / AR [95 %]"],
        rows,
    )


def _pair(p: DesignFolder, decision, a: str, b: str) -> dict:
    """The paired comparison of two candidates on the selection grid's records (as the selection measured them)."""
    stages = ["bench-select"] + [
        "bench-select-repeat" + (f"-{i}" if i else "") for i in range(decision.get("passes", 1) - 1)
    ]
    specs = p.done["bench-select"]["drafters"]
    name_of = {specs[a]: a, specs[b]: b}
    by = decide.timings(
        [r for r in measure.records(p, stages) if r["drafter"] in name_of or r["method"] == "ar"],
        lambda r: name_of.get(r["drafter"]),
    )
    ar = by.pop(None)
    return decide.compare(by, ar, p.config.seed)


def _lead(d: dict) -> str:
    return ", ".join(
        f"{d['leader']} over {n}: {100 * lo:+.1f} % to {100 * hi:+.1f} %" for n, (lo, hi) in d["lead"].items()
    )


def decision_text(d: dict) -> str:
    """A paired decision in words: the options' speedups with intervals, the leader's lead, the rule that chose."""
    figures = ", ".join(f"{n}: {_interval(s)}" for n, s in d["speedup"].items())
    return (
        f"Measured speedup over AR [95 % interval, paired bootstrap over {d['prompts']} prompts, {d.get('passes', 1)} "
        f"pass(es)]: {figures}. Lead of {d['leader']}: {_lead(d)}. Chosen {d['chosen']}: {d['why']}."
    )
