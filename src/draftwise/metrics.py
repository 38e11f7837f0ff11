"""Figures derived from raw per-round records, with their definitions. Nothing here is stored by the stages: run
folders keep raw records, and these functions recompute summaries from them.

  TAR                      tokens emitted per target verify call (round), the recovered/bonus token included.
                           AR has TAR 1 by construction.
  α (alpha)                accepted / drafted, over all rounds: the per-token acceptance rate.
  acceptance per position  a_k = P(the k-th drafted token is accepted | the first k−1 were) = rounds that accepted
                           ≥ k tokens / rounds that drafted ≥ k tokens and accepted ≥ k−1 (k = 1..γ; None where
                           no round got that far). These are the rates of E[N] = 1 + Σ_k Π_{i≤k} a_i (`cost`).
  tokens/s                 new tokens / wall seconds, summed over prompts (prefill included, as in generate()).
                           llama-server's seconds are its own timings (prompt + predicted ms, no HTTP); draftwise
                           serve's (a serve:ARGS baseline) the client's wall seconds through HTTP.
  decode tokens/s          new tokens / (wall − prefill) seconds: the steady state a cost model predicts (the draftwise
                           engine; llama-server: new tokens / its predicted ms).
  bytes per step           plain decoding (draftwise AR, llama-server and llama-cpp-python plain, transformers'
                           generate()): the weight bytes one step reads on that runtime (`machine`: the share of
                           the bandwidth limit = decode tokens/s × bytes per step ÷ measured read bandwidth).
  wall tokens/s            llama-server and draftwise serve: new tokens / the client's wall seconds (HTTP included).
  drafted / accepted       for engines that report totals only (llama-server's draft_n / draft_n_accepted, llama-cpp's
                           prompt lookup): draft tokens proposed and accepted over all prompts; α = accepted / drafted.
  speedup vs AR            tokens/s of a method / tokens/s of AR through the same engine, same prompts, same process.
  verify ms (by γ)         median time of the target's pass over γ+1 positions (with the acceptance test), per γ;
                           γ = 0 is one plain AR step. verify_over_ar_step = verify ms at γ / AR step ms.
  draft step ms            median of draft_s / drafted over rounds that drafted: one drafter step.
  proposed fraction        rounds with at least one drafted token / rounds (a lookup drafter proposes only where its
                           index matches; a round without a proposal is a plain AR step).
  proposal lengths         {g: rounds that drafted g tokens}: the distribution a variable-length drafter's throughput
                           is predicted from (`cost.throughput_mixture`).
  propose ms               median draft_s over rounds that drafted: a lookup's whole proposal (one call, not γ steps).
  by source                the same counts per proposer ("model" | "lookup") for hybrids; TAR per source counts the
                           rounds that source drafted.
  per suite                a method's tokens/s and TAR on one suite's (task's) prompts, over AR's tokens/s on the same.
  schedule (sd-scheduled)  k* = tokens a round verified of its proposal (`sd.schedule`): {k: rounds}, the fraction of
                           proposed tokens verified, rounds paused by the bypass; calibration per bin of predicted â
                           (width 0.1): positions observed, mean â, mean observed acceptance probability, their gap.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence


def tar(rounds: Sequence[dict]) -> float:
    return sum(r["emitted"] for r in rounds) / len(rounds) if rounds else 0.0


def alpha(rounds: Sequence[dict]) -> float | None:
    drafted = sum(r["drafted"] for r in rounds)
    return sum(r["accepted"] for r in rounds) / drafted if drafted else None


def acceptance_per_position(rounds: Sequence[dict]) -> list[float | None]:
    """a_k for k = 1..max γ: among rounds in which the k-th drafted token was tested (drafted ≥ k, the first k−1
    accepted), the fraction that accepted it."""
    depth = max((r["drafted"] for r in rounds), default=0)
    out = []
    for k in range(1, depth + 1):
        tested = [r for r in rounds if r["drafted"] >= k and r["accepted"] >= k - 1]
        out.append(sum(r["accepted"] >= k for r in tested) / len(tested) if tested else None)
    return out


def tokens_per_s(generations: Iterable[dict]) -> float:
    gens = list(generations)
    seconds = sum(g["seconds"] for g in gens)
    return sum(g["new_tokens"] for g in gens) / seconds if seconds else 0.0


def summarize_method(generations: Sequence[dict]) -> dict:
    """One method's figures over its per-prompt records (each with `new_tokens`, `seconds` and optional `rounds`)."""
    rounds = [r for g in generations for r in g.get("rounds", [])]
    out = {
        "prompts": len(generations),
        "new_tokens": sum(g["new_tokens"] for g in generations),
        "seconds": sum(g["seconds"] for g in generations),
        "tokens_per_s": tokens_per_s(generations),
    }
    if all("prefill_s" in g for g in generations):
        out["decode_tokens_per_s"] = tokens_per_s({**g, "seconds": g["seconds"] - g["prefill_s"]} for g in generations)
    if generations and all("bytes_per_step" in g for g in generations):
        out["bytes_per_step"] = generations[0]["bytes_per_step"]
    if generations and all("wall_s" in g for g in generations):
        out["wall_tokens_per_s"] = tokens_per_s({**g, "seconds": g["wall_s"]} for g in generations)
    if generations and not rounds and all("drafted" in g for g in generations):
        drafted, accepted = sum(g["drafted"] for g in generations), sum(g["accepted"] for g in generations)
        out.update(drafted=drafted, accepted=accepted, alpha=accepted / drafted if drafted else None)
    if rounds:
        out.update(
            rounds=len(rounds),
            tar=tar(rounds),
            alpha=alpha(rounds),
            acceptance_per_position=acceptance_per_position(rounds),
            draft_s=sum(r["draft_s"] for r in rounds),
            verify_s=sum(r["verify_s"] for r in rounds),
            verify_ms=verify_ms_by_gamma(rounds),
            draft_step_ms=draft_step_ms(rounds),
            **proposals(rounds),
        )
        if any(r.get("schedule") for r in rounds):
            out["schedule"] = schedule(rounds)
    return out


def source_of(r: dict) -> str:
    """Who proposed a round: "model", a lookup's name, or "" (no proposal: a plain step)."""
    return (r.get("source") or "model") if r["drafted"] else ""


def proposals(rounds: Sequence[dict]) -> dict:
    """Proposed fraction, proposal lengths, per-round proposal time and per-source counts (see the definitions)."""
    drafting = [r for r in rounds if r["drafted"]]
    lengths: dict[int, int] = {}
    for r in rounds:
        lengths[r["drafted"]] = lengths.get(r["drafted"], 0) + 1
    by: dict[str, list[dict]] = {}
    for r in drafting:
        by.setdefault(source_of(r), []).append(r)
    return {
        "proposed_fraction": len(drafting) / len(rounds) if rounds else None,
        "proposal_lengths": dict(sorted(lengths.items())),
        "propose_ms": 1e3 * statistics.median(r.get("draft_s", 0.0) for r in drafting) if drafting else None,
        "by_source": {
            src: {
                "rounds": len(rs),
                "drafted": sum(r["drafted"] for r in rs),
                "accepted": sum(r["accepted"] for r in rs),
                "tar": tar(rs),
                "alpha": alpha(rs),
            }
            for src, rs in sorted(by.items())
        },
    }


def schedule(rounds: Sequence[dict]) -> dict | None:
    """The scheduler's decisions and calibration over rounds that carry a `schedule` (see the definitions)."""
    plans = [r["schedule"] for r in rounds if r.get("schedule")]
    if not plans:
        return None
    ks: dict[int, int] = {}
    bins: dict[int, list[tuple[float, float]]] = {}
    for p in plans:
        ks[p["k"]] = ks.get(p["k"], 0) + 1
        for a_hat, seen in zip(p["a_hat"], p["observed"]):
            bins.setdefault(min(9, int(a_hat * 10)), []).append((a_hat, seen))
    calibration = []
    for b, v in sorted(bins.items()):
        predicted, observed = statistics.fmean(a for a, _ in v), statistics.fmean(o for _, o in v)
        calibration.append(
            {
                "bin": f"{b / 10:.1f}-{(b + 1) / 10:.1f}",
                "positions": len(v),
                "predicted": predicted,
                "observed": observed,
                "gap": predicted - observed,
            }
        )
    proposed = sum(p["proposed"] for p in plans)
    return {
        "k": dict(sorted(ks.items())),
        "verified_fraction": sum(p["k"] for p in plans) / proposed if proposed else None,
        "paused_rounds": sum(p["paused"] for p in plans),
        "calibration": calibration,
    }


def per_suite(sd: Sequence[dict], ar: Sequence[dict]) -> dict[str, dict]:
    """Per suite (task): SD's tokens/s, its TAR, and its tokens/s over AR's on that suite's prompts (same run)."""
    out = {}
    for suite in sorted({r["suite"] for r in sd}):
        mine = [r for r in sd if r["suite"] == suite]
        base = [r for r in ar if r["suite"] == suite]
        speed = tokens_per_s(mine)
        out[suite] = {
            "prompts": len(mine),
            "tokens_per_s": speed,
            "tar": tar([x for r in mine for x in r.get("rounds", [])]),
            "speedup_vs_ar": speed / tokens_per_s(base) if base and tokens_per_s(base) else None,
        }
    return out


def verify_ms_by_gamma(rounds: Sequence[dict]) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for r in rounds:
        by.setdefault(r["drafted"], []).append(r["verify_s"])
    return {g: 1e3 * statistics.median(v) for g, v in sorted(by.items())}


def draft_step_ms(rounds: Sequence[dict]) -> float | None:
    steps = [r["draft_s"] / r["drafted"] for r in rounds if r["drafted"]]
    return 1e3 * statistics.median(steps) if steps else None


def identical_fraction(a: Sequence[dict], b: Sequence[dict]) -> float | None:
    """Fraction of prompts on which two methods produced the same tokens (matched by prompt id)."""
    tokens_b = {g["prompt_id"]: g["tokens"] for g in b}
    pairs = [(g["tokens"], tokens_b[g["prompt_id"]]) for g in a if g["prompt_id"] in tokens_b]
    return sum(x == y for x, y in pairs) / len(pairs) if pairs else None


def divergence(a: Sequence[dict], b: Sequence[dict]) -> dict:
    """Where two methods' outputs part (matched by prompt id): for each prompt whose tokens differ, the number of
    identical leading tokens before the first difference (`first`), with its min, median and max."""
    tokens_b = {g["prompt_id"]: g["tokens"] for g in b}
    first = []
    for g in a:
        other = tokens_b.get(g["prompt_id"])
        if other is None or other == g["tokens"]:
            continue
        first.append(
            next((i for i, (x, y) in enumerate(zip(g["tokens"], other)) if x != y), min(len(g["tokens"]), len(other)))
        )
    if not first:
        return {"prompts_differing": 0, "first": []}
    return {
        "prompts_differing": len(first),
        "first": sorted(first),
        "first_min": min(first),
        "first_median": statistics.median(first),
        "first_max": max(first),
    }
