"""The roles the loop (`sd.loop`) and the round scheduler (`sd.schedule`) talk to, as Protocols: whatever fills a role
needs these members and nothing else.

  LM         a model's forward over its own KV cache (the target p, or a model drafter's q): the lean engine, the
             transformers fallback and llama.cpp all are one (`models`)
  Drafter    what proposes tokens for the target to verify (model, lookup, hybrid; the registry of families is
             `sd.families`); one `Session` per generate() call
  Session    the drafter's side of a call: each round it proposes up to γ tokens per row, then learns which tokens
             are final (the accepted ones and the recovered / bonus token) and drops whatever it held beyond them
  Proposer   a lookup's core: a run of up to γ tokens from its index of the sequence, each with its confidence signal
  Signal     a proposed token's confidence, as the proposer sees it: "kind|bin|bin..." from coarse to fine, e.g.
             "own|n3|g4" (the request's own n-gram: match length, agreement), "corpus|m4|s3" (a suffix corpus: match
             length, count share), "model|q2" (a model's q(x)); the scheduler calibrates acceptance per bin, each bin
             shrunk towards its coarser parent (`schedule.Calibration`), so a new proposer's signals need no table
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from .ngram import NgramIndex
from .sampling import SamplingParams

Signal = str  # "kind|bin|bin...", coarse to fine (module docstring)


@dataclass
class Draft:
    """One row's proposal for a round."""

    tokens: list[int] = field(default_factory=list)
    qs: list[torch.Tensor] | None = None  # [V] per token under sampling; None = one-hot on each token (lookup)
    source: str = ""  # "model" | "lookup": who proposed (hybrid rounds say which)
    features: list[Signal] | None = None  # per token, the proposer's confidence signal (see `sd.schedule`)


@runtime_checkable
class LM(Protocol):
    """A causal LM over a preallocated KV cache indexed by position: rollback is feeding from a smaller `pos`."""

    vocab_size: int

    @property
    def device(self) -> torch.device: ...

    def reset(self, batch_size: int, max_len: int) -> None:
        """An empty cache for `batch_size` rows of up to `max_len` positions."""

    def forward(
        self, ids: torch.Tensor, pos: int, n_logits: int | None = None, start: list[int] | None = None
    ) -> torch.Tensor:
        """ids [B, T] written at cache slots pos..pos+T-1 -> logits [B, n, V] of the last n positions (None: all)."""


class Session(Protocol):
    def propose(
        self,
        seqs: dict[int, list[int]],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator,
        stop_below: float = 0.0,
    ) -> dict[int, Draft]:
        """Up to γ tokens for each row of `seqs` (row -> its sequence so far); an empty Draft: nothing to propose."""

    def keep(self, row: int, length: int) -> None:
        """The row's first `length` tokens are final: whatever the session holds beyond them is dropped."""


@runtime_checkable
class Drafter(Protocol):
    kind: str  # model | lookup | hybrid

    def start(self, prompts: list[list[int]], slots: int, vocab_size: int, batched: bool = False) -> Session:
        """A session over these prompts (one row each); `slots`: the most positions a row reaches."""


class Proposer(Protocol):
    """A lookup drafter's core (`sd.lookup.LookupSession` keeps one index per row and asks this for proposals)."""

    def index(self) -> NgramIndex:
        """An empty index of a row's committed tokens."""

    def propose(self, index: NgramIndex, gamma: int) -> tuple[list[int], list[Signal]]:
        """Up to γ tokens continuing the indexed sequence and, per token, its confidence `Signal`."""
