"""A row's verdict: the stages that measure the candidates on one row (`rows.Row`, written E), the verdict record they
give, and that verdict in one sentence. Costs — the verify curve above all — belong to (engine, precision, machine), so
a γ, a drafter or a verdict chosen on one engine does not transfer to another:

  profile@E        E's verify curve, and each model candidate's step (drafters written as GGUF at E's precision)
  tune-lookup@E    the lookup settings replayed over the target's text, priced with E's verify times
  bench-select@E   one interleaved grid on E at T = 0: the tuned lookups, the hybrid, and the model candidates the cost
                   model cannot rule out on E, at their γ for E; draftwise AR on E; on a llama.cpp row also
                   llama-cpp-python's generate and llama-server on the same token ids: plain, --spec-default, each
                   --spec-type with its defaults, and the nearest built-in of each draftwise candidate with its settings
                   (`rows.nearest_builtin`)
  verdict@E        the fastest draftwise method beyond noise (paired bootstrap over prompts, a tie to the cheaper), to
                   deploy when its interval over E's AR lies above 1, else plain decoding; beside it the best
                   llama-server built-in with its interval, and how often greedy SD reproduced AR's tokens on E (a
                   quantized multi-token pass of llama.cpp may round differently from a one-token step; lean-int8's
                   cannot)

After its verdict a row measures what its kind asks for (`Row.follow_up`).
"""

from __future__ import annotations

import shlex
from pathlib import Path

from .. import metrics
from ..config import BenchGridConfig
from ..sd.families import drafter_kind
from ..stages import profile
from ..stages.bench import SCHEDULED
from ..stages.bench_grid import as_method, label
from . import decide, lookup, measure, requests, rows
from .estimate import SCREEN, best_gamma
from .target import target_of
from .verdict import candidate, predicted, verify_steps

RULE = (
    "deploy when the chosen method's speedup over AR on this engine is above 1 beyond noise (95 % "
    "interval, paired bootstrap over prompts); otherwise plain decoding"
)


def candidates(p, e: rows.Row, target, models: dict[str, str], lookups: bool) -> dict[str, tuple]:
    """{name: (spec, γ)} the row's selection grid runs: the lookups tuned with its verify times and the hybrid, and
    the model candidates its cost model cannot rule out (≥ SCREEN of the best prediction)."""
    prof = f"profile@{e.name}"
    best = {n: best_gamma(p, s, n, profile=prof) for n, s in models.items()}
    cands: dict[str, tuple[str, int]] = {}
    tuned: dict[str, dict] = {}
    if lookups:
        top = max(models, key=lambda n: best[n][1]) if models else None
        tuned = lookup.tune(
            p, target, (top, models[top], best[top][0]) if top else None, profile=prof, stage=f"tune-lookup@{e.name}"
        )
        cands.update({m: (spec, tuned[m]["gamma"]) for m, _, spec in lookup.tuned_candidates(tuned)})
    lead = max([tuned[m]["predicted_tokens_per_s"] for m in cands] + [b for _, b in best.values()], default=0.0)
    cands.update({n: (models[n], best[n][0]) for n in models if best[n][1] >= SCREEN * lead})
    return cands


def run_row(p, e: rows.Row, target, models: dict[str, str], lookups: bool) -> dict:
    """One row's stages (module docstring); returns its verdict record. `models`: the model candidates benchmarked on
    the lean engine ({name: spec})."""
    prof = f"profile@{e.name}"
    context = requests.context(p.config, target)  # the traffic's: where its passes are timed
    p.isolated(prof, profile.run, e.profile_config(p.config, tuple(models.values()), context), e.name)
    cands = candidates(p, e, target, models, lookups)
    nearest = {n: b for n, (s, g) in cands.items() if (b := e.nearest(s, g)) is not None}
    # each tuned lookup's scheduled variant, priced by E's verify curve, from the design's calibration
    scheduled = lookup.scheduled_options(cands) if "calibrate-lookup" in p.done else {}
    first = next(iter(cands.values()))[0]
    grid = BenchGridConfig(
        bench=e.bench_config(
            p,
            drafter=first,
            gamma=1,
            baselines=("ar", *e.peers(nearest)),
            **(measure.scheduling(p, prof) if scheduled else {}),
        ),
        drafters=tuple(s for s, _ in cands.values()),
        drafter_gammas=tuple(g for _, g in cands.values()),
        scheduled=tuple(cands[m][0] for m in scheduled.values()),
    )
    measure.run_grid(
        p,
        f"bench-select@{e.name}",
        grid,
        runtime=e.name,
        drafters={n: s for n, (s, _) in cands.items()},
        gammas={n: g for n, (_, g) in cands.items()},
        scheduled=scheduled,
    )
    v = p.stage(f"verdict@{e.name}", lambda f: verdict(p, e, cands, nearest, scheduled))
    return e.follow_up(p, v)


def verdict(
    p, e: rows.Row, cands: dict[str, tuple[str, int]], nearest: dict[str, str], scheduled: dict[str, str] | None = None
) -> dict:
    """The row's verdict record (module docstring): draftwise's choice on E with its interval, the built-ins beside.
    `scheduled`: {scheduled option: its static candidate} (measured in that candidate's grid point)."""
    stage, scheduled = f"bench-select@{e.name}", scheduled or {}
    cands = {**cands, **{n: cands[m] for n, m in scheduled.items()}}
    nearest = {**nearest, **{n: nearest[m] for n, m in scheduled.items() if m in nearest}}
    recs = measure.records(p, [stage])
    points = {r["drafter"]: r for r in measure.grid_points(p, stage)}
    mine = decide.timings(recs, measure.option_key({n: s for n, (s, _) in cands.items()}, scheduled))
    peers = decide.timings(recs, _peer_key)
    ar, _ = mine.pop(None), peers.pop(None)
    decision = _decision(p, mine, ar, cands, points, scheduled)
    chosen = decision["chosen"]
    random = target_of(p.config).random_weights
    recommend = decision["speedup"][chosen][1] > 1.0 and not random  # not chosen by acceptance on random weights
    spec, method = cands[chosen][0], _method(chosen, scheduled)
    any_point = next(iter(points.values()))
    side = _builtins(p, peers, ar, any_point["methods"])
    return {
        **_row_fields(e),
        **_choice(decision, recommend, cands, points, scheduled),
        "ar_tokens_per_s": any_point["methods"]["ar"]["tokens_per_s"],
        "ar_step_ms": any_point["ar_step_ms"],
        **side,
        # what the verdict deploys (the method, or plain decoding) against the best built-in
        "verdict_over_best_builtin": _over(p, mine[chosen] if recommend else ar, peers, side["best_builtin"]),
        "llama_cpp_generate_tokens_per_s": any_point["methods"].get("llama-cpp", {}).get("tokens_per_s"),
        **_reproduced(recs, method, spec),
        "candidates": _candidate_figures(
            decision, cands, nearest, points, scheduled, verify_steps(p, f"profile@{e.name}")
        ),
        "random_weights": random,
        "rule": RULE,
    }


def _peer_key(r: dict):
    """A bench record's option among the runtime's own methods (None: draftwise AR; `IGNORE`: a draftwise method)."""
    return None if r["method"] == "ar" else r["method"] if r["method"] not in ("sd", SCHEDULED) else decide.IGNORE


def _method(name: str, scheduled: dict[str, str]) -> str:
    """The bench method a candidate ran as: the round scheduler's, or static SD."""
    return SCHEDULED if name in scheduled else "sd"


def _decision(p, mine: dict, ar: dict, cands: dict, points: dict, scheduled: dict[str, str]) -> dict:
    """Draftwise's choice on the row: the fastest candidate beyond noise, a tie to the cheaper draft step (static
    before scheduled)."""
    step = {n: round((points[s]["draft_step_ms"] or 0.0) / points[s]["ar_step_ms"], 2) for n, (s, _) in cands.items()}
    return decide.choose(decide.compare(mine, ar, p.config.seed), lambda n: (step[n], n in scheduled))


def _row_fields(e: rows.Row) -> dict:
    """The record's description of the row itself: its name, precision, target file and runtime."""
    return {
        "engine": e.name,
        "quant": e.quant,
        "shipped": e.shipped,
        "target_file": Path(e.target).name,
        "target_path": e.target,
        "drafter_quant": e.drafter_quant,
        "backend": e.backend,
        "dtype": e.dtype,
    }


def _choice(decision: dict, recommend: bool, cands: dict, points: dict, scheduled: dict[str, str]) -> dict:
    """The record's choice: whether to deploy, which candidate at which γ, its speedup and measured speed."""
    chosen = decision["chosen"]
    spec, method = cands[chosen][0], _method(chosen, scheduled)
    return {
        "recommend": recommend,
        "drafter": chosen,
        "spec": spec,
        "kind": drafter_kind(spec),
        "method": method,
        "gamma": cands[chosen][1],
        "speedup": decision["speedup"][chosen],
        "decision": decision,
        "tokens_per_s": as_method(points[spec], method)["tokens_per_s"],
    }


def _builtins(p, peers: dict, ar: dict, methods: dict) -> dict:
    """The llama-server built-ins measured beside draftwise: each one's speedup over draftwise AR and over
    llama-server's own plain decoding (on the same prompts), its speed and counts; and the fastest of them."""
    base = decide.compare(peers, ar, p.config.seed) if peers else {"speedup": {}}
    builtin = {m: s for m, s in base["speedup"].items() if m.startswith("llama-server")}
    server = peers.get("llama-server")
    over_plain = (
        decide.compare({m: peers[m] for m in builtin if m != "llama-server"}, server, p.config.seed)["speedup"]
        if server and len(builtin) > 1
        else {}
    )
    return {
        "builtins": {
            m: {
                "speedup": s,
                "over_server_plain": over_plain.get(m),
                "tokens_per_s": methods[m]["tokens_per_s"],
                **server_counts(methods[m]),
            }
            for m, s in builtin.items()
        },
        "best_builtin": max((m for m in builtin if m != "llama-server"), key=lambda m: builtin[m][0], default=None),
    }


def _over(p, pick: dict, peers: dict, best_builtin: str | None) -> list[float] | None:
    """What the verdict deploys (`pick`'s timings) over the best built-in, with its interval (None: no built-in)."""
    if not best_builtin:
        return None
    return decide.compare({"verdict": pick}, peers[best_builtin], p.config.seed)["speedup"]["verdict"]


def _reproduced(recs: list[dict], method: str, spec: str) -> dict:
    """How often the chosen method's greedy output reproduced AR's tokens on the row, and where it diverged."""
    sd_recs = [r for r in recs if r["method"] == method and r["drafter"] == spec]
    ar_recs = [r for r in recs if r["method"] == "ar"]
    return {
        "identical": metrics.identical_fraction(sd_recs, ar_recs),
        "divergence": metrics.divergence(sd_recs, ar_recs),
    }


def _candidate_figures(
    decision: dict, cands: dict, nearest: dict[str, str], points: dict, scheduled: dict[str, str], t_verify
) -> dict:
    """Each candidate's figures on the row: spec, γ, method, speedup, nearest built-in, TAR and α, and from its costs
    on the row (`t_verify`: its verify curve) its break-even α and predicted speedups (`verdict.candidate`)."""
    out = {}
    for n, (s, g) in cands.items():
        point = as_method(points[s], _method(n, scheduled))
        costs = candidate(points[s], drafter_kind(s), decision["speedup"][n], t_verify, _method(n, scheduled))
        out[n] = {
            "alpha_needed": costs["alpha_needed"],
            "predicted": costs["predicted"],
            "spec": s,
            "gamma": g,
            "method": _method(n, scheduled),
            "speedup": decision["speedup"][n],
            "nearest": nearest.get(n),
            "tar": point["tar"],
            "alpha": point["alpha"],
        }
    return out


def server_counts(summary: dict) -> dict:
    """A llama-server baseline's own drafted / accepted counts (None where it did not speculate)."""
    return {k: summary.get(k) for k in ("drafted", "accepted", "acceptance")}


def short_args(method: str) -> str:
    """A llama-server baseline's arguments for a table: a drafter GGUF by its file name, not its cache path."""
    parts = shlex.split(method.removeprefix("llama-server").removeprefix(":"))
    return shlex.join(Path(x).name if i and parts[i - 1] == "-md" else x for i, x in enumerate(parts)) or "(plain)"


def sentence(v: dict) -> str:
    """The row's verdict in one sentence (report and export); specs by their short label."""
    pt, lo, hi = v["speedup"]
    builtin = _builtin_sentence(v) if v["best_builtin"] else ""
    what = rows.runtime_label(v) + (" with the round scheduler" if v.get("method", "sd") != "sd" else "")
    if v.get("random_weights"):
        return f"On {what}: {predicted(v, lambda spec: label(spec, 60))}{builtin}"
    if v["recommend"]:
        return (
            f"On {what}: deploy {v['drafter']} ({label(v['spec'], 60)}, γ = {v['gamma']}), "
            f"{pt:.2f}× its plain decoding [{lo:.2f}–{hi:.2f}].{builtin}"
        )
    return (
        f"On {what}: use plain decoding; the best draftwise method, {v['drafter']} "
        f"({label(v['spec'], 60)}, γ = {v['gamma']}), measured {pt:.2f}× [{lo:.2f}–{hi:.2f}].{builtin}"
    )


def _builtin_sentence(v: dict) -> str:
    """The verdict's second sentence: the best llama-server built-in, and the verdict against it."""
    b = v["builtins"][v["best_builtin"]]
    vs = v["verdict_over_best_builtin"]
    plain = b.get("over_server_plain")
    return (
        f" The best llama-server built-in here, `{short_args(v['best_builtin'])}`, measured "
        f"{b['speedup'][0]:.2f}× draftwise AR [{b['speedup'][1]:.2f}–{b['speedup'][2]:.2f}]"
        + (f" and {plain[0]:.2f}× llama-server's plain decoding [{plain[1]:.2f}–{plain[2]:.2f}]" if plain else "")
        + (
            ""
            if b.get("drafted")
            else " although it drafted nothing on these prompts (plain decoding in "
            "effect: llama-server processes differ by a few % among themselves)"
        )
        + f"; {'the verdict' if v['recommend'] else 'plain decoding on draftwise'} is {vs[0]:.2f}× it "
        f"[{vs[1]:.2f}–{vs[2]:.2f}]."
    )
