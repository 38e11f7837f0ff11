"""`ngram[:min=1,max=4]`: prompt lookup over the request (prompt + output so far); the drafter is
`sd.lookup.NgramDrafter`.

Its counterparts elsewhere: vLLM's `ngram` method (prompt_lookup_min/max), transformers' `prompt_lookup_num_tokens`
(n-grams up to max_matching_ngram_size), llama-server's `ngram-simple` (its longest n-gram as the lookup length, γ as
the draft length).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ...errors import DraftwiseError
from ...runtimes.base import Model
from ..lookup import NgramDrafter
from .base import NGRAM_MAX, NGRAM_MIN, Builtin, LookupFamily, Setting, body, options

GRID = ((1, 2), (1, 4), (2, 4), (3, 6))  # (min, max) the design replays


def parse(spec: str) -> NgramDrafter:
    opts = options(body(spec, "ngram"), {"min": int, "max": int}, spec)
    lo, hi = opts.get("min", NGRAM_MIN), opts.get("max", NGRAM_MAX)
    if not 1 <= lo <= hi:
        raise DraftwiseError(f"bad drafter spec {spec!r}: need 1 <= min <= max")
    return NgramDrafter(lo, hi)


class Ngram(LookupFamily):
    name = "ngram"
    description = "prompt lookup: the tokens after the latest earlier occurrence of the request's final n-gram"

    def lookup(self, spec: str, target: Model | None = None) -> NgramDrafter:
        return parse(spec)

    def grid(self, data: Path | None, target: Model | None) -> list[Setting]:
        return [Setting(f"ngram:min={lo},max={hi}", {"min": lo, "max": hi}, NgramDrafter(lo, hi)) for lo, hi in GRID]

    def vllm(self, spec: str, gamma: int) -> dict:
        ngram = parse(spec)
        return {
            "method": "ngram",
            "num_speculative_tokens": gamma,
            "prompt_lookup_min": ngram.min_n,
            "prompt_lookup_max": ngram.max_n,
        }

    def transformers(self, spec: str, gamma: int) -> str:
        return f"prompt_lookup_num_tokens={gamma}, max_matching_ngram_size={parse(spec).max_n}"

    def llama_server(self, spec: str, gamma: int, gguf: Callable[[str], Path]) -> Builtin:
        n = parse(spec).max_n
        return Builtin("ngram-simple", f"--spec-ngram-simple-size-n {n} --spec-ngram-simple-size-m {gamma}")


FAMILY = Ngram()
