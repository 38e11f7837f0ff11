"""Task accuracy by log-likelihood (MMLU, HellaSwag): the sanity check `design` sets beside each drafter's TAR.

The paper's finding is that a drafter's task accuracy barely predicts how often the target accepts its tokens;
draftwise measures both on the same drafters so the user sees it on their own target.

  mmlu       the chat-formatted question; the choice is the answer letter (A-D) with the highest log-likelihood
  hellaswag  context + correct ending vs context + a wrong ending (two-way); the ending tokens' log-likelihood
Both use `eval`-split items only. Raw records: one per (model, task, item) with the choice scores; accuracy is derived.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.resources import files

import torch

from .. import data

TASKS = ("mmlu", "hellaswag")


@dataclass(frozen=True)
class Item:
    id: str
    context: list[int]  # token ids shared by every choice
    choices: list[list[int]]  # token ids of each choice's continuation
    answer: int


def _hellaswag_pairs() -> list[dict]:
    text = files("draftwise.data").joinpath("tasks/hellaswag_pairs.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def items(task: str, target, limit: int, split: str = "eval") -> list[Item]:
    """Up to `limit` items of `task` from `split`, tokenized for `target`; items whose choices tokenize alike are
    dropped (they cannot be told apart)."""
    tok = target.tokenizer
    out: list[Item] = []
    if task == "mmlu":
        letters = [tok.encode(letter, add_special_tokens=False) for letter in "ABCD"]
        if len({tuple(x) for x in letters}) == 4:
            for p in data.load_prompts("mmlu", split):
                out.append(Item(p.id, target.encode(p.text), letters, int(p.extra["answer"])))
    elif task == "hellaswag":
        for r in _hellaswag_pairs():
            if data.split_of(r["correct"]) != split:
                continue
            good, bad = tok.encode(r["correct"]), tok.encode(r["wrong"])
            n = _common_prefix(good, bad)
            if 0 < n < len(good) and n < len(bad):
                out.append(Item(r["id"], good[:n], [good[n:], bad[n:]], 0))
    else:
        raise ValueError(f"unknown task {task!r}")
    return out[:limit]


@torch.no_grad()
def loglik(lm, context: list[int], continuation: list[int]) -> float:
    """Σ log p(continuation | context) under `lm` (an engine model: forward(ids, pos, n_logits))."""
    ids = torch.tensor([context + continuation], device=lm.device)  # [1, T]
    n = len(continuation) + 1
    lm.reset(1, ids.shape[1])
    logits = lm.forward(ids, 0, n).float()[0, :-1]  # [n-1, V]: the positions that predict the continuation
    logp = torch.log_softmax(logits, dim=-1)
    return float(logp.gather(1, torch.tensor(continuation, device=logp.device)[:, None]).sum())


def score(lm, item: Item) -> dict:
    scores = [loglik(lm, item.context, c) for c in item.choices]
    return {
        "item": item.id,
        "scores": scores,
        "answer": item.answer,
        "correct": int(max(range(len(scores)), key=scores.__getitem__) == item.answer),
    }


def accuracy(records: list[dict]) -> float | None:
    return sum(r["correct"] for r in records) / len(records) if records else None
