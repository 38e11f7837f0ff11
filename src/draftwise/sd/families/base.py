"""What a drafter family is, the registry of them, and what their specs share.

A family owns one spec head (`name[:body]`): its parsing, its kind (model | lookup | hybrid), a one-line description,
building the drafter, and what the rest of draftwise asks about it — the settings `design` tunes (lookups), the
export's snippets (vLLM's `speculative_config`, transformers' call), and its nearest built-in per deployment engine
(llama-server's `--spec-type` and arguments; vLLM's method). Nothing elsewhere branches on a family's name: it asks
the registry (`family_of`), so a new family is one module that calls `register` (the package registers the built-in
ones).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ...errors import DraftwiseError
from ...runtimes.base import Model, ModelOptions
from ...runtimes.registry import describe as describe_model
from ..roles import Drafter

MODEL = "model"  # the family of model drafters: every spec no other family claims
SERIAL = ("model", "feature")  # kinds that spend one serial step per drafted token (lookups propose a run at once)
NGRAM_MIN, NGRAM_MAX = 1, 4  # prompt lookup's n-gram lengths by default (draftwise's, and its vLLM export's)


@dataclass
class Loaded:
    """A loaded drafter: what the loop drafts with, and its parts."""

    spec: str
    kind: str  # model | lookup | hybrid | feature
    loop_drafter: Drafter  # what the loop drafts with (`sd.roles.Drafter`)
    model: Model | None = None  # the model part (transformers baselines, shapes, accuracy)
    lookup: Drafter | None = None  # the lookup part

    def describe(self) -> dict:
        out = {"spec": self.spec, "kind": self.kind}
        if self.model is not None:
            out.update(describe_model(self.model))
            out["spec"] = self.spec
        if self.lookup is not None:
            out["lookup"] = self.lookup.settings()
        return out


@dataclass(frozen=True)
class Builtin:
    """A deployment engine's own method nearest to a draftwise drafter: llama-server's `--spec-type TYPE ARGS`."""

    type: str  # e.g. ngram-simple, draft-simple, or several joined by ','
    args: str = ""

    def command(self) -> str:
        return f"--spec-type {self.type} {self.args}".strip()


@dataclass(frozen=True)
class Setting:
    """One point of a lookup family's tuning grid: its spec, the settings it varies (tune.json), its drafter."""

    spec: str
    settings: dict
    drafter: Drafter


class Family(Protocol):
    name: str  # the spec's head
    kind: str  # model | lookup | hybrid | feature
    description: str  # one line
    usage: str  # the spec's form, as an error message lists it
    batched: bool  # whether batched SD can run it (False: batch size 1 only)

    def matches(self, spec: str) -> bool: ...

    def load(self, spec: str, target: Model | None, options: ModelOptions = ModelOptions()) -> Loaded: ...

    def vllm(self, spec: str, gamma: int) -> dict:
        """vLLM's `speculative_config` nearest to the spec at lookahead γ."""

    def llama_server(self, spec: str, gamma: int, gguf: Callable[[str], Path]) -> Builtin:
        """llama-server's nearest built-in; `gguf(model spec)`: the drafter written as GGUF for that server."""


REGISTRY: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add (or replace) a family: the registry's only entry point, called once by each family's module."""
    REGISTRY[family.name] = family
    return family


def family_of(spec: str) -> Family:
    """The family whose head `spec` has; model drafters (paths, layers:, random:) are what no other family claims."""
    return next((f for n, f in REGISTRY.items() if n != MODEL and f.matches(spec)), REGISTRY[MODEL])


def drafter_kind(spec: str) -> str:
    """model | lookup | hybrid | feature, from a drafter spec's text alone."""
    return family_of(spec).kind


def lookup_names() -> list[str]:
    return [n for n, f in REGISTRY.items() if f.kind == "lookup"]


def usages() -> str:
    """Every spec form, for an error message."""
    forms = (
        ["a checkpoint folder", "a .gguf file"]
        + [REGISTRY[MODEL].usage]
        + [f.usage for n, f in REGISTRY.items() if n != MODEL]
    )
    return ", ".join(forms[:-1]) + " or " + forms[-1]


def head(spec: str) -> str:
    return spec.split(":", 1)[0].split(",", 1)[0]


def body(spec: str, name: str) -> str:
    """What follows the name: `ngram:min=2` and `ngram,min=2` both give `min=2`."""
    rest = spec[len(name) :]
    return rest[1:] if rest[:1] in (":", ",") else rest


def options(text: str, allowed: dict[str, type], spec: str) -> dict:
    """`k=v,...` typed by `allowed`; an unknown option or a bad value is named in one line."""
    out = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in allowed:
            raise DraftwiseError(f"bad drafter spec {spec!r}: unknown option {item!r} (options: {', '.join(allowed)})")
        try:
            out[key] = allowed[key](value) if allowed[key] is not bool else value.lower() in ("1", "true", "yes")
        except ValueError:
            raise DraftwiseError(
                f"bad drafter spec {spec!r}: {key} takes a {allowed[key].__name__}, got {value!r}"
            ) from None
    return out


class LookupFamily:
    """A lookup family's defaults (`Family`, kind lookup): a subclass gives `name`, `description` and `lookup`; the rest
    defaults to the nearest generic counterpart — prompt lookup over the request (vLLM `ngram`, llama-server
    `ngram-simple`, transformers' `prompt_lookup_num_tokens`) — and a tuning grid of its default settings alone."""

    name = ""
    kind = "lookup"
    description = ""
    batched = True
    where = "earlier in the request (prompt + output so far)"  # the export README: where proposals are looked up

    @property
    def usage(self) -> str:
        return f"{self.name}[:...]"

    def matches(self, spec: str) -> bool:
        return head(spec) == self.name

    def lookup(self, spec: str, target: Model | None = None) -> Drafter:
        """The drafter of a spec; `target` checks data the spec names (a corpus) against its tokenizer."""
        raise NotImplementedError

    def load(self, spec: str, target: Model | None, options: ModelOptions = ModelOptions()) -> Loaded:
        drafter = self.lookup(spec, target)
        return Loaded(spec, self.kind, drafter, lookup=drafter)

    def grid(self, data: Path | None, target: Model | None) -> list[Setting]:
        """The settings `design` replays (`data`: the design's suffix-index folder, the target's own outputs)."""
        return [Setting(self.name, {}, self.lookup(self.name, target))]

    def vllm(self, spec: str, gamma: int) -> dict:
        return {
            "method": "ngram",
            "num_speculative_tokens": gamma,
            "prompt_lookup_min": NGRAM_MIN,
            "prompt_lookup_max": NGRAM_MAX,
        }

    def vllm_note(self, spec: str) -> str:
        """What the export's README adds under the vLLM snippet ('' for nothing)."""
        return ""

    def transformers(self, spec: str, gamma: int) -> str:
        """The keyword arguments of transformers' `generate()` nearest to the spec (its prompt lookup)."""
        return f"prompt_lookup_num_tokens={gamma}, max_matching_ngram_size={NGRAM_MAX}"

    def llama_server(self, spec: str, gamma: int, gguf: Callable[[str], Path]) -> Builtin:
        return Builtin("ngram-simple", f"--spec-ngram-simple-size-n {NGRAM_MAX} --spec-ngram-simple-size-m {gamma}")

    def relocate(self, spec: str, prefix: str = "") -> str:
        """The spec as an export names the data it copied (`copy_data`) under `prefix`; the spec itself when none."""
        return spec

    def copy_data(self, spec: str, out: Path) -> None:
        """Copy the data the spec names (if any) into the export folder `out`."""
