"""A reduced-vocabulary drafter on the lean forward (`targets.vocab_map` says why and how its head is cut): its
logits seen through the target's vocabulary."""

from __future__ import annotations

import torch


class ReducedHead:
    """An engine model whose head scores N kept tokens, seen through the target's vocabulary: logits [.., V] with
    −inf outside the kept ids (so softmax gives them q = 0 and argmax never picks them)."""

    preallocated_cache = True  # its cache costs the same whatever it holds (`runtimes.registry.fill_cache`)

    def __init__(self, lm, ids: list[int], vocab_size: int):
        self.lm, self.vocab_size = lm, vocab_size
        self.ids = torch.tensor(ids, device=lm.device)  # [N]: target id of draft id i

    def __getattr__(self, name):  # reset, device, dtype, kv_bytes, max_len, config, ...: those of the wrapped model
        return getattr(self.lm, name)

    def forward(self, ids: torch.Tensor, pos: int, n_logits: int | None = None, start=None, **rows) -> torch.Tensor:
        small = self.lm.forward(ids, pos, n_logits, start, **rows)  # [B, n, N]
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))  # [B, n, V]
        full[..., self.ids] = small
        return full
