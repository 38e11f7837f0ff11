"""`hybrid:<model spec>+<lookup spec>[,model_gamma=k]`: the lookup's proposal where it has one, the model drafter
(at most k steps; a model or a feature head: a drafter that drafts in serial steps) elsewhere; batch 1 (the drafter
is `sd.drafters.HybridDrafter`). Any registered lookup family may be its lookup part; its counterparts elsewhere are
its two parts' (llama-server tries them in turn).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...errors import DraftwiseError
from ...runtimes.base import Model, ModelOptions
from ..drafters import HybridDrafter
from .base import SERIAL, Builtin, Loaded, drafter_kind, family_of, lookup_names


def split(spec: str) -> tuple[str, str, int | None]:
    """`hybrid:MODEL+LOOKUP[,model_gamma=k]` -> (MODEL, LOOKUP, k)."""
    body = spec.removeprefix("hybrid:")
    names = lookup_names()
    cut = max(body.rfind("+" + name) for name in names)
    if cut <= 0:
        raise DraftwiseError(f"bad drafter spec {spec!r}: expected hybrid:<model drafter>+<{'|'.join(names)} spec>")
    model, lookup = body[:cut], body[cut + 1 :]
    gamma = None
    if ",model_gamma=" in lookup:
        lookup, _, value = lookup.partition(",model_gamma=")
        try:
            gamma = int(value)
        except ValueError:
            raise DraftwiseError(f"bad drafter spec {spec!r}: model_gamma takes an integer") from None
        if gamma < 1:
            raise DraftwiseError(f"bad drafter spec {spec!r}: model_gamma must be >= 1")
    if drafter_kind(model) not in SERIAL:
        raise DraftwiseError(f"bad drafter spec {spec!r}: the part before '+' must be a model or feature drafter")
    return model, lookup, gamma


def compose(model: str, lookup: str, model_gamma: int | None = None) -> str:
    """The spec of a hybrid of these parts (`split`'s inverse)."""
    return f"hybrid:{model}+{lookup}" + (f",model_gamma={model_gamma}" if model_gamma else "")


class Hybrid:
    name = "hybrid"
    kind = "hybrid"
    description = "a lookup where it has a proposal, a model drafter's steps elsewhere"
    usage = "hybrid:<model>+<lookup>"
    batched = False  # a row drafting by lookup lags in the model's cache (`HybridDrafter`)

    def matches(self, spec: str) -> bool:
        return spec.startswith("hybrid:")

    def load(self, spec: str, target: Model | None, options: ModelOptions = ModelOptions()) -> Loaded:
        model_spec, lookup_spec, gamma = split(spec)
        model = family_of(model_spec).load(model_spec, target, options)
        lookup = family_of(lookup_spec).lookup(lookup_spec, target)
        return Loaded(spec, self.kind, HybridDrafter(model.loop_drafter, lookup, gamma), model.model, lookup)

    def vllm(self, spec: str, gamma: int) -> dict:
        """The model part's (vLLM runs one method per request; the lookup part's is exported beside it)."""
        model, _, model_gamma = split(spec)
        return family_of(model).vllm(model, model_gamma or gamma)

    def llama_server(self, spec: str, gamma: int, gguf: Callable[[str], Path]) -> Builtin:
        model, lookup, model_gamma = split(spec)
        first = family_of(lookup).llama_server(lookup, gamma, gguf)
        then = family_of(model).llama_server(model, model_gamma or gamma, gguf)
        return Builtin(f"{first.type},{then.type}", f"{first.args} {then.args}")


FAMILY = Hybrid()
