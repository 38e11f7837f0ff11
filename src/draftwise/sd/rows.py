"""Per-row bookkeeping of a batched model's KV cache, for batched SD where rows accept different numbers of tokens.

Every forward writes one block of T cache slots for all rows at once (slot `pos`..`pos+T-1`), but each row fills only
a prefix of its block with real tokens and owns its own RoPE positions. Keys are cached already rotated, so a slot a
row never fills, or a rejected draft's slot, is simply masked out (`key_pos` -1): no row ever has to move its cache, and
rows stay independent — each sees exactly its own tokens at their own positions, as in batch-1 decoding.
"""

from __future__ import annotations

import torch


class Rows:
    def __init__(self, lm, batch_size: int, max_slots: int):
        self.lm, self.pos = lm, 0
        lm.reset(batch_size, max_slots)
        # [B, S]: the position of the token each slot of a row holds, -1 where none (never filled, or rolled back)
        self.key_pos = torch.full((batch_size, max_slots), -1, dtype=torch.long, device=lm.device)
        self.slots: list[list[int]] = [[] for _ in range(batch_size)]  # per row: the slot of each of its tokens

    def length(self, b: int) -> int:
        """Tokens of row b in the cache."""
        return len(self.slots[b])

    def feed(self, blocks: list[list[int]], logits: bool = True) -> torch.Tensor:
        """Append blocks[b] to row b (rows may get fewer tokens, or none); logits [B, T, V] of every slot written
        (none, [B, 0, V], with `logits=False`: a prefill only fills the caches, and the LM head over every prompt
        position would cost a fifth of it)."""
        B, T = len(blocks), max(1, max(map(len, blocks)))
        ids = torch.zeros(B, T, dtype=torch.long)
        positions = torch.zeros(B, T, dtype=torch.long)
        for b, block in enumerate(blocks):
            n = self.length(b)
            ids[b, : len(block)] = torch.tensor(block, dtype=torch.long)
            positions[b] = torch.arange(n, n + T)  # unfilled slots get positions too; they are masked for others
            self.key_pos[b, self.pos : self.pos + len(block)] = torch.arange(n, n + len(block))
            self.slots[b] += range(self.pos, self.pos + len(block))
        dev = self.lm.device
        out = self.lm.forward(
            ids.to(dev), self.pos, None if logits else 0, None, positions=positions.to(dev), key_positions=self.key_pos
        )
        self.pos += T
        return out  # [B, T, V]

    def keep(self, b: int, length: int) -> None:
        """Row b keeps its first `length` tokens; the slots of the rest are masked out."""
        for slot in self.slots[b][length:]:
            self.key_pos[b, slot] = -1
        del self.slots[b][length:]
