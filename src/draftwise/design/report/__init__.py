"""`design`'s report: report.md and a self-contained report.html, derived from the stage folders' raw results.

The document is a list of blocks rendered twice (Markdown and HTML), so both always say the same thing.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ... import cost, metrics
from . import budget, charts, lookup, per_row, schedule
from ..measure import SCHEDULED as SCHEDULED_NAME
from ..measure import limit_of
from ...report.doc import Doc
from ...report.fmt import interval as _interval
from ...report.fmt import num as _f
from ...report.plots import plot_profile, plot_sweep

DEFINITIONS = ("Definitions: TAR = tokens emitted per SD round (accepted + the recovered or bonus token; AR = 1); "
               "α = accepted / drafted; agreement = teacher-forced top-1 match rate with the target's greedy continuation; "
               "tokens/s counts new tokens over wall time including prefill unless it says decode.")

KV_CONTEXT = 1024


def _json(path: Path) -> dict:
    return json.loads(path.read_text())


def _records(folder: Path) -> list[dict]:
    path = folder / "records.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _tar_by_suite(records: list[dict], method: str = "sd") -> dict[str, float]:
    by: dict[str, list] = {}
    for r in records:
        if r["method"] == method:
            by.setdefault(r["suite"], []).extend(r["rounds"])
    return {s: metrics.tar(rs) for s, rs in sorted(by.items()) if rs}


def write(p, cands, specs: dict[str, str]) -> Path:
    from .. import predicted

    out, c = p.dir.path, p.config
    plots = out / "plots"
    plots.mkdir(exist_ok=True)
    command = f"draftwise design --target {c.target} --minutes {c.minutes:g} --out {shlex.quote(str(out))}"
    footer = f"{command}; {out}"
    prof = _json(p.folder("profile") / "profile.json")
    b1 = prof["batches"]["1"]
    chosen, gamma = p.done["select-drafter"]["chosen"], p.done["select-gamma"]["chosen"]
    method = p.done["verdict"].get("method", "sd")
    points = lookup.select_points(p)
    doc = Doc()
    doc.h(f"draftwise design: {c.target}", 1)
    _verdict(doc, p)
    per_row.section(doc, p, plots, footer)
    doc.p(f"Reproduce: `{command}`. Every stage's raw records are in `stages/`. {DEFINITIONS}")
    budget.section(doc, p, plots, footer)
    _headline(doc, p, chosen, gamma, specs)
    tasks = lookup.tasks_section(doc, p, plots, footer)

    # --- the chosen drafter per task and temperature ---
    tar = {0.0: {s: v["tar"] for s, v in tasks.get(chosen, {}).items()}}
    sd0, ar0 = points[chosen]["methods"]["sd"], points[chosen]["methods"]["ar"]
    speed_rows = [["0", p.done["bench-select"]["gammas"][chosen], _f(sd0["tokens_per_s"]), _f(ar0["tokens_per_s"]),
                   _f(sd0["tokens_per_s"] / ar0["tokens_per_s"], ".2f", "x"), _f(sd0.get("tar")), _f(sd0.get("alpha"), ".3f")]]
    if "bench-temps" in p.done:
        temps = _records(p.folder("bench-temps"))
        for r in _json(p.folder("bench-temps") / "grid.json")["points"]:
            t = r["temperature"]
            tar[t] = _tar_by_suite([x for x in temps if x["temperature"] == t], method)
            sd, ar = r["methods"][method], r["methods"]["ar"]
            speed_rows.append([f"{t:g}", r["gamma"], _f(sd["tokens_per_s"]), _f(ar["tokens_per_s"]),
                               _f(sd["tokens_per_s"] / ar["tokens_per_s"], ".2f", "x"), _f(sd.get("tar")),
                               _f(sd.get("alpha"), ".3f")])
    doc.h("The chosen drafter per task and temperature")
    suites = sorted({s for per in tar.values() for s in per})
    doc.table(["task"] + [f"TAR at T={t:g}" for t in tar], [[s] + [_f(tar[t].get(s)) for t in tar] for s in suites])
    doc.table(["T", "γ", "SD tokens/s", "AR tokens/s", "SD / AR", "TAR", "α"], speed_rows)
    schedule.section(doc, p, plots, footer)
    refine = limit_of(p, "bench-temps") if "bench-temps" in p.done else None
    doc.p(f"T=0: the selection grid ({limit_of(p, 'bench-select')} prompts); T>0: {_f(refine, 'd')} prompts, sampled SD (lossless: each "
          "emitted token follows the target's distribution), the same seeds for SD and AR.")
    doc.img(charts.tar_per_task(tar, plots, footer), "TAR per task and temperature")

    # --- model candidates ---
    acc = _accuracy(_records(p.folder("accuracy")))
    doc.h("Model drafters")
    rows, bars, pred_rows, acc_points, kv = [], [], [], [], {}
    target_shape = cost.Shape(**prof["target"]["shape"]) if "shape" in prof["target"] else None
    if target_shape:
        kv["target"] = target_shape.kv_bytes(KV_CONTEXT) / 1e6
    for name, r in points.items():
        bars.append({"drafter": name, "gamma": r["gamma"], "tokens_per_s": r["tokens_per_s"],
                     "chosen": name == chosen and r["gamma"] == gamma})
    if "bench-gamma" in p.done:
        bars += [{"drafter": chosen, "gamma": r["gamma"], "tokens_per_s": r["tokens_per_s"], "chosen": r["gamma"] == gamma,
                  "refine": True} for r in _json(p.folder("bench-gamma") / "grid.json")["points"]]
    for cand in (x for x in cands if x.role not in ("lookup", "hybrid")):
        spec, d = specs[cand.name], b1["drafters"][specs[cand.name]]
        shape = cost.Shape(**d["shape"])
        kv[cand.name] = shape.kv_bytes(KV_CONTEXT) / 1e6
        agree_summary = _json(p.folder(f"agree-{cand.name}") / "agree.json")
        pred = predicted(p, spec, cand.name)
        g_pred = max(pred, key=pred.get) if pred else None
        at = points.get(cand.name)
        if at and at["gamma"] in pred and at["methods"]["sd"].get("decode_tokens_per_s"):
            pred_rows.append({"drafter": cand.name, "gamma": at["gamma"], "predicted": pred[at["gamma"]],
                              "measured": at["methods"]["sd"]["decode_tokens_per_s"]})
        before = after = None
        if cand.trained:
            evals = [r for r in _records(p.folder(f"distill-{cand.name}")) if r.get("event") == "eval"]
            before, after = evals[0]["agreement"], evals[-1]["agreement"]
        tar4 = agree_summary["predicted_greedy_tar"].get("4")
        acc_points.append({"drafter": cand.name, "tar": tar4, "mmlu": acc.get((cand.name, "mmlu")),
                           "hellaswag": acc.get((cand.name, "hellaswag"))})
        rows.append([cand.name, cand.role, shape.describe(), _f(d["params"]["non_embedding"] / 1e6, ".2f", "M"),
                     _f(kv[cand.name], ".1f"), _f(d["step_ms"]), _f(d["step_ms"] / b1["ar_step_ms"], ".2f"),
                     f"{_f(before, '.3f')} → {_f(after, '.3f')}" if cand.trained else "untrained",
                     _f(agree_summary["agreement"], ".3f"), _f(tar4), f"{g_pred} ({_f(pred.get(g_pred), '.1f')})",
                     _interval(p.done["select-drafter"]["speedup"].get(cand.name)) if at else "not benchmarked "
                     "(predicted below the best model drafter)", _f(at and at["tar"]), _f(acc.get((cand.name, "mmlu")), ".2f"),
                     _f(acc.get((cand.name, "hellaswag")), ".2f")])
    doc.table(["drafter", "role", "shape", "non-emb params", f"KV MB/seq @{KV_CONTEXT}", "step ms", "c", "distill agreement",
               "agreement (eval)", "greedy TAR γ=4", "γ* predicted (tok/s)", "measured SD / AR [95 %]", "measured TAR", "MMLU",
               "HellaSwag"], rows)
    doc.p(f"Target: AR step {b1['ar_step_ms']:.2f} ms; MMLU {_f(acc.get(('target', 'mmlu')), '.2f')}, HellaSwag "
          f"{_f(acc.get(('target', 'hellaswag')), '.2f')}. c = drafter step / target step. Agreement and greedy TAR from "
          "`agree` (teacher-forced on the target's greedy eval continuations); measured figures from the selection grid.")
    pred_rows += lookup.lookup_section(doc, p)
    ar_mix = next(iter(points.values()))["methods"]["ar"]["tokens_per_s"]  # same prompts as the bars
    doc.img(charts.tokens_per_s(bars, ar_mix, plots, footer),
            "SD tokens/s per drafter and γ (T=0, prefill included) with AR on the selection grid's prompts")
    if pred_rows:
        doc.img(charts.predicted_vs_measured(pred_rows, plots, footer), "Predicted vs measured decode tokens/s")
    _shapes(doc, p, cands, specs, b1)
    doc.h("Wide-shallow vs deep-narrow at equal non-embedding parameters")
    sweep_path = p.folder("sweep") / "sweep.json"
    fit = _json(sweep_path).get("fits", {}).get("1") if sweep_path.exists() else None
    for line in _wide_vs_deep(p, cands, specs, b1, fit):
        doc.p(line)

    _batch_dividend(doc, p, cands)

    # --- cost model ---
    doc.h("Where the time goes (profile and sweep)")
    fit = b1.get("depth_fit") or {}
    doc.p(f"Step time ≈ {_f(fit.get('fixed_ms'))} + {_f(fit.get('per_layer_ms'))} ms per full-width layer; LM head alone "
          f"{_f(b1.get('head_ms'))} ms. Verify pass over γ+1 tokens relative to one AR step: "
          + ", ".join(f"γ={g}: {v:.2f}" for g, v in b1["verify_over_ar_step"].items()) + ".")
    for path in plot_profile(prof, plots):
        doc.img(path, {"verify_vs_gamma.png": "Verify pass vs γ", "step_vs_layers.png": "Step time vs layers"}[path.name])
    if sweep_path.exists():
        sw = _json(sweep_path)
        for line in sw.get("findings", []):
            doc.p(line)
        for path in plot_sweep(sw, plots):
            doc.img(path, path.stem.replace("_", " "))
    doc.img(charts.kv_footprint(kv, KV_CONTEXT, plots, footer), f"KV cache per sequence at {KV_CONTEXT} positions")

    # --- accuracy sanity check ---
    doc.h("Accuracy sanity check: task accuracy vs TAR")
    if "accuracy" not in p.done:
        doc.p("Not measured: the time budget left it out (see *Time budget*).")
    path, corr = charts.accuracy_vs_tar(acc_points, plots, footer)
    doc.p("Pearson correlation of drafter accuracy with greedy TAR(γ=4): "
          + ", ".join(f"{t}: {_f(r)}" for t, r in corr.items()) + f" (over {len(acc_points)} drafters). "
          "Accuracy is a sanity check only; drafters are chosen by measured agreement and throughput.")
    doc.img(path, "Task accuracy vs TAR")

    if "select-vocab" in p.done:
        _head_and_lookahead(doc, p)

    doc.h("Export")
    v = p.done["verdict"]
    where = out / "export" if v["recommend"] else next((out / "export").glob("not-recommended-*"))
    doc.p(("`export/` holds the recommendation: " if v["recommend"] else
           f"SD is not recommended here, so `export/README.md` says so and `export/{where.name}/` keeps, for reference "
           "only, ") + "how to run the chosen drafter elsewhere (transformers, vLLM, draftwise; every path relative to "
          "its folder)" + (", with the model drafter's transformers checkpoint." if (where / "drafter").exists() else "."))
    doc.code((where / "vllm_speculative_config.json").read_text().strip())
    (out / "report.md").write_text(doc.markdown(out))
    (out / "report.html").write_text(doc.html(f"draftwise design: {c.target}"))
    return out / "report.md"


def _headline(doc: Doc, p, chosen: str, gamma: int, specs: dict[str, str]) -> None:
    """The chosen drafter on the spec_bench eval mix against draftwise AR and transformers' own methods."""
    if "bench-headline" not in p.done:
        return  # left out by the time budget (its section says so)
    headline = _json(p.folder("bench-headline") / "summary.json")["methods"]
    ar, hf = headline["ar"]["tokens_per_s"], headline.get("hf-generate", {}).get("tokens_per_s")
    decision, g = p.done["select-drafter"], p.done["select-gamma"]
    doc.h("Headline (spec_bench eval mix, T=0)")
    doc.p(f"Chosen drafter: {chosen} ({specs[chosen]}), γ = {gamma}. {_decision_text(decision)} γ: {_decision_text(g)}")
    rows = []
    for name, label in (("sd", f"SD, {chosen.removesuffix(SCHEDULED_NAME)}, γ={gamma}"),
                        ("sd-scheduled", f"SD with the round scheduler, {chosen}, γ={gamma}"), ("ar", "AR, draftwise engine"),
                        ("hf-generate", "AR, transformers generate()"), ("hf-assisted", f"transformers assisted, {chosen}"),
                        ("hf-prompt-lookup", f"transformers prompt lookup, γ={gamma}")):
        s = headline.get(name)
        if s:
            rows.append([label, _f(s["tokens_per_s"]), _f(s["tokens_per_s"] / ar, ".2f", "x"),
                         _f(s["tokens_per_s"] / hf if hf else None, ".2f", "x"), _f(s.get("tar")),
                         _f(s["identical_to_ar"] * 100 if s.get("identical_to_ar") is not None else None, ".0f", "%")])
    doc.table(["method", "tokens/s", "vs draftwise AR", "vs transformers AR", "TAR", "same tokens as AR"], rows)


def _head_and_lookahead(doc: Doc, p) -> None:
    """Reduced draft heads of the chosen drafter (one grid beside AR) and adaptive lookahead."""
    doc.h("Reduced-vocabulary draft head and adaptive lookahead")
    d = p.done["select-vocab"]
    points = {r["drafter"]: r for r in _json(p.folder("bench-vocab") / "grid.json")["points"]}
    rows = []
    for size, spec in sorted(p.done["bench-vocab"]["drafters"].items(), key=lambda kv: -int(kv[0]) or float("-inf")):
        r = points[spec]
        rows.append(["full" if size == "0" else size, _f(r["draft_step_ms"]), _f(r["tar"]), _f(r["tokens_per_s"]),
                     _interval(d["speedup"].get(int(size), d["speedup"].get(size)))])
    doc.table(["draft vocabulary", "draft step ms", "TAR", "SD tokens/s", "SD / AR [95 %]"], rows)
    doc.p(f"Chosen draft vocabulary: {'full' if d['chosen'] == 0 else d['chosen']}. {_decision_text(d)} The target "
          "verifies over its full vocabulary, so output is unchanged.")
    if "bench-adaptive" in p.done:
        a = _json(p.folder("bench-adaptive") / "summary.json")
        cfg = _json(p.folder("bench-adaptive") / "config.json")
        sd = a["methods"]["sd"]
        rounds = [rd for rec in _records(p.folder("bench-adaptive")) if rec["method"] == "sd" for rd in rec["rounds"]]
        drafted = sum(rd["drafted"] for rd in rounds) / max(1, len(rounds))
        doc.table(["lookahead", "TAR", "drafted per round", "SD tokens/s", "SD / AR"],
                  [[f"adaptive: γ ≤ {cfg['gamma']}, stop when q(token) < τ = {cfg['draft_stop']:g}", _f(sd.get("tar")),
                    _f(drafted), _f(sd["tokens_per_s"]), _f(sd["speedup_vs_ar"], ".2f", "x")]])
        doc.p("τ = c (the drafter's step over the target's, measured): one more draft step costs c target steps and "
              "pays off in expectation only when the drafter's own probability of its token exceeds that.")


def _batch_dividend(doc: Doc, p, cands) -> None:
    """Each trained candidate at the largest batch its SD footprint allows in `memory`, SD beside AR at that batch."""
    c, rows, capped = p.config, [], []
    for cand in (x for x in cands if f"max-batch-{x.name}" in p.done):
        d = p.done[f"max-batch-{cand.name}"]
        stage = f"bench-{cand.name}-batch"
        s = _json(p.folder(stage) / "summary.json")["methods"] if stage in p.done else {}
        sd, ar = s.get("sd", {}), s.get("ar", {})
        if d["capped"]:
            capped.append(cand.name)
        rows.append([cand.name, cand.role, _f(d["kv_bytes_per_seq_drafter"] / 1e6, ".2f"),
                     _f(d["kv_bytes_per_seq_target"] / 1e6, ".2f"), d["max_batch"] or "does not fit",
                     d["batch"] or "-", p.done[stage]["gamma"] if stage in p.done else "-",
                     _f(sd.get("decode_tokens_per_s")), _f(ar.get("decode_tokens_per_s")),
                     _f(_ratio(sd.get("decode_tokens_per_s"), ar.get("decode_tokens_per_s")), ".2f", "x"),
                     _f(sd.get("tokens_per_s")), _f(ar.get("tokens_per_s"))])
    if not rows:
        return
    doc.h("Batch dividend")
    doc.table(["candidate", "role", "drafter KV MB/seq", "target KV MB/seq",
               f"largest batch in {c.memory} at context {c.context}", "benchmarked batch", "γ", "SD decode tokens/s",
               "AR decode tokens/s", "SD / AR (decode)", "SD tokens/s with prefill", "AR tokens/s with prefill"], rows)
    doc.p(f"Largest batch = (memory − target weights − drafter weights) // (target + drafter KV of {c.context} positions "
          f"per sequence), at {c.dtype}. Tokens/s is the total across the batch: new tokens of all its sequences over the "
          "wall time of the batched generation without (decode) and with its prefill, which pads every prompt to the "
          "batch's longest (a batch runs until its last sequence finishes); SD "
          f"and AR decode the same spec_bench eval prompts (T=0, at least two full batches, {c.max_new_tokens} new "
          f"tokens at most, prompts at their own length: {c.context} positions only sizes the footprint). γ is the γ* "
          "predicted at that batch from the profile at that batch and the candidate's greedy TAR: the verify pass grows "
          "with the batch, so γ* shrinks."
          + (f" Capped at batch_cap = {c.batch_cap} (the largest batch benchmarked on this machine): "
             + ", ".join(capped) + "." if capped else ""))


def _ratio(a, b):
    return a / b if a and b else None


def _cost_model_split(dw: dict, dn: dict, fit: dict) -> str:
    """The sweep's fitted step model, split into per-layer overhead and weight bytes, for a wide/deep pair."""
    parts = []
    for d in (dw, dn):
        shape = cost.Shape(**d["shape"])
        mb = shape.layers * shape.layer_params() * fit.get("bytes_per_value", 4) / 1e6
        parts.append((shape.layers * fit["layer_overhead_ms"], mb * fit["ms_per_layer_mb"], mb))
    (ow, bw, mw), (on, bn, mn) = parts
    return (f" Cost model (sweep fit, batch 1): layer overhead {ow:.2f} vs {on:.2f} ms, layer weight bytes {mw:.1f} vs "
            f"{mn:.1f} MB → {bw:.2f} vs {bn:.2f} ms; the LM head is the same for both.")


def _accuracy(records: list[dict]) -> dict[tuple[str, str], float]:
    by: dict[tuple[str, str], list[int]] = {}
    for r in records:
        by.setdefault((r["model"], r["task"]), []).append(r["correct"])
    return {k: sum(v) / len(v) for k, v in by.items()}


def _wide_vs_deep(p, cands, specs, b1, fit: dict | None) -> list[str]:
    """Each wide/deep pair, decided by the selection's own rule (paired intervals, then the cheaper step): when the
    chosen drafter is one of the pair, the section names it, so the report tells one story."""
    from .. import decide

    decision, lines = p.done["select-drafter"], []
    pairs = zip([x for x in cands if x.role == "wide-shallow"], [x for x in cands if x.role == "deep-narrow"])
    for w, n in pairs:
        if w.name not in decision["speedup"] or n.name not in decision["speedup"]:
            continue
        dw, dn = b1["drafters"][specs[w.name]], b1["drafters"][specs[n.name]]
        if decision["chosen"] in (w.name, n.name):
            winner, how = decision["chosen"], "the selection chose it: " + _decision_text(decision)
        else:
            pair = decide.choose(_pair(p, decision, w.name, n.name), lambda x: tuple(decision["cost"][x]))
            winner, how = pair["chosen"], pair["why"] + f" (the lead's 95 % interval {_lead(pair)})"
        loser = n.name if winner == w.name else w.name
        lines.append(
            f"{winner} over {loser} at equal non-embedding parameters ({dw['params']['non_embedding'] / 1e6:.1f}M vs "
            f"{dn['params']['non_embedding'] / 1e6:.1f}M): measured {_interval(decision['speedup'][w.name])} vs "
            f"{_interval(decision['speedup'][n.name])} over AR; {how}. Draft step {dw['step_ms']:.2f} ms ({w.name}, "
            f"{dw['layers']} layers) vs {dn['step_ms']:.2f} ms ({n.name}, {dn['layers']} layers): a layer costs a fixed "
            "overhead beside its weight bytes, and a narrower model reads fewer bytes, its LM head included."
            + (_cost_model_split(dw, dn, fit) if fit else ""))
    return lines or ["(no benchmarked wide/deep pair among the candidates)"]


def _shapes(doc: Doc, p, cands, specs, b1) -> None:
    """The shapes the cost model ranked before training, beside what the trained ones measured."""
    if "choose-shapes" not in p.done:
        return
    d, decision = p.done["choose-shapes"], p.done["select-drafter"]
    trained = {cost.Shape(**x.shape.__dict__): x for x in cands if x.trained}
    rows = []
    for rank, s in enumerate(d["ranking"], 1):
        shape = cost.Shape(**{k: v for k, v in s.items() if k != "predicted_ms"})
        cand = trained.get(shape)
        step = b1["drafters"][specs[cand.name]]["step_ms"] if cand else None
        rows.append([rank, shape.describe(), _f(s["predicted_ms"]), cand.name if cand else "", _f(step),
                     _interval(decision["speedup"].get(cand.name)) if cand else ""])
    doc.h("Shapes chosen by the cost model")
    measured = sorted((x for x in trained.values()), key=lambda x: b1["drafters"][specs[x.name]]["step_ms"])
    order = " < ".join(f"{x.name} {b1['drafters'][specs[x.name]]['step_ms']:.2f} ms" for x in measured)
    pairs = sorted((ms, trained[cost.Shape(**s)].name) for ms, s in zip(d["predicted_ms"], d["shapes"])
                   if cost.Shape(**s) in trained)
    held = [n for _, n in pairs] == [x.name for x in measured]
    control = "and its equal-parameter control" if len(pairs) > 1 else \
        "only (the time budget left out its equal-parameter control)"
    doc.p(f"Before any training, the sweep's fitted step model (batch 1, {d['head']:,}-token head) ranked every shape of "
          f"{d['budget'] / 1e6:.2f}M non-embedding parameters; the design trained the predicted-fastest {control} "
          "(predicted " + ", ".join(f"{n} {ms:.2f} ms" for ms, n in pairs) + "). Measured draft "
          f"steps (profile): {order} — the predicted order {'held' if held else 'did not hold'}.")
    doc.table(["predicted rank", "shape", "predicted step ms", "trained as", "measured step ms", "measured SD / AR [95 %]"],
              rows)


def _pair(p, decision, a: str, b: str) -> dict:
    """The paired comparison of two candidates on the selection grid's records (as the selection measured them)."""
    from .. import decide, measure

    stages = ["bench-select"] + ["bench-select-repeat" + (f"-{i}" if i else "") for i in range(decision.get("passes", 1) - 1)]
    specs = p.done["bench-select"]["drafters"]
    name_of = {specs[a]: a, specs[b]: b}
    by = decide.timings([r for r in measure.records(p, stages) if r["drafter"] in name_of or r["method"] == "ar"],
                        lambda r: name_of.get(r["drafter"]))
    ar = by.pop(None)
    return decide.compare(by, ar, p.config.seed)


def _lead(d: dict) -> str:
    return ", ".join(f"{d['leader']} over {n}: {100 * lo:+.1f} % to {100 * hi:+.1f} %" for n, (lo, hi) in d["lead"].items())


def _decision_text(d: dict) -> str:
    """A paired decision in words: the options' speedups with intervals, the leader's lead, the rule that chose."""
    figures = ", ".join(f"{n}: {_interval(s)}" for n, s in d["speedup"].items())
    return (f"Measured speedup over AR [95 % interval, paired bootstrap over {d['prompts']} prompts, {d.get('passes', 1)} "
            f"pass(es)]: {figures}. Lead of {d['leader']}: {_lead(d)}. Chosen {d['chosen']}: {d['why']}.")


def _verdict(doc: Doc, p) -> None:
    """The decision first: what to run on this machine against the fastest plain decoding here, then the lean
    engine's own verdict and every candidate's costs and break-even."""
    from .. import fastest, rows
    from ..verdict import sentence

    v, f = p.done["verdict"], p.done.get("fastest")
    doc.h("Verdict")
    if f:
        quality = rows.quality_of(p)
        reference = {fastest.lean_name(p.config): "the reference"} if p.config.dtype == "fp32" else {}
        cost = quality.get(f["runtime"])
        doc.p(fastest.sentence(f, fastest.row_verdicts(p)) + (f" Its quality against fp32 (a lossy runtime): {cost}."
                                                              if cost else ""))
        doc.table(["option (one interleaved grid, the selection prompts)", "tokens/s", "over the fastest plain [95 %]",
                   "quality vs fp32"],
                  [[fastest.describe(n) + (" (plain)" if o["plain"] else ""), _f(o["tokens_per_s"], ".1f"),
                    _interval(o["speedup"]), quality.get(n.split("/")[0], reference.get(n.split("/")[0], "-"))]
                   for n, o in sorted(f["options"].items(), key=lambda kv: -kv[1]["tokens_per_s"])])
        doc.p("The rule: " + f["rule"] + ". Each engine's own verdict, below and under *Per engine*, compares a method "
              "with that engine's AR. " + per_row.quality_note(p))
        doc.h(f"The draftwise lean engine at {p.config.dtype}", 3)
    method = v.get("method", "sd") if v["recommend"] else "ar"
    doc.p(sentence(v) + fastest.versus(f, fastest.lean_name(p.config), method))
    rows = []
    for name, x in v["candidates"].items():
        lookup = x["kind"] != "model"
        rows.append([name, x["kind"], x["gamma"], _interval(x["speedup"]), _f(x["tar"]), _f(x["alpha"], ".2f"),
                     _f(x["c"], ".4f" if lookup else ".3f") + (" per round" if lookup else " per token"),
                     _f(100 * x["proposed_fraction"], ".0f", " %") if lookup and x["proposed_fraction"] is not None else "-",
                     _f(x["mean_proposal"], ".1f"), _f(x.get("tar_needed")),
                     _f(x["alpha_needed"], ".2f") if x["alpha_needed"] is not None else "none",
                     _f(x["c_affordable"], ".3f") if x["c_affordable"] is not None else "none"])
    doc.table(["candidate", "kind", "γ", "SD / AR [95 %]", "TAR", "α", "c (draft cost, AR steps)", "rounds proposing",
               "mean proposal", "TAR needed at its c", "α needed at its c (i.i.d.)", "c affordable at its TAR"], rows)
    doc.p("Break-even from the cost model (batch 1, AR-step units, the profile's verify pass per γ): a round must emit "
          "as many tokens as the AR steps it costs (draft + verify). TAR needed: at the candidate's measured draft cost "
          "and proposal lengths; α needed: the same as an i.i.d. per-token acceptance (acceptances that come in runs, as "
          "a lookup's long matches do, earn more than i.i.d. α suggests); c affordable: the draft cost per token (model) "
          "or per drafting round (lookup, hybrid) at which its measured TAR only breaks even ('none': its verify passes "
          "alone cost more than it emits). The rule: " + v["rule"] + ".")
