"""Model drafters: `DIR | FILE.gguf | layers:i,j,... | random:...` (see `runtimes.registry.load_drafter`); the drafter
is `sd.drafters.ModelDrafter`, γ serial forwards of a small LM. Every spec no other family claims is one.

Its counterparts elsewhere: vLLM's draft model (`"model": <its folder>`), transformers' assisted generation,
llama-server's `draft-simple` (`-md` the drafter written as GGUF).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from ...errors import DraftwiseError
from ...runtimes.base import Model, ModelOptions
from ...runtimes.registry import load_drafter
from ..drafters import ModelDrafter
from .base import MODEL, Builtin, Loaded, usages

PREFIXES = ("layers:", "random:")


def check(spec: str) -> None:
    """An unknown `kind:` prefix is named as such instead of failing later as a missing path."""
    head, colon, _ = spec.partition(":")
    if colon and head.isidentifier() and not spec.startswith(PREFIXES) and not Path(spec).exists():
        raise DraftwiseError(f"unknown drafter kind {head!r} in {spec!r}: use {usages()}")


class ModelFamily:
    name = MODEL
    kind = "model"
    description = "a small LM: a checkpoint, a GGUF file, some of the target's layers, or random weights"
    usage = "layers:i,j,..., random:..."
    batched = True

    def matches(self, spec: str) -> bool:
        return True  # what no other family claims (`family_of` asks this one last)

    def load(self, spec: str, target: Model | None, options: ModelOptions = ModelOptions()) -> Loaded:
        check(spec)
        model = load_drafter(spec, target, options)
        return Loaded(spec, self.kind, ModelDrafter(model.lm), model)

    def vllm(self, spec: str, gamma: int) -> dict:
        """The export's: the drafter checkpoint in the export's `drafter/` folder."""
        return {"model": "drafter", "num_speculative_tokens": gamma}

    def llama_server(self, spec: str, gamma: int, gguf: Callable[[str], Path]) -> Builtin:
        return Builtin("draft-simple", f"-md {shlex.quote(str(gguf(spec)))} --spec-draft-n-max {gamma}")


FAMILY = ModelFamily()
