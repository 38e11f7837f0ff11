"""The design's target, read once: `target_of(config)` is the `targets.spec.Target` its `--target` names (its kind,
the GGUF file it is if one, whether its weights are random, its config without loading it), kept for every phase
that asks (the study's precision, the rows it can have, the verdicts): the spec is parsed once a process. The loaded
target's weights are put down while stages that load their own run (`put_down`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from .. import memory
from ..runtimes.base import Model
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


@contextmanager
def put_down(model: Model, load: Callable[[], Model]) -> Iterator[None]:
    """The design's loaded target without its weights inside the block, `load()`'s after it: the stages that build
    drafters (gen-data, teacher, prune, distill) each load the target they need, so the design's own copy (2.4 GB at
    q4 for the 1.5B) would only stack on their peaks. Loading it again costs seconds (its pack:
    `runtimes.lean.packed`); a block that raises leaves them down (the design ends there)."""
    model.lm = None
    memory.release()
    yield
    model.lm = load().lm
