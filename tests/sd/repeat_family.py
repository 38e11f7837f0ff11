"""A drafter family as a plug-in, in one module: `repeat` proposes the sequence's last token γ times.

Everything draftwise asks of a lookup family it answers here or by `LookupFamily`'s defaults: its spec (`repeat`, no
options), its drafter (a `sd.roles.Proposer` run by `LookupSession`), and — by default — its design tuning grid (its
spec alone), its vLLM / transformers export (their n-gram prompt lookup) and its nearest llama-server built-in
(`ngram-simple`). Importing the module registers it.
"""

from __future__ import annotations

from draftwise.runtimes.base import Model
from draftwise.sd.families import LookupFamily, register
from draftwise.sd.families.base import body, options
from draftwise.sd.lookup import LookupSession
from draftwise.sd.ngram import NgramIndex


class RepeatDrafter:
    kind = "lookup"

    def index(self) -> NgramIndex:
        return NgramIndex(1, 1)

    def start(self, prompts: list[list[int]], slots: int = 0, vocab_size: int = 0, batched: bool = False):
        return LookupSession(self, prompts)

    def propose(self, index: NgramIndex, gamma: int) -> tuple[list[int], list[str]]:
        if not index.tokens or gamma < 1:
            return [], []
        return [index.tokens[-1]] * gamma, ["repeat"] * gamma

    def settings(self) -> dict:
        return {"method": "repeat"}


class Repeat(LookupFamily):
    name = "repeat"
    description = "the sequence's last token, γ times"

    def lookup(self, spec: str, target: Model | None = None) -> RepeatDrafter:
        options(body(spec, self.name), {}, spec)  # no options: any is named as unknown
        return RepeatDrafter()


FAMILY = register(Repeat())
