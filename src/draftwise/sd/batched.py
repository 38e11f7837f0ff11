"""Batched autoregressive decoding of many prompts at once: how draftwise makes target-generated data
(calibration for pruning, distillation data, reference continuations for agreement).

Prompts are left-padded to one length and each row's keys start at its first real token (`start`), so a batch of
B rows costs about one decoding step per token for all of them: on a CPU the weights are read once per step
whatever B is. Rows that reach EOS stop growing; the batch ends when every row has.
"""

from __future__ import annotations

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
    params: SamplingParams,
    max_new_tokens: int,
    generator: torch.Generator,
    eos: frozenset[int] = frozenset(),
    topk: int = 0,
    pad_id: int = 0,
) -> list[Continuation]:
    """Continue every prompt; with `topk` > 0 also keep the model's top-k distribution at each new position."""
    B, L = len(prompts), max(len(p) for p in prompts)
    start = [L - len(p) for p in prompts]
    ids = torch.tensor([[pad_id] * s + p for s, p in zip(start, prompts)], device=lm.device)  # [B, L]
    lm.reset(B, L + max_new_tokens)
    logits = lm.forward(ids, 0, 1, start)[:, -1].float()  # [B, V]
    out = [Continuation() for _ in prompts]
    live = list(range(B))
    for step in range(max_new_tokens):
        if topk:
            top = torch.softmax(logits, -1).topk(topk, dim=-1)  # [B, k]
        if params.greedy:
            tokens = argmax(logits)
        else:
            tokens = sample(probs(logits, params), generator)  # [B]
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
