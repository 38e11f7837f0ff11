"""The transformers runtime's entry in `runtimes.registry.RUNTIMES`: the lean runtime's loader and stamps, forced onto
transformers (`--backend transformers`), and no hidden states for a feature head."""

from __future__ import annotations

from ..lean.runtime import Lean


class Transformers(Lean):
    name = "transformers"
    features = False
    reduced_heads = False  # a transformers drafter's logits are over its own head


RUNTIME = Transformers()
