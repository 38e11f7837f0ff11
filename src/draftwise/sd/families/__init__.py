"""The registry of drafter families: one module per family.

  ngram    lookup   prompt lookup over the request
  suffix   lookup   the request's n-grams plus a suffix index over the target's own outputs
  hybrid   hybrid   a lookup where it has a proposal, a model drafter elsewhere
  feature  feature  a small head on the target's own features (EAGLE-style; lean targets only)
  model    model    a small LM (checkpoint, GGUF, layers:, random:): what no other family claims

A family (`base.Family`) owns its spec (`name[:body]`), kind, description, how its drafter is built, and what the
design and the export ask of it: lookup families (`base.LookupFamily`) their tuning grid, their vLLM / transformers
snippets and their nearest llama-server built-in. The built-in families are registered here, in this order (the order
the design tunes them in and messages list them); a new family is one module that defines one and calls `register`
when imported (tests/sd/repeat_family.py is one).
"""

from __future__ import annotations

from ...errors import DraftwiseError
from ...runtimes.base import Model, ModelOptions
from ..roles import Drafter
from . import feature, hybrid, model, ngram, suffix
from .base import (
    MODEL,
    REGISTRY,
    SERIAL,
    Builtin,
    Family,
    Loaded,
    LookupFamily,
    Setting,
    drafter_kind,
    family_of,
    lookup_names,
    register,
)

for _family in (ngram.FAMILY, suffix.FAMILY, hybrid.FAMILY, feature.FAMILY, model.FAMILY):
    register(_family)

__all__ = [
    "MODEL",
    "REGISTRY",
    "SERIAL",
    "Builtin",
    "Family",
    "Loaded",
    "LookupFamily",
    "Setting",
    "drafter_kind",
    "family_of",
    "load",
    "lookup",
    "lookup_families",
    "lookup_family",
    "lookup_names",
    "register",
]


def load(spec: str, target: Model | None, options: ModelOptions = ModelOptions()) -> Loaded:
    """The drafter a spec names, with its parts (model, lookup)."""
    return family_of(spec).load(spec, target, options)


def lookup_family(spec: str) -> LookupFamily:
    family = family_of(spec)
    if family.kind != "lookup":
        raise DraftwiseError(f"{spec!r} is not a lookup drafter: give one of {', '.join(lookup_names())}")
    return family


def lookup(spec: str, target: Model | None = None) -> Drafter:
    """The lookup drafter of a lookup spec (`target`: checks the data it names against the target's tokenizer)."""
    return lookup_family(spec).lookup(spec, target)


def lookup_families() -> list[LookupFamily]:
    return [f for f in REGISTRY.values() if f.kind == "lookup"]
