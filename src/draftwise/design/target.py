"""The design's target, read once: `target_of(config)` is the `targets.spec.Target` its `--target` names (its kind,
the GGUF file it is if one, whether its weights are random, its config without loading it), kept for every phase
that asks (the study's precision, the rows it can have, the verdicts): the spec is parsed once a process."""

from __future__ import annotations

import functools

from ..runtimes.lean import bank
from ..targets.spec import Target, parse


@functools.cache
def _parsed(spec: str) -> Target:
    return parse(spec)


def target_of(config) -> Target:
    """The target a design config names (any config with a `target` field)."""
    return _parsed(config.target)


def has_q4_blocks(config) -> bool:
    """Whether the target is a GGUF file holding blocks the lean engine's q4 precision runs."""
    file = target_of(config).file
    return file is not None and bank.has_blocks(file)
