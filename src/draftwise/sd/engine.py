"""The decoding loop: speculative decoding (SD) with an independent drafter, and plain autoregressive (AR) decoding
as the same loop with no drafter (γ = 0: every round is one target step that emits its bonus token).

Models are anything with `reset(batch, max_len)`, `forward(ids [1, T], pos, n_logits) -> [1, n, V]` and
`vocab_size` (see `models.LeanLlama`). A `Context` tracks how many leading tokens of the sequence a model's cache
holds; it feeds a model whatever it has not seen yet, so prefill, catch-up after a fully accepted round and the
verify pass are the same call, and rollback is a smaller length.

Prefill takes the prompt but its last token, in both methods alike; every generated token's logits then come from
a pass of at most γ+1 tokens. On the CPU fast path those passes compute each row exactly as a one-token step does,
so greedy SD reproduces greedy AR bit for bit rather than up to rounding.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..errors import DraftwiseError
from ..timing import sync
from .sampling import SamplingParams, argmax, probs, sample
from .verify import Verdict, verify, verify_greedy, verify_synthetic


@dataclass(frozen=True)
class Round:
    """One target verify call: what was drafted, kept and emitted, and where the time went."""

    drafted: int  # γ of this round (smaller near max_new_tokens; 0 for an AR step)
    accepted: int  # drafted tokens kept
    emitted: int  # tokens appended to the output (accepted + 1, less any cut after EOS / max_new_tokens)
    draft_s: float  # drafter forwards + drawing the drafts
    verify_s: float  # target forward + the acceptance test + drawing the recovered/bonus token


@dataclass
class Generation:
    tokens: list[int]  # the new tokens only
    rounds: list[Round] = field(default_factory=list)
    seconds: float = 0.0  # wall time of the whole call, prefill included
    prefill_s: float = 0.0
    prompt_tokens: int = 0


class Context:
    """The first `length` tokens of the sequence are in `lm`'s cache; `feed` appends more."""

    def __init__(self, lm, vocab_size: int):
        self.lm, self.vocab_size, self.length = lm, vocab_size, 0

    def feed(self, tokens: list[int], n_logits: int) -> torch.Tensor:
        ids = torch.tensor([tokens], device=self.lm.device)
        logits = self.lm.forward(ids, self.length, n_logits)[0]  # [n, V_model]
        self.length += len(tokens)
        return _match_vocab(logits, self.vocab_size)  # [n, V]

    def keep(self, length: int) -> None:
        self.length = min(self.length, length)


def _match_vocab(logits: torch.Tensor, size: int) -> torch.Tensor:
    """A drafter's embedding may be padded differently from the target's: ids the target lacks get no mass."""
    v = logits.shape[-1]
    if v > size:
        return logits[..., :size]
    if v < size:
        return torch.nn.functional.pad(logits, (0, size - v), value=float("-inf"))
    return logits


def _draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator, qs: list) -> int:
    """A draft token; under sampling its distribution q is kept in `qs` for the acceptance test."""
    if params.greedy:
        return int(argmax(logits))
    qs.append(probs(logits, params))  # [V]
    return int(sample(qs[-1], generator))


def _own_prob(logits: torch.Tensor, qs: list, token: int) -> float:
    """q(token): the drafter's probability of the token it just drafted."""
    return float(qs[-1][token]) if qs else float(torch.softmax(logits.float(), -1)[token])


def settle(drafts: list[int], qs: list, logits: torch.Tensor, params: SamplingParams, generator: torch.Generator,
           room: int, eos: frozenset[int], synthetic_alpha: float | None = None) -> tuple[Verdict, list[int]]:
    """A round's verdict from the target's logits [g+1, V] over the pending token and the drafts, and the tokens it
    emits: the accepted drafts and the recovered/bonus token, at most `room` of them, cut after an EOS.
    `synthetic_alpha` replaces the acceptance test by a coin of that bias (see `verify_synthetic`)."""
    if synthetic_alpha is not None:
        verdict = verify_synthetic(len(drafts), argmax(logits).tolist(), synthetic_alpha, generator)
    elif params.greedy:
        verdict = verify_greedy(drafts, argmax(logits).tolist())
    else:
        q = torch.stack(qs) if qs else logits[:0]  # [g, V]
        drafted = torch.tensor(drafts, dtype=torch.long, device=logits.device)
        verdict = verify(drafted, q, probs(logits, params), generator)
    new = (drafts[: verdict.accepted] + [verdict.next_token])[:room]
    return verdict, new[: next((i + 1 for i, t in enumerate(new) if t in eos), len(new))]  # stop after EOS


def generate(
    target,
    prompt: list[int],
    params: SamplingParams,
    max_new_tokens: int,
    generator: torch.Generator,
    drafter=None,
    gamma: int = 0,
    eos: frozenset[int] = frozenset(),
    stop_below: float = 0.0,
    synthetic_alpha: float | None = None,
) -> Generation:
    """Decode up to `max_new_tokens` after `prompt`: SD with `drafter` and lookahead `gamma`, or AR without.

    Adaptive lookahead: with `stop_below` > 0 a round stops drafting early once the drafter gives its own token a
    probability below it (γ is then the most per round). The choice depends on the drafter's side only, so
    verification stays exact. `synthetic_alpha` (cost measurement, not lossless): see `verify_synthetic`."""
    if not prompt:
        raise DraftwiseError("empty prompt: nothing to condition on")
    if drafter is not None and gamma < 1:
        raise DraftwiseError(f"gamma (lookahead) must be >= 1 with a drafter, got {gamma}")
    gamma = gamma if drafter is not None else 0
    dev = target.device
    max_len = len(prompt) + max_new_tokens + gamma + 1
    p_ctx = Context(target, target.vocab_size)
    q_ctx = Context(drafter, target.vocab_size) if drafter is not None else None
    for ctx in (p_ctx, q_ctx):
        if ctx is not None:
            ctx.lm.reset(1, max_len)
    seq, out = list(prompt), Generation([], prompt_tokens=len(prompt))
    sync(dev)
    start = time.perf_counter()
    for ctx in (p_ctx, q_ctx):
        if ctx is not None and len(prompt) > 1:
            ctx.feed(prompt[:-1], 0)
    sync(dev)
    out.prefill_s = time.perf_counter() - start
    while len(out.tokens) < max_new_tokens and not (out.tokens and out.tokens[-1] in eos):
        t_round = time.perf_counter()
        g = min(gamma, max_new_tokens - len(out.tokens) - 1)  # never draft past max_new_tokens
        drafts, qs = [], []
        if g > 0:  # draft: γ serial drafter steps, the first fed whatever the drafter has not seen yet
            logits = q_ctx.feed(seq[q_ctx.length :], 1)[-1]  # [V]
            for i in range(g):
                drafts.append(_draw(logits, params, generator, qs))
                if i == g - 1 or (stop_below and _own_prob(logits, qs, drafts[-1]) < stop_below):
                    break
                logits = q_ctx.feed([drafts[-1]], 1)[-1]
            g = len(drafts)
        sync(dev)
        t_drafted = time.perf_counter()
        # verify: one target pass over the pending token and the drafts -> γ+1 distributions
        logits = p_ctx.feed(seq[p_ctx.length :] + drafts, g + 1)  # [g+1, V]
        verdict, new = settle(drafts, qs, logits, params, generator, max_new_tokens - len(out.tokens), eos, synthetic_alpha)
        seq += new
        out.tokens += new
        # the caches keep only what is now part of the sequence; its last token is fed next round
        p_ctx.keep(len(seq) - 1)
        if q_ctx is not None:
            q_ctx.keep(len(seq) - 1)
        sync(dev)
        out.rounds.append(Round(g, verdict.accepted, len(new), t_drafted - t_round, time.perf_counter() - t_drafted))
    out.seconds = time.perf_counter() - start
    return out
