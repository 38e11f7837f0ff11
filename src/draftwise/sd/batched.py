"""Batched autoregressive decoding of many prompts at once: how draftwise makes target-generated data
(calibration for pruning, distillation data, reference continuations for agreement).

Prompts are left-padded to one length and each row's keys start at its first real token (`start`), so a batch of
B rows costs about one decoding step per token for all of them: on a CPU the weights are read once per step
whatever B is. Rows that reach EOS stop growing; the batch ends when every row has.

A prompt continued several ways (gen-data's temperatures: `params` a sequence) is prefilled once where the runtime
can copy a row's cache (`repeat_rows`): the prefill, not the decoding, is most of gen-data's time where prompts are
long and the CPU's matrix rate low (a 1.5B at q4 on 2 AVX2 cores: a 300-token prompt ~9 s, 96 new tokens in a batch
of 16 ~4 s a row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .sampling import SamplingParams, argmax, probs, sample


@dataclass
class Continuation:
    tokens: list[int] = field(default_factory=list)  # the new tokens (EOS included when reached)
    topk_ids: list[list[int]] = field(default_factory=list)  # per new token: the target's k most likely ids
    topk_probs: list[list[float]] = field(default_factory=list)  # and their probabilities (temperature 1, full vocab)


def generate_batch(
    lm,
    prompts: list[list[int]],
    params: SamplingParams | Sequence[SamplingParams],
    max_new_tokens: int,
    generator: torch.Generator,
    eos: frozenset[int] = frozenset(),
    topk: int = 0,
    pad_id: int = 0,
) -> list[Continuation]:
    """Continue every prompt; with `topk` > 0 also keep the model's top-k distribution at each new position. With a
    sequence of n `params`, each prompt is continued n ways: row b·n + j is prompt b at params[j]."""
    ways = [params] if isinstance(params, SamplingParams) else list(params)
    logits, start, L = prefill(lm, prompts, len(ways), max_new_tokens, pad_id)
    B = len(start)
    out = [Continuation() for _ in range(B)]
    live = list(range(B))
    for step in range(max_new_tokens):
        if topk:
            top = torch.softmax(logits, -1).topk(topk, dim=-1)  # [B, k]
        tokens = choose(logits, ways, generator)
        for b in live:
            out[b].tokens.append(int(tokens[b]))
            if topk:
                out[b].topk_ids.append(top.indices[b].tolist())
                out[b].topk_probs.append(top.values[b].tolist())
        live = [b for b in live if out[b].tokens[-1] not in eos]
        if not live or step == max_new_tokens - 1:
            break
        logits = lm.forward(tokens.view(B, 1).to(lm.device), L + step, 1, start)[:, -1].float()
    return out


def prefill(lm, prompts: list[list[int]], n: int, max_new_tokens: int, pad_id: int):
    """The left-padded prompts' pass, each prompt's row repeated `n` times after it — its cache copied where the
    runtime can (`repeat_rows`), else the repeated rows computed: (last logits [B·n, V], each row's start, L)."""
    L = max(len(p) for p in prompts)
    start = [L - len(p) for p in prompts]
    ids = torch.tensor([[pad_id] * s + p for s, p in zip(start, prompts)], device=lm.device)  # [B, L]
    shared = n > 1 and hasattr(lm, "repeat_rows")
    if n > 1 and not shared:
        ids, start = ids.repeat_interleave(n, 0), [s for s in start for _ in range(n)]
    lm.reset(len(ids), L + max_new_tokens)
    logits = lm.forward(ids, 0, 1, start)[:, -1].float()  # [B, V]
    if shared:
        lm.repeat_rows(n)
        logits, start = logits.repeat_interleave(n, 0), [s for s in start for _ in range(n)]
    return logits, start, L


def choose(logits: torch.Tensor, ways: list[SamplingParams], generator: torch.Generator) -> torch.Tensor:
    """Each row's next token, row r at ways[r mod n] (one way: every row alike, as one sampling call)."""
    if len(ways) == 1:
        return argmax(logits) if ways[0].greedy else sample(probs(logits, ways[0]), generator)
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
    for j, way in enumerate(ways):
        rows = logits[j :: len(ways)]
        tokens[j :: len(ways)] = argmax(rows) if way.greedy else sample(probs(rows, way), generator)
    return tokens
