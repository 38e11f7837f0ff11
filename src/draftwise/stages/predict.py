"""`draftwise predict`: tokens/s for each profiled drafter and γ, from measured step times and acceptance.

  tokens/s(drafter, γ) = E[N] / (γ·t_q + t_verify(γ))      (see `draftwise.cost`)
t_q and t_verify come from a profile run (t_verify interpolated between profiled γ); acceptance comes from a bench
run's measured per-position rates when that run used the drafter, else from `--alpha` (i.i.d.). When a bench run is
given, its measured decode tokens/s (prefill excluded, like the model) is set beside the prediction for its γ.

Lookup and hybrid drafters propose a varying number of tokens per round: their prediction is the mixture
(`cost.predict_rounds`) over the bench run's own rounds — the measured proposal-length distribution, per-position
acceptance and proposal time per source — with the profile's verify times; γ' below the bench's γ is predicted by
cutting the same proposals to γ'. A bench run with the round scheduler (`--schedule`) is priced from its scheduled
rounds the same way (each round's verified prefix, k = 0 a plain step) and checked against its measured tokens/s.
"""

from __future__ import annotations

import json
from pathlib import Path

from .. import cost, metrics
from ..errors import DraftwiseError
from ..sd.families import drafter_kind
from ..specs import split_hybrid
from .bench import SCHEDULED


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise DraftwiseError(f"no {path.name} in {path.parent}: is it a finished {what} run folder?")
    return json.loads(path.read_text())


def bench_acceptance(bench_dir: Path) -> dict:
    """The drafter, γ, measured acceptance and tokens/s of a bench run (from its raw records)."""
    config = _read_json(bench_dir / "config.json", "bench")
    records = [json.loads(line) for line in (bench_dir / "records.jsonl").read_text().splitlines() if line.strip()]
    sd = [r for r in records if r["method"] == "sd"]
    if not sd:
        raise DraftwiseError(f"bench run {bench_dir} has no SD records (was it run with --drafter?)")
    s = metrics.summarize_method(sd)
    scheduled = [r for r in records if r["method"] == SCHEDULED]
    return {
        "drafter": config["drafter"],
        "gamma": config["gamma"],
        "alpha": s["alpha"],
        "acceptance_per_position": s["acceptance_per_position"],
        "tokens_per_s": s["tokens_per_s"],
        "decode_tokens_per_s": s.get("decode_tokens_per_s"),
        "kind": drafter_kind(config["drafter"]),
        "rounds": [r for rec in sd for r in rec["rounds"]],
        "scheduled": {
            "rounds": [r for rec in scheduled for r in rec["rounds"]],
            **{
                k: v
                for k, v in metrics.summarize_method(scheduled).items()
                if k in ("tokens_per_s", "decode_tokens_per_s")
            },
        }
        if scheduled
        else None,
    }


def predict(
    profile: dict,
    batch: int = 1,
    gammas: list[int] | None = None,
    alpha: float | None = None,
    bench: dict | None = None,
) -> dict:
    entry = profile["batches"].get(str(batch))
    if entry is None:
        raise DraftwiseError(f"the profile has no batch {batch} (it has {', '.join(profile['batches'])})")
    ar = entry["ar_step_ms"]
    t_verify = cost.verify_curve(entry)  # γ = 0: a plain AR step
    gammas = gammas or sorted(int(g) for g in entry["verify_ms"] if int(g))
    rows, skipped = [], []
    for spec, d in entry["drafters"].items():
        measured = bench if bench and bench["drafter"] == spec else None
        per_position = measured["acceptance_per_position"] if measured else None
        if per_position is None and alpha is None:
            skipped.append(spec)
            continue
        for g in gammas:
            en = cost.expected_tokens(cost.acceptance_for(g, alpha, per_position))
            tps = 1e3 * cost.throughput(en, g, d["step_ms"], t_verify(g))
            rows.append(
                {
                    "drafter": spec,
                    "gamma": g,
                    "expected_tokens": en,
                    "tokens_per_s": tps,
                    "speedup_vs_ar": tps * ar / 1e3,
                    "free_drafter_tokens_per_s": 1e3 * cost.free_drafter_limit(en, t_verify(g)),
                    "acceptance": "measured" if per_position else f"alpha={alpha}",
                }
            )
    if bench and bench.get("kind", "model") != "model":
        rows += variable_rows(bench, entry, t_verify, gammas, ar)
    scheduled = scheduled_row(bench, entry, t_verify, ar) if bench and bench.get("scheduled") else None
    if scheduled:
        rows.append(scheduled)
    rows.sort(key=lambda r: -r["tokens_per_s"])
    best = {}
    for r in rows:
        best.setdefault(r["drafter"], r)
    out = {"batch": batch, "ar_tokens_per_s": 1e3 / ar, "rows": rows, "best_gamma": best, "skipped": skipped}
    if bench:
        row = next((r for r in rows if r["drafter"] == bench["drafter"] and r["gamma"] == bench["gamma"]), None)
        if row is None and bench["drafter"] in entry["drafters"]:
            en = cost.expected_tokens(
                cost.acceptance_for(bench["gamma"], per_position=bench["acceptance_per_position"])
            )
            row = {
                "tokens_per_s": 1e3
                * cost.throughput(
                    en, bench["gamma"], entry["drafters"][bench["drafter"]]["step_ms"], t_verify(bench["gamma"])
                )
            }
        if scheduled:
            out["check_scheduled"] = check(bench, bench["scheduled"], scheduled["tokens_per_s"])
        if row:
            out["check"] = check(bench, bench, row["tokens_per_s"])
    return out


def check(bench: dict, measured: dict, predicted: float) -> dict:
    """A prediction beside a bench method's measured tokens/s (`measured`: its figures; decode tokens/s, prefill
    excluded like the model, when the method reports it)."""
    against = measured.get("decode_tokens_per_s") or measured["tokens_per_s"]
    return {
        "drafter": bench["drafter"],
        "gamma": bench["gamma"],
        "predicted_tokens_per_s": predicted,
        "measured_decode_tokens_per_s": measured.get("decode_tokens_per_s"),
        "measured_tokens_per_s": measured["tokens_per_s"],
        "error": predicted / against - 1,
    }


def model_step_s(bench: dict, entry: dict) -> float | None:
    """The profiled step (seconds) of the bench drafter's model part (a model drafter, or a hybrid's); None else."""
    kind = bench.get("kind", "model")
    spec = split_hybrid(bench["drafter"])[0] if kind == "hybrid" else bench["drafter"] if kind == "model" else None
    profiled = entry["drafters"].get(spec) if spec else None
    return profiled["step_ms"] / 1e3 if profiled else None


def scheduled_row(bench: dict, entry: dict, t_verify, ar_ms: float) -> dict:
    """The scheduled run priced from its own rounds like any lookup's: each round's verified prefix k (drafted) and
    its acceptance, k = 0 rounds a plain step (a model drafter's unverified draft steps are not in the rounds: its
    draft time is priced per verified token)."""
    tps = cost.predict_rounds(bench["scheduled"]["rounds"], lambda k: t_verify(k) / 1e3, model_step_s(bench, entry))
    return {
        "drafter": bench["drafter"] + " (scheduled)",
        "gamma": bench["gamma"],
        "expected_tokens": None,
        "tokens_per_s": tps,
        "speedup_vs_ar": tps * ar_ms / 1e3,
        "free_drafter_tokens_per_s": None,
        "acceptance": "measured scheduled rounds",
    }


def variable_rows(bench: dict, entry: dict, t_verify, gammas: list[int], ar_ms: float) -> list[dict]:
    """Rows for a lookup or hybrid drafter: the mixture over its measured rounds, proposals cut to each γ' ≤ its γ."""
    step = model_step_s(bench, entry)  # a lookup's is None; variable rows are never a model drafter's
    rows = []
    for g in sorted({x for x in gammas if x <= bench["gamma"]} | {bench["gamma"]}):
        tps = cost.predict_rounds(bench["rounds"], lambda k: t_verify(k) / 1e3, step, cap=g)
        rows.append(
            {
                "drafter": bench["drafter"],
                "gamma": g,
                "expected_tokens": None,
                "tokens_per_s": tps,
                "speedup_vs_ar": tps * ar_ms / 1e3,
                "free_drafter_tokens_per_s": None,
                "acceptance": "measured proposals",
            }
        )
    return rows


def run(
    profile_dir: str | Path,
    bench_dir: str | Path | None = None,
    alpha: float | None = None,
    batch: int = 1,
    gammas: list[int] | None = None,
    out: str | Path | None = None,
) -> dict:
    if alpha is not None and not 0 <= alpha <= 1:
        raise DraftwiseError(f"alpha must be in [0, 1], got {alpha}")
    profile = _read_json(Path(profile_dir) / "profile.json", "profile")
    bench = bench_acceptance(Path(bench_dir)) if bench_dir else None
    if bench is None and alpha is None:
        raise DraftwiseError("give --bench RUN (measured acceptance) or --alpha A (assumed i.i.d. acceptance)")
    result = predict(profile, batch, gammas, alpha, bench)
    if out:
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(format_predictions(result))
    return result


def format_predictions(result: dict, top: int = 15) -> str:
    b = result["batch"]
    lines = [
        f"AR: {result['ar_tokens_per_s']:.2f} tokens/s per sequence (batch {b}: {b * result['ar_tokens_per_s']:.1f} "
        "in total); tokens/s below are per sequence",
        f"{'drafter':<42}{'γ':>3}{'E[N]':>7}{'tokens/s':>10}{'vs AR':>8}  acceptance",
    ]
    for r in result["rows"][:top]:
        en = "-" if r["expected_tokens"] is None else f"{r['expected_tokens']:.2f}"
        lines.append(
            f"{r['drafter'][:42]:<42}{r['gamma']:>3}{en:>7}{r['tokens_per_s']:>10.2f}"
            f"{r['speedup_vs_ar']:>7.2f}x  {r['acceptance']}"
        )
    for spec, r in result["best_gamma"].items():
        lines.append(
            f"γ* for {spec[:42]}: {r['gamma']} ({r['tokens_per_s']:.2f} tokens/s, {b * r['tokens_per_s']:.1f} in total)"
        )
    if result["skipped"]:
        lines.append(f"no acceptance known (give --alpha) for: {', '.join(s[:30] for s in result['skipped'])}")
    sched = result.get("check_scheduled")
    if sched:
        lines.append(
            f"check against the bench run's scheduled rounds: predicted {sched['predicted_tokens_per_s']:.2f}, "
            f"measured {sched['measured_decode_tokens_per_s'] or sched['measured_tokens_per_s']:.2f} decode "
            f"tokens/s ({100 * sched['error']:+.1f} %)"
        )
    check = result.get("check")
    if check:
        lines.append(
            f"check against the bench run ({check['drafter']}, γ={check['gamma']}): predicted "
            f"{check['predicted_tokens_per_s']:.2f}, measured "
            f"{check['measured_decode_tokens_per_s'] or check['measured_tokens_per_s']:.2f} "
            f"decode tokens/s ({100 * check['error']:+.1f} %); with prefill {check['measured_tokens_per_s']:.2f}"
        )
    return "\n".join(lines)
