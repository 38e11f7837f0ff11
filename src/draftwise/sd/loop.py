"""The decoding loop: speculative decoding (SD) with an independent drafter, and plain autoregressive (AR) decoding
as the same loop with no drafter (γ = 0: every round is one target step that emits its bonus token).

Models are `sd.roles.LM`s: `reset(batch, max_len)`, `forward(ids [1, T], pos, n_logits) -> [1, n, V]`,
`vocab_size` and `device` (the lean engine, transformers and llama.cpp alike). A `Context` tracks how many leading
tokens of the sequence a model's cache holds; it feeds a model whatever it has not seen yet, so prefill, catch-up
after a fully accepted round and the verify pass are the same call, and rollback is a smaller length. Drafters (a
model, a lookup, a hybrid: see `sd.drafters`, built from specs by `sd.families`) sit behind one session interface
(`sd.roles.Session`): each round they propose up to γ tokens, then keep what is final.

Prefill takes the prompt but its last token, in both methods alike; every generated token's logits then come from
a pass of at most γ+1 tokens. On the CPU fast path those passes compute each row exactly as a one-token step does,
so greedy SD reproduces greedy AR bit for bit rather than up to rounding.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..errors import DraftwiseError
from ..timing import sync
from .drafters import Context, as_drafter
from .roles import LM, Draft, Drafter
from .sampling import SamplingParams, argmax, probs
from .verify import Verdict, verify, verify_greedy, verify_synthetic


@dataclass(frozen=True)
class Round:
    """One target verify call: what was drafted, kept and emitted, and where the time went."""

    drafted: int  # γ of this round (smaller near max_new_tokens; 0 for an AR step)
    accepted: int  # drafted tokens kept
    emitted: int  # tokens appended to the output (accepted + 1, less any cut after EOS / max_new_tokens)
    draft_s: float  # drafter forwards + drawing the drafts (a lookup: the proposal)
    verify_s: float  # target forward + the acceptance test + drawing the recovered/bonus token
    source: str = ""  # who proposed: "model" | "lookup" ("" when nothing was drafted)
    schedule: dict | None = None  # with a round scheduler: its decision and observations (see `sd.schedule`)

    def record(self) -> dict:
        """The round as a record's entry (what a scheduler's calibration reads back): its set fields."""
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Generation:
    tokens: list[int]  # the new tokens only
    rounds: list[Round] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the whole call, prefill included
    prefill_s: float = 0.0
    prompt_tokens: int = 0


def one_hot(tokens: list[int], size: int, device) -> torch.Tensor:
    """q of a lookup's proposal: all mass on each proposed token ([g, V])."""
    q = torch.zeros(len(tokens), size, device=device)
    q[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)] = 1.0
    return q


def settle(
    draft: Draft,
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    room: int,
    eos: frozenset[int],
    synthetic_alpha: float | None = None,
) -> tuple[Verdict, list[int]]:
    """A round's verdict from the target's logits [g+1, V] over the pending token and the drafts, and the tokens it
    emits: the accepted drafts and the recovered/bonus token, at most `room` of them, cut after an EOS.
    `synthetic_alpha` replaces the acceptance test by a coin of that bias (see `verify_synthetic`)."""
    drafts = draft.tokens
    if synthetic_alpha is not None:
        verdict = verify_synthetic(len(drafts), argmax(logits).tolist(), synthetic_alpha, generator)
    elif params.greedy:
        verdict = verify_greedy(drafts, argmax(logits).tolist())
    else:
        q = (
            one_hot(drafts, logits.shape[-1], logits.device)
            if draft.qs is None
            else torch.stack(draft.qs)
            if draft.qs
            else logits[:0].float()
        )  # [g, V]
        drafted = torch.tensor(drafts, dtype=torch.long, device=logits.device)
        verdict = verify(drafted, q, probs(logits, params), generator)
    new = (drafts[: verdict.accepted] + [verdict.next_token])[:room]
    return verdict, new[: next((i + 1 for i, t in enumerate(new) if t in eos), len(new))]  # stop after EOS


def generate(
    target: LM,
    prompt: list[int],
    params: SamplingParams,
    max_new_tokens: int,
    generator: torch.Generator,
    drafter: Drafter | LM | None = None,
    gamma: int = 0,
    eos: frozenset[int] = frozenset(),
    stop_below: float = 0.0,
    synthetic_alpha: float | None = None,
    scheduler=None,
    stream: Callable[[list[int]], bool] | None = None,
) -> Generation:
    """Decode up to `max_new_tokens` after `prompt`: SD with `drafter` (a drafter of `sd.drafters`, or a bare LM)
    and lookahead `gamma` (a lookup drafter proposes up to γ), or AR without.

    Adaptive lookahead: with `stop_below` > 0 a round stops drafting early once the drafter gives its own token a
    probability below it (γ is then the most per round). The choice depends on the drafter's side only, so
    verification stays exact. `synthetic_alpha` (cost measurement, not lossless): see `verify_synthetic`.
    `scheduler` (an `sd.schedule.Scheduler`): each proposal is cut to the prefix its verify curve and calibrated
    confidence price best (possibly none: a plain step), decided before the target's pass, so still lossless.
    `stream` is called with each round's new tokens as soon as they are final; when it returns True (a client that
    left, a stop string reached) the generation ends after that round."""
    if not prompt:
        raise DraftwiseError("empty prompt: nothing to condition on")
    if drafter is not None and gamma < 1:
        raise DraftwiseError(f"gamma (lookahead) must be >= 1 with a drafter, got {gamma}")
    drafter = as_drafter(drafter)
    gamma = gamma if drafter is not None else 0
    dev = target.device
    max_len = len(prompt) + max_new_tokens + gamma + 1
    p_ctx = Context(target, target.vocab_size)
    target.reset(1, max_len)
    seq, out = list(prompt), Generation([], prompt_tokens=len(prompt))
    sync(dev)
    start = time.perf_counter()
    if len(prompt) > 1:
        p_ctx.feed(prompt[:-1], 0)
    session = drafter.start([prompt], max_len, target.vocab_size) if drafter is not None else None
    plans = scheduler.start() if scheduler is not None and drafter is not None else None
    sync(dev)
    out.prefill_s = time.perf_counter() - start
    while len(out.tokens) < max_new_tokens and not (out.tokens and out.tokens[-1] in eos):
        t_round = time.perf_counter()
        g = min(gamma, max_new_tokens - len(out.tokens) - 1)  # never draft past max_new_tokens
        draft = session.propose({0: seq}, g, params, generator, stop_below)[0] if g > 0 else Draft()
        draft, plan = plans.plan(draft) if plans is not None and draft.tokens else (draft, None)
        sync(dev)
        t_drafted = time.perf_counter()
        # verify: one target pass over the pending token and the drafts -> g+1 distributions
        g = len(draft.tokens)
        logits = p_ctx.feed(seq[p_ctx.length :] + draft.tokens, g + 1)  # [g+1, V]
        verdict, new = settle(draft, logits, params, generator, max_new_tokens - len(out.tokens), eos, synthetic_alpha)
        decided = plans.observe(plan, logits, params, verdict.accepted, len(new)) if plan is not None else None
        seq += new
        out.tokens += new
        # the caches keep only what is now part of the sequence; its last token is fed next round
        p_ctx.keep(len(seq) - 1)
        if session is not None:
            session.keep(0, len(seq) - 1)
        sync(dev)
        out.rounds.append(
            Round(
                g,
                verdict.accepted,
                len(new),
                t_drafted - t_round,
                time.perf_counter() - t_drafted,
                draft.source if g else "",
                decided,
            )
        )
        if stream is not None and stream(new):
            break
    out.seconds = time.perf_counter() - start
    return out
