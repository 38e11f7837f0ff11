"""Shapes cut from the family's small model: the paper's recipe where the target itself cannot be trained here.

A target studied at int8 or q4 (too big for an fp32 study in its budget: a 1.5B on a 2-core CPU) is not pruned or
distilled, but its named sibling (`targets.named`, the same tokenizer; Qwen2.5-Coder-0.5B beside the 1.5B) is small
enough to train at fp32. Its real weights are cut as the paper prescribes — fewer layers at full width (wide-shallow)
against the same non-embedding parameters spread over more, narrower layers (deep-narrow) — with the head on the
target's CUT_VOCAB most emitted tokens, then distilled toward the target's own outputs: its top-k over its gen-data
continuations (stored as they were generated) and over the train text, scored teacher-forced by the target at the
study's precision (the target being deployed; `stages.teacher`) in prefill-sized passes — at 1.5B on 2 cores ~180
tokens/s, against gen-data's ~50 in batches of 16 and 10 one sequence at a time — and trained with that head, as SD
will run it.

Priced before anything is trained (`predicted_c`): a draft step reads its weights once, so its cost beside a target
step is about their byte ratio at the same precision; a single cut's learning-curve stop rule asks for the agreement
that such a step needs (`cost.optimistic_break_even`). Where cuts compete, each one's pruned step is timed instead
(`cut_stages.time_step`): the byte ratio leaves out the layers' own cost, and cuts of equal parameters but different
depths price alike by it.

The budget goes to the cut the curves favour (`rank`): each cut first trains a pilot, PILOT_SHARE of its minutes; then
each one's learning curve is read at the tokens it would reach if it alone trained on for all the minutes left, and
the cost model prices that agreement at the cut's predicted step; the first-ranked cut, if it is then predicted to
pay, is trained on from its pilot (`distill --resume-from`, stage `more_stage`) and the others stop where they are.
Why: two cuts trained side by side split the budget while the learning curve is still rising steeply (0.43 → 0.48
over the last 14k tokens of a 24k-token run): the same minutes on one cut buy it twice the tokens.

Where the budget fits one cut's training only (the plan drops `control`), the cuts are *ranked untrained*
(`prerank`), not dropped: each is pruned, its held-out agreement measured before training and after a few seconds of
it (a pilot of PRERANK_MINUTES), and the one ranked first at that agreement gets all the minutes. Why not keep the
wide-shallow cut, as the paper would: on the real pair the deep-narrow twin led at every evaluation, at equal tokens
(Zen 5: 0.22 → 0.53 against 0.13 → 0.38 in 3.4 minutes; Zen 3: 0.32 → 0.555 against 0.14 → 0.42, α on code 0.72
against 0.47). Which cut learns better is measured, not assumed; the order before training held at every later
evaluation in both runs.
"""

from __future__ import annotations

from dataclasses import replace

from .. import cost, learning
from ..config import DesignConfig, DistillConfig, PruneConfig
from ..shapes import Shape
from ..targets.named import family_model
from .candidates import Candidate, narrow_twin

CUT_VOCAB = 16_384  # the head on the target's most emitted tokens: a tenth of Qwen's 152k rows (its full head at Q8_0
# is a third of the sibling's bytes a step)
# distilling a pretrained model's cut: 1e-3 (the rate that recovers a cut of random-looking layers of a 135M) made the
# 0.5B sibling's 8-layer cut diverge within 50 steps here; 5e-5 raised its held-out agreement 0.19 → 0.48 in 10 minutes
CUT_LR = 5e-5
DEPTH_SHARE = 3  # the wide-shallow cut keeps 1/DEPTH_SHARE of the sibling's layers (8 of Qwen2.5-0.5B's 24)
# of each cut's minutes, trained before the curves rank the cuts; the rest goes to the first-ranked one. A half: the
# curve needs its 3+ evaluations (every 20 steps) before it says anything, and what is left still doubles the winner's
PILOT_SHARE = 0.5
PRERANK_MINUTES = 0.05  # a pilot where the cuts are only ranked (`prerank`): a step or two, then the evaluation


def source(config: DesignConfig) -> str | None:
    """The spec of the model a design cuts its trained shapes from when the study cannot train its target: a named
    target's named sibling (None: the target itself where it trains, or nothing to cut)."""
    if config.trains:
        return None
    _, spec = family_model(config.target, ("", ""))
    return spec or None


def candidates(small: Shape, spec: str, factor: int, control: bool = True) -> list[Candidate]:
    """The wide-shallow cut of `small` (the model `spec` names) and, with `control`, its deep-narrow twin at equal
    non-embedding parameters (`candidates.narrow_twin`)."""
    k = max(1, small.layers // DEPTH_SHARE)
    wide = replace(small, layers=k)
    out = [Candidate(f"cut-wide-L{k}", "wide-shallow", wide, source=spec)]
    narrow = narrow_twin(small, k, factor) if control else None
    if narrow is not None:
        out.append(Candidate(f"cut-narrow-L{narrow.layers}", "deep-narrow", narrow, source=spec))
    return out


def predicted_c(cut: Shape, target: Shape) -> float:
    """A cut's draft step over the target's step, priced as the weights each reads a step at the same precision:
    the cut's layers and its CUT_VOCAB-row head against the target's layers and full head."""
    head = min(CUT_VOCAB, target.vocab) * cut.hidden
    return (cut.params()["non_embedding"] + head) / (target.params()["non_embedding"] + target.vocab * target.hidden)


def prune_config(config: DesignConfig, cand: Candidate, data: str, elimination_tokens: int) -> PruneConfig:
    """The sibling cut at fp32, calibrated on the target's continuations, its head reduced to the target's tokens."""
    return PruneConfig(
        target=cand.source,
        shape=cand.prune_shape(),
        data=data,
        calib_tokens=1024,
        elimination_tokens=elimination_tokens,
        draft_vocab=CUT_VOCAB,
        vocab_data=data,
        seed=config.seed,
        dtype="fp32",
        device=config.device,
        threads=config.threads,
    )


def distill_config(
    config: DesignConfig, drafter: str, data: str, vocab_data: str, minutes: float, stop_below: float
) -> DistillConfig:
    """The cut distilled at fp32 (bf16 matmuls where native) toward the target's stored top-k on `data`, with the
    head it deploys: CUT_VOCAB rows counted on gen-data `vocab_data` (`reduced/` written after)."""
    return DistillConfig(
        target=config.target,
        drafter=drafter,
        data=data,
        vocab_data=vocab_data,
        loss=config.loss,
        lr=CUT_LR,
        minutes=minutes,
        draft_vocab=CUT_VOCAB,
        eval_prompts=8,  # the held-out continuations are the target's at decode speed: a few, short
        eval_tokens=32,
        eval_every=20,
        stop_below=stop_below,
        seed=config.seed,
        dtype="fp32",
        target_dtype=config.dtype,  # the target as studied: its fp32 copy (7 GB at 1.5B) stays out of memory
        device=config.device,
        threads=config.threads,
    )


def more_stage(name: str) -> str:
    """The stage that trains the first-ranked cut `name` on from its pilot (`rank`)."""
    return f"distill-more-{name}"


def pilot_minutes(minutes: float, n_cuts: int, prerank: bool = False) -> float:
    """A cut's own training: its share of the minutes, a pilot's where several cuts compete for the rest, a few
    seconds' where they are ranked untrained (`prerank`: the agreement before training ranks them)."""
    if n_cuts < 2:
        return minutes
    return PRERANK_MINUTES if prerank else minutes * PILOT_SHARE


def rank(pilots: dict[str, tuple[float, list[dict]]], minutes: float) -> list[dict]:
    """The cuts best first: each one's (`pilots`: name -> c, its pilot distillation's records) agreement
    as its learning curve predicts it after `minutes` more of training at its own measured rate, priced by the cost
    model (`cost.optimistic_speedup`). An invalid curve (too few evaluations, no rise) predicts its last agreement."""
    out = []
    for name, (c, records) in pilots.items():
        curve = learning.fit(records)
        rate = learning.rate(records) or 0.0
        at_end = curve.tokens_seen + rate * 60 * minutes
        alpha = float(curve.predict(at_end))
        out.append(
            {
                "name": name,
                "c": c,
                "agreement_now": curve.agreement_now,
                "tokens_seen": curve.tokens_seen,
                "tokens_at_end": round(at_end),
                "curve_valid": curve.valid,
                "predicted_agreement": round(alpha, 4),
                "predicted_speedup": round(cost.optimistic_speedup(c, alpha), 4),
            }
        )
    return sorted(out, key=lambda x: -x["predicted_speedup"])


def focus(pilots: dict[str, tuple[float, list[dict]]], minutes: float, prerank: bool = False) -> dict:
    """The decision after the pilots (`rank`): the ranking, and the cut to train on for `minutes` (None when even the
    first-ranked one is not predicted to pay by then: the minutes are saved). Cuts ranked untrained (`prerank`: no pilot
    trained, no curve yet) give the first-ranked all the minutes, as a single cut would get them."""
    ranking = rank(pilots, minutes)
    first = ranking[0] if ranking and (prerank or ranking[0]["predicted_speedup"] > 1.0) else None
    return {"ranking": ranking, "chosen": first and first["name"], "minutes": round(minutes, 3), "prerank": prerank}


def passed_over(decision: dict | None) -> set[str]:
    """The cuts a ranking before training did not choose (`focus` with `prerank`): measured, never trained, so left
    out of every later stage."""
    if not decision or not decision.get("prerank"):
        return set()
    return {x["name"] for x in decision["ranking"]} - {decision["chosen"]}
