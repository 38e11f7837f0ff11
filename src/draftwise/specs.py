"""Drafter specs: the strings `--drafter` takes, loaded into what the loop drafts with through the registry of drafter
families (`sd.families`: one module each, which also owns its spec's parsing and options).

  DIR | FILE.gguf | layers:i,j,... | random:...     a model drafter (see `runtimes.registry.load_drafter`)
  ngram[:min=1,max=4]                               prompt lookup over the request (prompt + output so far)
  suffix[:DIR][,depth=32,factor=1,min_prob=0.1,max_n=8,learn=0]
                                                    the request's n-grams plus a suffix index over the target's own
                                                    outputs: DIR is a gen-data run folder (its continuations of
                                                    `train` prompts) or a folder holding a saved corpus
  hybrid:<model spec>+<lookup spec>[,model_gamma=k]
                                                    the lookup where it has a proposal, the model (≤ k steps) elsewhere
  ... and any family a module registers (`sd.families.register`)

A spec says everything about a drafter, so run folders, grids and design records name drafters by spec alone.

What a bench may run depends on its drafter's kind, which only the registry knows (configs sit below it and validate
what needs no drafter): `check` refuses a bench config whose baselines or batch size its drafter's kind cannot run,
and `points` keeps each grid point's drafter-bound baselines where its drafter's kind runs them.
"""

from __future__ import annotations

import dataclasses

from .config import BenchConfig, BenchGridConfig
from .errors import DraftwiseError
from .runtimes.base import Model, ModelOptions
from .sd import families
from .sd.families import Loaded as Drafter
from .sd.families import drafter_kind, family_of, lookup_names
from .sd.families.hybrid import split as split_hybrid  # noqa: F401  (the stages' and design's name for it)

# baselines that run the point's own drafter, and the kind of drafter they can run
NEEDS = {"hf-assisted": "model", "llama-cpp-lookup": "lookup"}


def load(spec: str, target: Model, options: ModelOptions = ModelOptions()) -> Drafter:
    return families.load(spec, target, options)


def check(config: BenchConfig) -> None:
    """Refuse, in one line, a bench its drafter's kind cannot run (the stage calls this before its run folder)."""
    kind = drafter_kind(config.drafter) if config.drafter else None
    if "llama-cpp-lookup" in config.baselines and kind != "lookup":
        raise DraftwiseError(
            "baseline llama-cpp-lookup runs the point's lookup drafter inside llama-cpp-python: "
            f"give an {' or '.join(lookup_names())} --drafter"
        )
    if kind not in (None, "model") and "hf-assisted" in config.baselines:
        raise DraftwiseError(
            f"baseline hf-assisted needs a model drafter, not a {kind} drafter "
            "(transformers' own lookup is the baseline hf-prompt-lookup)"
        )
    family = family_of(config.drafter) if config.drafter else None
    if family is not None and not family.batched and config.batch_size > 1:
        raise DraftwiseError(f"{family.name} drafters run at batch size 1")


def points(grid: BenchGridConfig) -> list[BenchConfig]:
    """The grid's points (`BenchGridConfig.points`), each SD point's drafter-bound baselines (`NEEDS`) kept where its
    drafter's kind runs them; the grid's `rows` as they are. Every point is `check`ed."""
    out = grid.points()
    own = len(out) - len(grid.rows)
    for i, p in enumerate(out[:own]):
        if p.drafter:
            kind = drafter_kind(p.drafter)
            keep = tuple(b for b in p.baselines if NEEDS.get(b, kind) == kind)
            out[i] = p if keep == p.baselines else dataclasses.replace(p, baselines=keep)
    for p in out:
        check(p)
    return out
