"""Batched speculative decoding: B prompts drafted and verified together, each row with its own accepted length.

The round is `engine.generate`'s — a drafter session proposes up to γ tokens per row, one target pass over each row's
pending token and drafts, the same acceptance rule — run on B rows at once over `Rows` caches (shared slots, per-row
positions and masks), so rows never wait on each other's rollback. A model drafter steps all rows together; a lookup
drafter proposes per row from that row's own index, and a row without a proposal verifies its pending token alone.
AR is the same loop without a drafter. Rows that reach EOS or `max_new_tokens` leave the batch: they get empty
blocks and no more tokens. Timing is the batch's: every row's Round carries the batch's draft and verify time.
"""

from __future__ import annotations

import time

import torch

from ..errors import DraftwiseError
from ..timing import sync
from .drafters import Draft, as_drafter
from .loop import Generation, Round, settle
from .rows import Rows
from .sampling import SamplingParams


def generate_batch_sd(
    target,
    prompts: list[list[int]],
    params: SamplingParams,
    max_new_tokens: int,
    generator: torch.Generator,
    drafter=None,
    gamma: int = 0,
    eos: frozenset[int] = frozenset(),
    synthetic_alpha: float | None = None,
) -> tuple[list[Generation], float]:
    """Decode every prompt; returns one Generation per row and the wall seconds of the whole batch."""
    if not prompts or not all(prompts):
        raise DraftwiseError("every prompt needs at least one token")
    drafter = as_drafter(drafter)
    gamma = gamma if drafter is not None else 0
    B, slots = len(prompts), max(map(len, prompts)) + max_new_tokens * (gamma + 1) + 2
    p_rows = Rows(target, B, slots)
    seqs, outs = [list(p) for p in prompts], [Generation([], prompt_tokens=len(p)) for p in prompts]
    sync(target.device)
    start = time.perf_counter()
    p_rows.feed([s[:-1] for s in seqs], logits=False)  # prefill: all but each prompt's last token
    session = drafter.start(seqs, slots, target.vocab_size, batched=True) if drafter is not None else None
    sync(target.device)
    prefill_s = time.perf_counter() - start
    active = list(range(B))
    while active:
        t_round = time.perf_counter()
        g = min(gamma, max(max_new_tokens - len(outs[b].tokens) for b in active) - 1)
        drafts = session.propose({b: seqs[b] for b in active}, g, params, generator) if g > 0 else {}
        drafts = {b: drafts.get(b) or Draft() for b in active}
        sync(target.device)
        t_drafted = time.perf_counter()
        blocks = [seqs[b][p_rows.length(b) :] + drafts[b].tokens if b in drafts else [] for b in range(B)]
        logits = p_rows.feed(blocks)  # [B, T, V]: each active row's block is its pending token + its drafts
        settled = {}
        for b in active:
            n = len(drafts[b].tokens)
            verdict, new = settle(
                drafts[b],
                logits[b, : n + 1],
                params,
                generator,
                max_new_tokens - len(outs[b].tokens),
                eos,
                synthetic_alpha,
            )
            seqs[b] += new
            outs[b].tokens += new
            p_rows.keep(b, min(p_rows.length(b), len(seqs[b]) - 1))  # the last token is fed next round
            if session is not None:
                session.keep(b, len(seqs[b]) - 1)
            settled[b] = (n, verdict.accepted, len(new), drafts[b].source if n else "")
        sync(target.device)
        t_end = time.perf_counter()
        for b, (n, accepted, emitted, source) in settled.items():  # every row of the batch waited for the whole round
            outs[b].rounds.append(Round(n, accepted, emitted, t_drafted - t_round, t_end - t_drafted, source))
        active = [
            b
            for b in active
            if len(outs[b].tokens) < max_new_tokens and not (outs[b].tokens and outs[b].tokens[-1] in eos)
        ]
    seconds = time.perf_counter() - start
    for out in outs:
        out.seconds, out.prefill_s = seconds, prefill_s
    return outs, seconds
