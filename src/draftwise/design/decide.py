"""Decisions from paired measurements that machine noise cannot flip.

Every option (a drafter, a γ, a head size) was measured beside AR on the same prompts, interleaved prompt by prompt,
so per prompt there are paired timings. The figure of an option is its speedup over AR — Σ tokens / Σ seconds of the
option over the same of AR — and its uncertainty a bootstrap over prompts (resampled with replacement, the same
resample for every option, so differences are paired): a 95 % interval of the speedup and of the best option's lead
over each other one, log(speedup_best / speedup_other).

  leader    the option with the largest measured speedup
  tie       the leader and every option whose lead interval contains 0: the measurement cannot order them
  chosen    among the tie, the cheapest by `cost` (e.g. draft step, then KV footprint; a smaller γ, a smaller head) —
            never a TAR difference, which is within its own noise when the speedups are

A tie is first re-measured (a bounded number of extra interleaved passes over the same prompts, pooled per prompt):
timing noise shrinks with repeats; a real tie stays a tie.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

RESAMPLES = 2000
LEVEL = 0.95
IGNORE = object()  # what a `timings` key function returns for records that are no option of the decision


def timings(records: Sequence[dict], key: Callable[[dict], object]) -> dict[object, dict[str, tuple[float, float]]]:
    """{option: {prompt id: (new tokens, seconds)}} from bench records (AR's option key is whatever `key` gives it;
    records keyed `IGNORE` are left out); repeated passes over a prompt are pooled (their tokens and seconds summed)."""
    out: dict[object, dict[str, tuple[float, float]]] = {}
    for r in records:
        k = key(r)
        if k is IGNORE:
            continue
        per = out.setdefault(k, {})
        tokens, seconds = per.get(r["prompt_id"], (0.0, 0.0))
        per[r["prompt_id"]] = (tokens + r["new_tokens"], seconds + r["seconds"])
    return out


def compare(
    options: dict[object, dict[str, tuple[float, float]]], ar: dict[str, tuple[float, float]], seed: int = 0
) -> dict:
    """Speedups over AR with intervals, the leader and each option's lead interval (on the prompts all share)."""
    prompts = sorted(set(ar).intersection(*map(set, options.values())))
    names = list(options)
    tok = np.array([[options[n][p][0] for p in prompts] for n in names])  # [options, prompts]
    sec = np.array([[options[n][p][1] for p in prompts] for n in names])
    ar_tok, ar_sec = np.array([ar[p][0] for p in prompts]), np.array([ar[p][1] for p in prompts])

    def speedup(idx):  # [..., options]: Σ tokens / Σ seconds over AR's, on the prompts `idx`
        return (tok[:, idx].sum(-1) / sec[:, idx].sum(-1)).T / (ar_tok[idx].sum(-1) / ar_sec[idx].sum(-1))[..., None]

    point = speedup(np.arange(len(prompts)))
    draws = np.random.default_rng(seed).integers(0, len(prompts), (RESAMPLES, len(prompts)))
    boot = speedup(draws)  # [resamples, options]
    lo_q, hi_q = 100 * (1 - LEVEL) / 2, 100 * (1 + LEVEL) / 2
    leader = int(np.argmax(point))
    lead = np.log(boot[:, [leader]] / boot)  # [resamples, options]: the leader's lead over each option
    return {
        "prompts": len(prompts),
        "leader": names[leader],
        "speedup": {
            n: [float(point[i]), float(np.percentile(boot[:, i], lo_q)), float(np.percentile(boot[:, i], hi_q))]
            for i, n in enumerate(names)
        },
        "lead": {
            n: [float(np.percentile(lead[:, i], lo_q)), float(np.percentile(lead[:, i], hi_q))]
            for i, n in enumerate(names)
            if i != leader
        },
    }


def tied(result: dict) -> list:
    """The leader and every option whose lead interval reaches 0 or below."""
    return [result["leader"]] + [n for n, (lo, _) in result["lead"].items() if lo <= 0]


def choose(result: dict, cost: Callable[[object], tuple]) -> dict:
    """The decision record: the leader if it leads every other option beyond noise, else the cheapest of the tie."""
    tie = tied(result)
    chosen = min(tie, key=lambda n: (*cost(n), -result["speedup"][n][0]))
    return {
        **result,
        "tie": tie if len(tie) > 1 else [],
        "chosen": chosen,
        "cost": {n: list(cost(n)) for n in result["speedup"]},
        "why": (
            "faster than every other option beyond noise"
            if len(tie) == 1
            else f"tie within noise between {', '.join(map(str, tie))}: the cheapest step wins (at equal cost, "
            "the faster point estimate)"
        ),
    }
