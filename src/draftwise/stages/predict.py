"""`draftwise predict`: tokens/s for each profiled drafter and γ, from measured step times and acceptance.

  tokens/s(drafter, γ) = E[N] / (γ·t_q + t_verify(γ))      (see `draftwise.cost`)
t_q and t_verify come from a profile run (t_verify interpolated between profiled γ); acceptance comes from a bench
run's measured per-position rates when that run used the drafter, else from `--alpha` (i.i.d.). When a bench run is
given (one drafter and γ, or a grid of them), each of its SD points' measured decode tokens/s (prefill excluded, like
the model) is set beside that point's own prediction.

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

AXES = ("drafter", "gamma", "temperature", "batch_size")  # what tells a bench run's points apart


def _read_json(path: Path, what: str) -> dict:
    if not path.is_file():
        raise DraftwiseError(f"no {path.name} in {path.parent}: is it a finished {what} run folder?")
    return json.loads(path.read_text())


def bench_points(bench_dir: Path, batch: int = 1) -> list[dict]:
    """Each SD point of a bench run (one drafter and γ, or a grid of them) at batch size `batch`, read from its raw
    records: the drafter, γ, temperature, measured acceptance and tokens/s, its rounds, and its scheduled rounds where
    the run had the round scheduler."""
    config = _read_json(bench_dir / "config.json", "bench")
    own = {k: config[k] for k in AXES if k in config}  # one bench's records leave its point's axes to its config
    lines = (bench_dir / "records.jsonl").read_text().splitlines()
    records = [{**own, **json.loads(line)} for line in lines if line.strip()]
    runs = [r for r in records if r["method"] in ("sd", SCHEDULED) and r["batch_size"] == batch]
    if not any(r["method"] == "sd" for r in runs):
        raise DraftwiseError(f"bench run {bench_dir} has no SD records at batch {batch} (was it run with --drafter?)")
    keys = dict.fromkeys(_key(r) for r in runs if r["method"] == "sd")
    plain = [r for r in records if r["method"] == "ar" and r["batch_size"] == batch]
    return [
        {
            **_point(key, [r for r in runs if _key(r) == key]),
            "ar_decode_tokens_per_s": _decode([r for r in plain if r["temperature"] == key[2]]),
        }
        for key in keys
    ]


def _decode(records: list[dict]) -> float | None:
    return metrics.summarize_method(records).get("decode_tokens_per_s") if records else None


def _key(record: dict) -> tuple:
    return record["drafter"], record["gamma"], record["temperature"]


def in_order(records: list[dict]) -> list[dict]:
    """Every generation's rounds in order, each tagged with its generation (what `cost.catch_up_s` starts afresh at)."""
    return [{**r, "prompt_id": f"{rec.get('prompt_id')}#{i}"} for i, rec in enumerate(records) for r in rec["rounds"]]


def _point(key: tuple, records: list[dict]) -> dict:
    drafter, gamma, temperature = key
    sd = [r for r in records if r["method"] == "sd"]
    scheduled = [r for r in records if r["method"] == SCHEDULED]
    s = metrics.summarize_method(sd)
    return {
        "drafter": drafter,
        "gamma": gamma,
        "temperature": temperature,
        "alpha": s["alpha"],
        "acceptance_per_position": s["acceptance_per_position"],
        "tokens_per_s": s["tokens_per_s"],
        "decode_tokens_per_s": s.get("decode_tokens_per_s"),
        "kind": drafter_kind(drafter),
        "rounds": in_order(sd),
        "scheduled": {
            "rounds": in_order(scheduled),
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
    points: list[dict] = (),
) -> dict:
    """Rows of predicted tokens/s per drafter and γ (a model drafter's acceptance: its bench point's, the one at the
    lowest temperature and largest γ, else `alpha`), and each bench point's check: its own prediction beside what
    it measured."""
    entry = profile["batches"].get(str(batch))
    if entry is None:
        raise DraftwiseError(f"the profile has no batch {batch} (it has {', '.join(profile['batches'])})")
    ar = entry["ar_step_ms"]
    t_verify = cost.verify_curve(entry)  # γ = 0: a plain AR step
    gammas = gammas or sorted(int(g) for g in entry["verify_ms"] if int(g))
    rows, skipped, checks = [], [], []
    for spec in entry["drafters"]:
        mine = sorted((x for x in points if x["drafter"] == spec), key=lambda x: (x["temperature"], -x["gamma"]))
        per_position = mine[0]["acceptance_per_position"] if mine else None
        if per_position is None and alpha is None:
            skipped.append(spec)
            continue
        step = cost.drafter_step_ms(entry, spec)[0]
        rows += [model_row(spec, g, step, t_verify, ar, alpha, per_position) for g in gammas]
    for x in points:  # each point's own rows, and its prediction beside what it measured
        predicted = None
        if x.get("kind", "model") != "model":
            own = variable_rows(x, entry, t_verify, gammas, ar)
            rows += own
            predicted = next(r for r in own if r["gamma"] == x["gamma"])["tokens_per_s"]
        elif x["drafter"] in entry["drafters"]:  # a model drafter the profile timed: at its own acceptance
            step = cost.drafter_step_ms(entry, x["drafter"])[0]
            own = model_row(x["drafter"], x["gamma"], step, t_verify, ar, None, x["acceptance_per_position"])
            predicted = own["tokens_per_s"]
        if predicted is not None:
            checks.append(check(x, x, predicted, "sd", ar))
        if x.get("scheduled"):
            rows.append(scheduled_row(x, entry, t_verify, ar))
            checks.append(check(x, x["scheduled"], rows[-1]["tokens_per_s"], "scheduled", ar))
    rows.sort(key=lambda r: -r["tokens_per_s"])
    best = {}
    for r in rows:
        best.setdefault(r["drafter"], r)
    return {
        "batch": batch,
        "ar_tokens_per_s": 1e3 / ar,
        "rows": rows,
        "best_gamma": best,
        "skipped": skipped,
        "checks": checks,
    }


def model_row(spec: str, g: int, step_ms: float, t_verify, ar_ms: float, alpha, per_position) -> dict:
    """A model drafter at γ = g: E[N] from its per-position acceptance (else i.i.d. `alpha`) over γ·t_q + t_verify."""
    en = cost.expected_tokens(cost.acceptance_for(g, alpha, per_position))
    tps = 1e3 * cost.throughput(en, g, step_ms, t_verify(g))
    return {
        "drafter": spec,
        "gamma": g,
        "expected_tokens": en,
        "tokens_per_s": tps,
        "speedup_vs_ar": tps * ar_ms / 1e3,
        "free_drafter_tokens_per_s": 1e3 * cost.free_drafter_limit(en, t_verify(g)),
        "acceptance": "measured" if per_position else f"alpha={alpha}",
    }


def check(bench: dict, measured: dict, predicted: float, method: str, ar_ms: float) -> dict:
    """A prediction beside a bench method's measured tokens/s (`measured`: its figures; decode tokens/s, prefill
    excluded like the model, when the method reports it); where the run measured AR too, the prediction anchored on
    it: its ratio to the profile's AR step times that AR's decode tokens/s (the profile's absolute milliseconds,
    taken in another process, move from run to run; ratios measured side by side hold, as the design's report says)."""
    against = measured.get("decode_tokens_per_s") or measured["tokens_per_s"]
    ar = bench.get("ar_decode_tokens_per_s")
    anchored = predicted * ar_ms / 1e3 * ar if ar else None
    return {
        "drafter": bench["drafter"],
        "gamma": bench["gamma"],
        "temperature": bench["temperature"],
        "method": method,
        "predicted_tokens_per_s": predicted,
        "measured_decode_tokens_per_s": measured.get("decode_tokens_per_s"),
        "measured_tokens_per_s": measured["tokens_per_s"],
        "error": predicted / against - 1,
        "anchored_tokens_per_s": anchored,
        "anchored_error": anchored / against - 1 if anchored else None,
    }


def model_step_s(bench: dict, entry: dict) -> float | None:
    """The profiled step (seconds) of the bench drafter's model part (a model drafter, or a hybrid's); None else."""
    kind = bench.get("kind", "model")
    spec = split_hybrid(bench["drafter"])[0] if kind == "hybrid" else bench["drafter"] if kind == "model" else None
    return cost.drafter_step_ms(entry, spec)[0] / 1e3 if spec in entry["drafters"] else None


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
    points = bench_points(Path(bench_dir), batch) if bench_dir else []
    if not points and alpha is None:
        raise DraftwiseError("give --bench RUN (measured acceptance) or --alpha A (assumed i.i.d. acceptance)")
    result = predict(profile, batch, gammas, alpha, points)
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
    for c in result["checks"]:
        what = f"{c['drafter'][:42]}, γ={c['gamma']}, T={c['temperature']:g}" + (
            ", its scheduled rounds" if c["method"] == "scheduled" else ""
        )
        lines.append(
            f"check against the bench run ({what}): predicted {c['predicted_tokens_per_s']:.2f}, measured "
            f"{c['measured_decode_tokens_per_s'] or c['measured_tokens_per_s']:.2f} decode tokens/s "
            f"({100 * c['error']:+.1f} %"
            + (
                f"; anchored on this run's AR {c['anchored_tokens_per_s']:.2f}, {100 * c['anchored_error']:+.1f} %"
                if c["anchored_tokens_per_s"]
                else ""
            )
            + f"); with prefill {c['measured_tokens_per_s']:.2f}"
        )
    return "\n".join(lines)
