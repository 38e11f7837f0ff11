"""Reduced-vocabulary draft heads (as FR-Spec): the drafter scores only the N tokens the target emits most.

Why: a small drafter's LM head (49,152 × 576 for the default target) is most of its step on a CPU. Restricting the
*drafter's* head keeps SD lossless: the target still verifies over its full vocabulary, the drafter's q is its softmax
over the kept ids and 0 elsewhere, and the acceptance test min(1, p/q) with the recovered distribution
norm(max(0, p − q)) is exact for any q (tokens outside the kept set are simply never drafted).

The id map (draft id i ↔ target id ids[i]) lives beside the weights in `draft_vocab.json`; the input embedding stays
full, so the drafter reads every target token. Such a checkpoint runs in the draftwise engine; the full-vocabulary
checkpoint it came from is what other tools load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..errors import DraftwiseError

MAP_FILE = "draft_vocab.json"


def hot_vocab(shards: list[dict], size: int, vocab_size: int, special_ids=()) -> list[int]:
    """The `size` target ids with the most expected emissions in gen-data rows (the target's top-k probabilities
    summed over every generated position), plus the special tokens, plus the next hottest up to a multiple of 8
    (the C kernel's row blocking; a ragged head falls back to a much slower GEMM); sorted ascending."""
    if size < 1:
        raise DraftwiseError(f"draft vocabulary size must be >= 1, got {size}")
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    for row in shards:
        mass.index_add_(0, row["topk_ids"].reshape(-1), row["topk_probs"].reshape(-1).double())
    special = sorted({int(i) for i in special_ids if i is not None and 0 <= i < vocab_size})
    order = [i for i in torch.argsort(-mass, stable=True).tolist() if i not in special]  # ties: the smaller id first
    total = min(vocab_size, -(-(size + len(special)) // 8) * 8)  # a multiple of 8 rows keeps the CPU GEMM kernel
    return sorted(set(special) | set(order[: total - len(special)]))


def slice_head(config, state_dict: dict[str, torch.Tensor], ids: list[int]):
    """Config and weights with the LM head cut to rows `ids` (untied: the input embedding keeps every row)."""
    head = state_dict["model.embed_tokens.weight"] if config.tie_word_embeddings else state_dict["lm_head.weight"]
    sub = config.__class__.from_dict(config.to_dict())
    sub.tie_word_embeddings = False
    out = dict(state_dict)
    out["lm_head.weight"] = head[torch.tensor(ids)].contiguous()  # [N, D]
    return sub, out


def write_map(path: Path, ids: list[int], vocab_size: int) -> None:
    (Path(path) / MAP_FILE).write_text(json.dumps({"target_vocab_size": vocab_size, "ids": ids}) + "\n")


def read_map(path: Path) -> tuple[list[int], int] | None:
    file = Path(path) / MAP_FILE
    if not file.exists():
        return None
    m = json.loads(file.read_text())
    ids = m["ids"]
    if sorted(set(ids)) != ids or not ids or ids[-1] >= m["target_vocab_size"] or ids[0] < 0:
        raise DraftwiseError(f"{file}: ids must be distinct, sorted and inside the target vocabulary")
    return ids, m["target_vocab_size"]
