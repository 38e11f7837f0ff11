"""Batched speculative decoding: B prompts drafted and verified together, each row with its own accepted length.

The round is `engine.generate`'s — γ drafter steps, one target pass over γ+1 tokens, the same acceptance rule — run
on B rows at once over `Rows` caches (shared slots, per-row positions and masks), so rows never wait on each other's
rollback. AR is the same loop without a drafter. Rows that reach EOS or `max_new_tokens` leave the batch: they get
empty blocks and no more tokens. Timing is the batch's: every row's Round carries the batch's draft and verify time.
"""

from __future__ import annotations

import time

import torch

from ..errors import DraftwiseError
from ..timing import sync
from .engine import Generation, Round, _draw, settle
from .rows import Rows
from .sampling import SamplingParams


def generate_batch_sd(target, prompts: list[list[int]], params: SamplingParams, max_new_tokens: int,
                      generator: torch.Generator, drafter=None, gamma: int = 0,
                      eos: frozenset[int] = frozenset(), synthetic_alpha: float | None = None
                      ) -> tuple[list[Generation], float]:
    """Decode every prompt; returns one Generation per row and the wall seconds of the whole batch."""
    if not prompts or not all(prompts):
        raise DraftwiseError("every prompt needs at least one token")
    gamma = gamma if drafter is not None else 0
    B, slots = len(prompts), max(map(len, prompts)) + max_new_tokens * (gamma + 1) + 2
    p_rows = Rows(target, B, slots)
    q_rows = Rows(drafter, B, slots) if drafter is not None else None
    seqs, outs = [list(p) for p in prompts], [Generation([], prompt_tokens=len(p)) for p in prompts]
    sync(target.device)
    start = time.perf_counter()
    for rows in filter(None, (p_rows, q_rows)):
        rows.feed([s[:-1] for s in seqs], logits=False)  # prefill: all but each prompt's last token
    sync(target.device)
    prefill_s = time.perf_counter() - start
    active = list(range(B))
    while active:
        t_round = time.perf_counter()
        g = min(gamma, max(max_new_tokens - len(outs[b].tokens) for b in active) - 1)
        drafts, qs = {b: [] for b in active}, {b: [] for b in active}
        if g > 0:  # γ drafter steps for all active rows; the first catches each row up on what it has not seen
            blocks = [seqs[b][q_rows.length(b):] if b in drafts else [] for b in range(B)]
            logits = q_rows.feed(blocks)  # [B, T, V]
            last = {b: logits[b, len(blocks[b]) - 1] for b in active}
            for i in range(g):
                for b in active:
                    drafts[b].append(_draw(last[b], params, generator, qs[b]))
                if i < g - 1:
                    logits = q_rows.feed([[drafts[b][-1]] if b in drafts else [] for b in range(B)])
                    last = {b: logits[b, 0] for b in active}
        sync(target.device)
        t_drafted = time.perf_counter()
        blocks = [seqs[b][p_rows.length(b):] + drafts[b] if b in drafts else [] for b in range(B)]
        logits = p_rows.feed(blocks)  # [B, g+1, V]: each active row's block is its pending token + its drafts
        settled = {}
        for b in active:
            verdict, new = settle(drafts[b], qs[b], logits[b, : g + 1], params, generator,
                                  max_new_tokens - len(outs[b].tokens), eos, synthetic_alpha)
            seqs[b] += new
            outs[b].tokens += new
            for rows in filter(None, (p_rows, q_rows)):
                rows.keep(b, min(rows.length(b), len(seqs[b]) - 1))  # the last token is fed next round
            settled[b] = (verdict.accepted, len(new))
        sync(target.device)
        t_end = time.perf_counter()
        for b, (accepted, emitted) in settled.items():  # every row of the batch waited for the whole round
            outs[b].rounds.append(Round(g, accepted, emitted, t_drafted - t_round, t_end - t_drafted))
        active = [b for b in active
                  if len(outs[b].tokens) < max_new_tokens and not (outs[b].tokens and outs[b].tokens[-1] in eos)]
    seconds = time.perf_counter() - start
    for out in outs:
        out.seconds, out.prefill_s = seconds, prefill_s
    return outs, seconds
