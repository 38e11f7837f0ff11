"""Log-likelihood task accuracy: the score is the definition, items come from the eval split only."""

from __future__ import annotations

import torch

from draftwise import data
from draftwise.runtimes.registry import load
from draftwise.stages import accuracy


def test_loglik_is_the_sum_of_continuation_log_probs(tiny_dir):
    target = load(tiny_dir)
    context, continuation = [1, 5, 9, 12], [7, 3, 30]
    got = accuracy.loglik(target.lm, context, continuation)
    with torch.no_grad():
        logits = target.hf_model()(torch.tensor([context + continuation])).logits[0].float()  # [T, V]
    logp = torch.log_softmax(logits, -1)
    want = sum(float(logp[len(context) - 1 + i, t]) for i, t in enumerate(continuation))
    assert abs(got - want) < 1e-4


def test_score_picks_the_most_likely_choice(tiny_dir):
    target = load(tiny_dir)
    item = accuracy.Item("x", [1, 5, 9], [[7], [8], [30]], answer=2)
    rec = accuracy.score(target.lm, item)
    assert rec["correct"] == int(max(range(3), key=rec["scores"].__getitem__) == 2)
    assert accuracy.accuracy([{"correct": 1}, {"correct": 0}]) == 0.5


def test_hellaswag_items_are_eval_split_and_split_at_the_shared_context():
    pairs = {r["id"]: r for r in accuracy._hellaswag_pairs()}
    assert len(pairs) == 400

    class Tok:  # whitespace tokens: the shared context ends where the two endings part
        vocab: dict = {}

        def encode(self, text, add_special_tokens=True):
            return [self.vocab.setdefault(w, len(self.vocab)) for w in text.split()]

    class Target:
        tokenizer = Tok()

    items = accuracy.items("hellaswag", Target(), limit=1000)
    assert items and all(data.split_of(pairs[it.id]["correct"]) == "eval" for it in items)
    it = items[0]
    assert it.context + it.choices[0] == Tok().encode(pairs[it.id]["correct"]) and it.answer == 0
