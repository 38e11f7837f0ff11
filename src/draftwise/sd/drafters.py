"""Drafters: whatever proposes tokens for the target to verify, behind one small interface (`sd.roles.Drafter`).

  drafter.start(prompts, slots, vocab_size, batched) -> Session     one per generate() call; indexes / prefills
  session.propose(seqs, γ, params, generator, stop_below) -> {row: Draft}
  session.keep(row, length)                                        the row's first `length` tokens are final

`seqs` maps each active row to its sequence so far (prompt + emitted tokens); a row may get an empty Draft (nothing to
propose: the round is a plain AR step). `keep` is called after every round with the tokens any drafter could have
seen that are now final (the sequence but its newest token); a drafter drops whatever it holds beyond them.

Kinds (the glossary's; each spec family that builds them is a module of `sd.families`):
  model    `ModelDrafter`: γ serial forwards of a small LM, each token drawn from its q (kept for the acceptance test).
  lookup   `NgramDrafter`, `SuffixDrafter` (sd/lookup.py): no weights; one call proposes a run of up to γ tokens,
           and q is one-hot on each proposed token (Draft.qs None), so the acceptance rule — accept x with
           probability p(x), else draw from norm(p without x) — stays exact.
  hybrid   `HybridDrafter`: the lookup's proposal where it has one, the model's steps elsewhere, so the model's cost
           is paid only where the lookup has nothing.
"""

from __future__ import annotations

import torch

from ..errors import DraftwiseError
from .roles import LM, Draft, Drafter, Session
from .rows import Rows
from .sampling import SamplingParams, argmax, probs, sample


def bucket(x: float, bins: int = 5) -> int:
    """A confidence in [0, 1] as one of `bins` equal bins."""
    return min(bins - 1, max(0, int(x * bins)))


def length_bucket(n: int) -> int:
    """A match length as 1, 2, 3, 4 (4–5), 6 (6–8) or 9 (9+): longer matches differ less."""
    return n if n <= 3 else 4 if n <= 5 else 6 if n <= 8 else 9


def match_vocab(logits: torch.Tensor, size: int) -> torch.Tensor:
    """A drafter's embedding may be padded differently from the target's: ids the target lacks get no mass."""
    v = logits.shape[-1]
    if v > size:
        return logits[..., :size]
    if v < size:
        return torch.nn.functional.pad(logits, (0, size - v), value=float("-inf"))
    return logits


class Context:
    """A batch-1 cache: the first `length` tokens of the sequence are in `lm`'s cache; `feed` appends more."""

    def __init__(self, lm: LM, vocab_size: int):
        self.lm, self.vocab_size, self.length = lm, vocab_size, 0

    def feed(self, tokens: list[int], n_logits: int) -> torch.Tensor:
        ids = torch.tensor([tokens], device=self.lm.device)
        logits = self.lm.forward(ids, self.length, n_logits)[0]  # [n, V_model]
        self.length += len(tokens)
        return match_vocab(logits, self.vocab_size)  # [n, V]

    def keep(self, length: int) -> None:
        self.length = min(self.length, length)


class _Single:
    """A `Context` seen as a batch of one row (the interface `ModelSession` drafts through)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx

    def length(self, row: int) -> int:
        return self.ctx.length

    def last_logits(self, blocks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        return {b: self.ctx.feed(block, 1)[-1] for b, block in blocks.items()}  # [V]

    def keep(self, row: int, length: int) -> None:
        self.ctx.keep(length)


class _Batched:
    """`Rows` caches (batched SD): rows not in `blocks` get nothing this forward."""

    def __init__(self, rows: Rows, batch_size: int, vocab_size: int):
        self.rows, self.batch_size, self.vocab_size = rows, batch_size, vocab_size

    def length(self, row: int) -> int:
        return self.rows.length(row)

    def last_logits(self, blocks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        logits = self.rows.feed([blocks.get(b, []) for b in range(self.batch_size)])  # [B, T, V]
        return {b: match_vocab(logits[b, len(block) - 1], self.vocab_size) for b, block in blocks.items()}

    def keep(self, row: int, length: int) -> None:
        self.rows.keep(row, min(self.rows.length(row), length))


def draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator, qs: list) -> int:
    """A draft token; under sampling its distribution q is kept in `qs` for the acceptance test."""
    if params.greedy:
        return int(argmax(logits))
    qs.append(probs(logits, params))  # [V]
    return int(sample(qs[-1], generator))


def own_prob(logits: torch.Tensor, qs: list, token: int) -> float:
    """q(token): the drafter's probability of the token it just drafted."""
    return float(qs[-1][token]) if qs else float(torch.softmax(logits.float(), -1)[token])


class ModelDrafter:
    kind = "model"

    def __init__(self, lm: LM):
        self.lm = lm

    def start(self, prompts: list[list[int]], slots: int, vocab_size: int, batched: bool = False) -> ModelSession:
        """Prefill every prompt but its last token (fed with the first draft step)."""
        if batched:
            rows = Rows(self.lm, len(prompts), slots)
            rows.feed([p[:-1] for p in prompts], logits=False)
            return ModelSession(_Batched(rows, len(prompts), vocab_size))
        if len(prompts) != 1:
            raise DraftwiseError("a batch-1 session takes one prompt")
        ctx = Context(self.lm, vocab_size)
        self.lm.reset(1, slots)
        if len(prompts[0]) > 1:
            ctx.feed(prompts[0][:-1], 0)
        return ModelSession(_Single(ctx))


class ModelSession:
    def __init__(self, cache):
        self.cache = cache

    def propose(
        self,
        seqs: dict[int, list[int]],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator,
        stop_below: float = 0.0,
    ) -> dict[int, Draft]:
        """γ serial steps for every row; the first feeds each row whatever its cache has not seen. With `stop_below`
        a row stops early once q(its own token) < stop_below (adaptive lookahead: the drafter's side only)."""
        drafts = {b: Draft([], None if params.greedy else [], "model", []) for b in seqs}
        if gamma < 1:
            return drafts
        last = self.cache.last_logits({b: seq[self.cache.length(b) :] for b, seq in seqs.items()})  # {row: [V]}
        for i in range(gamma):
            for b in list(last):
                d = drafts[b]
                d.tokens.append(draw(last[b], params, generator, d.qs))
                q = own_prob(last[b], d.qs, d.tokens[-1])
                d.features.append(f"model|q{bucket(q)}")  # q(x): the drafter's confidence in its own token
                if i == gamma - 1 or (stop_below and q < stop_below):
                    del last[b]
            if not last:
                break
            last = self.cache.last_logits({b: [drafts[b].tokens[-1]] for b in last})
        return drafts

    def keep(self, row: int, length: int) -> None:
        self.cache.keep(row, length)


class HybridDrafter:
    """The lookup's proposal (up to γ) where it has one, the model drafter's steps (up to `model_gamma`, default γ)
    elsewhere; batch 1."""

    kind = "hybrid"

    def __init__(self, model: ModelDrafter, lookup: Drafter, model_gamma: int | None = None):
        self.model, self.lookup, self.model_gamma = model, lookup, model_gamma

    def start(self, prompts: list[list[int]], slots: int, vocab_size: int, batched: bool = False) -> HybridSession:
        if batched:  # a row drafting by lookup lags in the model's cache; shared batch slots would not bound the lag
            raise DraftwiseError("hybrid drafters run at batch size 1")
        return HybridSession(
            self.model.start(prompts, slots, vocab_size),
            self.lookup.start(prompts, slots, vocab_size),
            self.model_gamma,
        )


class HybridSession:
    def __init__(self, model: ModelSession, lookup: Session, model_gamma: int | None):
        self.model, self.lookup, self.model_gamma = model, lookup, model_gamma

    def propose(self, seqs, gamma, params, generator, stop_below: float = 0.0) -> dict[int, Draft]:
        drafts = self.lookup.propose(seqs, gamma, params, generator)
        fallback = {b: seqs[b] for b, d in drafts.items() if not d.tokens}
        if fallback:  # the model catches up on whatever it has not seen (tokens the lookup proposed included)
            g = min(gamma, self.model_gamma or gamma)
            drafts.update(self.model.propose(fallback, g, params, generator, stop_below))
        return drafts

    def keep(self, row: int, length: int) -> None:
        self.model.keep(row, length)
        self.lookup.keep(row, length)


def as_drafter(drafter: Drafter | LM | None) -> Drafter | None:
    """What the loop drafts with: a drafter as it is, a bare LM (anything with `forward`) as a `ModelDrafter`."""
    if drafter is None or hasattr(drafter, "start"):
        return drafter
    return ModelDrafter(drafter)
