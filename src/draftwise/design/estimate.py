"""What the design predicts before it measures: a model candidate's greedy tokens/s per γ, from its exact greedy TAR
(`agree`) over the step and verify times a profile measured (the paper's cost model, `cost.throughput`), a round's
drafting priced as the loop pays it: its first step feeds two tokens after a round that accepted every draft."""

from __future__ import annotations

import json

from .. import cost
from .pipeline import DesignFolder, Stages

GAMMAS = (1, 2, 3, 4, 6, 8)  # the lookaheads a model candidate is profiled and predicted at
SCREEN = 0.9  # an untrained model drafter predicted below this share of the best model drafter is not benchmarked


def predicted(
    p: Stages | DesignFolder, spec: str, name: str, batch: int = 1, profile: str = "profile"
) -> dict[int, float]:
    """Predicted greedy tokens/s per γ (per sequence, at `batch`): the exact greedy TAR replayed from `agree` over
    step and verify times measured at that batch by `profile` (a profile stage: each engine has its own). Empty when
    the profile has no such batch."""
    prof = json.loads((p.folder(profile) / "profile.json").read_text())["batches"].get(str(batch))
    if prof is None:
        return {}
    tar = json.loads((p.folder(f"agree-{name}") / "agree.json").read_text())["predicted_greedy_tar"]
    verify = cost.verify_curve(prof)  # side-by-side ratios × the AR step
    step, catch_up = cost.drafter_step_ms(prof, spec)  # on the verify curve's footing
    out = {}
    for g in GAMMAS:
        if tar.get(str(g)):
            # a round's drafting: γ steps, the first over two tokens after a round that accepted every draft
            draft = g * step + all_accepted(tar, g) * max(0.0, catch_up - step)
            out[g] = 1e3 * cost.throughput(tar[str(g)], 1, draft, verify(g))
    return out


def all_accepted(tar: dict[str, float], g: int) -> float:
    """P(a greedy round of γ = g accepts every draft) from the greedy TAR per γ (keys are γ as text): a round emits
    1 + min(L, γ) tokens, L the run of drafts the target agrees with, so TAR(g) − TAR(g−1) = P(L ≥ g); a γ whose
    predecessor was not replayed takes the mean step from the nearest one below (TAR(0) = 1)."""
    below = max((int(k) for k in tar if int(k) < g and tar[k]), default=0)
    return max(0.0, (tar[str(g)] - (tar[str(below)] if below else 1.0)) / (g - below))


def best_gamma(p: Stages | DesignFolder, spec: str, name: str, profile: str = "profile") -> tuple[int, float]:
    """(γ*, its predicted tokens/s) of a model candidate at batch 1."""
    pred = predicted(p, spec, name, profile=profile)
    return max(pred.items(), key=lambda kv: kv[1]) if pred else (1, 0.0)
