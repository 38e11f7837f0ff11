"""Lookup drafters: proposals looked up in text instead of computed by a model (no weights, ~0 cost per round).

  ngram   prompt lookup over the request itself (vLLM `ngram`, transformers `prompt_lookup_num_tokens`): the longest
          final n-gram (max_n..min_n) found earlier in prompt + output; the tokens after its latest occurrence.
  suffix  SuffixDecoding (vLLM `suffix`): the request's own n-gram index, plus a `SuffixTrie` over a corpus of the
          target's earlier outputs (gen-data continuations of `train` prompts; optionally outputs of requests already
          finished in the same run). The longer match wins (the request on ties); a proposal is at most
          floor(factor · match length) tokens, and from the corpus it stops once the path's estimated probability
          falls below min_prob.

Both are `sd.roles.Proposer`s: `LookupSession` turns any proposer into a drafter session, so a new lookup family
needs only its proposer (see `sd.families`). A session holds one index per row (batched SD indexes each row on its
own). Rows are indexed with committed tokens only: proposals are never written into an index, so `keep` has nothing
to roll back in the loop; the index supports truncation anyway and stays exact under it (tests check it against a
brute-force search).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .drafters import Draft, bucket, length_bucket
from .ngram import NgramIndex
from .roles import Proposer, Signal
from .suffix import SuffixTrie


@dataclass(frozen=True)
class NgramDrafter:
    """`ngram[:min=1,max=4]`."""

    min_n: int = 1
    max_n: int = 4
    kind = "lookup"

    def index(self) -> NgramIndex:
        return NgramIndex(self.min_n, self.max_n)

    def start(
        self, prompts: list[list[int]], slots: int = 0, vocab_size: int = 0, batched: bool = False
    ) -> LookupSession:
        return LookupSession(self, prompts)

    def propose(self, index: NgramIndex, gamma: int) -> tuple[list[int], list[Signal]]:
        """Up to γ tokens and, per token, its confidence signal (`own_signals`)."""
        m = index.match()
        if not m or gamma < 1:
            return [], []
        tokens = index.continuation(m[1], gamma)
        return tokens, own_signals(index, m[0], tokens)

    def settings(self) -> dict:
        return {"method": "ngram", "min": self.min_n, "max": self.max_n}


class SuffixDrafter:
    """`suffix[:<corpus>][,depth=32,factor=1,min_prob=0.1,max_n=8,learn=0]`."""

    kind = "lookup"

    def __init__(
        self,
        trie: SuffixTrie | None = None,
        factor: float = 1.0,
        min_prob: float = 0.1,
        max_n: int = 8,
        learn: bool = False,
        depth: int = 32,
    ):
        self.trie = trie if trie is not None else SuffixTrie(depth)
        self.factor, self.min_prob, self.max_n, self.learn = factor, min_prob, max_n, learn
        self.learned: dict[str, int] = {}  # prompt id -> corpus id of its observed output (learn=1)

    def index(self) -> NgramIndex:
        return NgramIndex(1, self.max_n)

    def start(
        self, prompts: list[list[int]], slots: int = 0, vocab_size: int = 0, batched: bool = False
    ) -> LookupSession:
        return LookupSession(self, prompts)

    def limit(self, matched: int, gamma: int) -> int:
        return min(gamma, math.floor(self.factor * matched + 1e-9))

    def propose(self, index: NgramIndex, gamma: int) -> tuple[list[int], list[Signal]]:
        """Up to γ tokens and, per token, its confidence signal: the request's own (`own_signals`), or the corpus
        match length and the count share of each step's continuation among its siblings."""
        own = index.match()
        n = own[0] if own else 0
        m, node = self.trie.longest_match(index.tokens, self.trie.depth - gamma) if self.trie.root.count else (0, None)
        if own and n >= m:  # the request itself: its latest occurrence, copied
            tokens = index.continuation(own[1], self.limit(n, gamma))
            return tokens, own_signals(index, n, tokens)
        if m:
            shares: list[float] = []
            tokens = self.trie.continuation(node, m, self.limit(m, gamma), self.min_prob, shares)[0]
            return tokens, [f"corpus|m{length_bucket(m)}|s{bucket(s)}" for s in shares]
        return [], []

    def observe(self, prompt_id: str, output: list[int]) -> None:
        """A finished request's output joins the corpus (learn=1); a prompt decoded again replaces its old output."""
        if not self.learn:
            return
        self.forget(prompt_id)
        self.learned[prompt_id] = self.trie.add(output)

    def forget(self, prompt_id: str) -> None:
        """Leave a prompt's own earlier output out of the corpus (before that prompt is decoded again)."""
        if prompt_id in self.learned:
            self.trie.remove(self.learned.pop(prompt_id))

    def settings(self) -> dict:
        return {
            "method": "suffix",
            "depth": self.trie.depth,
            "factor": self.factor,
            "min_prob": self.min_prob,
            "max_n": self.max_n,
            "learn": self.learn,
            "corpus_sequences": self.trie.sequences,
            "corpus_tokens": self.trie.tokens,
        }


def own_signals(index: NgramIndex, n: int, tokens: list[int]) -> list[Signal]:
    """The request's own match: its length and how often the matched n-gram's earlier occurrences were followed by
    the proposed first token (one signal for the whole run)."""
    agree = index.agreement(n, tokens[0]) if tokens else 0.0
    return [f"own|n{length_bucket(n)}|g{bucket(agree)}"] * len(tokens)


class LookupSession:
    def __init__(self, drafter: Proposer, prompts: list[list[int]]):
        self.drafter = drafter
        self.rows = []
        for prompt in prompts:
            index = drafter.index()
            index.extend(prompt)
            self.rows.append(index)

    def propose(
        self, seqs: dict[int, list[int]], gamma: int, params=None, generator=None, stop_below: float = 0.0
    ) -> dict[int, Draft]:
        out = {}
        for b, seq in seqs.items():
            index = self.rows[b]
            index.extend(seq[len(index) :])  # the tokens emitted since the last round
            tokens, signals = self.drafter.propose(index, gamma) if gamma > 0 else ([], [])
            out[b] = Draft(tokens, None, "lookup", signals)
        return out

    def keep(self, row: int, length: int) -> None:
        self.rows[row].truncate(length)
