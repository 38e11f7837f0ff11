"""The user's traffic and what a request of it costs: time to first token, time per output token, request time and
crossovers (the glossary's words).

A request costs TTFT (its prompt's prefill, which yields the first new token) plus its answer length × the time per
output token (TPOT: decode seconds over the tokens decoded). Two ways of decoding with TTFTs f_a, f_b and TPOTs
d_a, d_b take equally long at the answer length L* = (f_b − f_a) / (d_a − d_b): the **crossover**. Below it the one
with the shorter TTFT finishes first, beyond it the one with the shorter TPOT — so a method that wins a benchmark by
its faster prefill loses every answer longer than L* to a faster decoder ("beyond ~160 new tokens, llama-server plain
is faster").

The traffic is a list of requests (prompt, answer length, temperature): the user's own file (`--prompts`, each line's
`max_tokens` and `temperature`, a line without a temperature at what an OpenAI client sends when the caller sets
none: 1.0), or the packaged suites at every design temperature (T = 0 and T = 1 by default). The benchmarks decode
each request to its own answer length (EOS may end it sooner), so a request's time is measured whole; the request time
of an option over the traffic is Σ TTFT + answer × TPOT per request, each at the answer length the target gave
(`request_times`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

OPENAI_TEMPERATURE = 1.0  # what the OpenAI API (and so its clients) uses when a request sets no temperature


@dataclass(frozen=True)
class Phases:
    """One option's measured phases on one request, pooled over repeated passes: TTFT, decode seconds and tokens."""

    ttft_s: float
    decode_s: float
    tokens: int

    def __add__(self, other: Phases) -> Phases:
        return Phases(self.ttft_s + other.ttft_s, self.decode_s + other.decode_s, self.tokens + other.tokens)


def phases(records: Iterable[dict], key: Callable[[dict], object], ignore: object = None) -> dict[object, dict]:
    """{option: {(temperature, prompt id): Phases}} from bench records (`key` names a record's option; records it
    names `ignore` are left out). A record's TTFT is its prefill; a batched record is not one request and is skipped."""
    out: dict[object, dict] = {}
    for r in records:
        k = key(r)
        if k is ignore or r.get("batch", 1) != 1 or "prefill_s" not in r:
            continue
        per = out.setdefault(k, {})
        at = (float(r.get("temperature", 0.0)), r["prompt_id"])
        got = Phases(r["prefill_s"], max(0.0, r["seconds"] - r["prefill_s"]), r["new_tokens"])
        per[at] = per[at] + got if at in per else got
    return out


def answers(by: dict[object, dict]) -> dict[tuple, float]:
    """The answer length of each request: the mean new tokens over every option's generations of it (equal at T = 0,
    a lossless method decoding the target's own text; at T > 0 each a draw from the same distribution)."""
    tokens: dict[tuple, list[int]] = {}
    for per in by.values():
        for at, ph in per.items():
            tokens.setdefault(at, []).append(ph.tokens)
    return {at: sum(v) / len(v) for at, v in tokens.items()}


def request_times(by: dict[object, dict], wanted: Callable[[tuple], bool] = lambda at: True) -> dict:
    """{option: {request: (answer tokens, request seconds)}}: each request at its answer length (`answers`), TTFT plus
    that many tokens at the option's TPOT on that request — the (tokens, seconds) pairs `decide.compare` bootstraps,
    so a speedup there is the ratio of expected request times over the traffic. `wanted`: the requests to count."""
    length = answers(by)
    out = {}
    for k, per in by.items():
        out[k] = {
            at: (length[at], ph.ttft_s + length[at] * ph.decode_s / max(1, ph.tokens))
            for at, ph in per.items()
            if wanted(at)
        }
    return out


@dataclass(frozen=True)
class Figures:
    """An option's two figures over a set of requests, and the end-to-end one: mean TTFT, TPOT (Σ decode seconds /
    Σ tokens) and tokens/s with prefill; `request_s`: the mean request time at the requests' answer lengths."""

    ttft_s: float
    tpot_s: float
    tokens_per_s: float
    request_s: float
    requests: int

    @property
    def decode_tokens_per_s(self) -> float:
        return 1.0 / self.tpot_s if self.tpot_s > 0 else float("inf")

    def at(self, answer: float) -> float:
        """Request time at an answer of `answer` new tokens."""
        return self.ttft_s + answer * self.tpot_s

    def as_dict(self) -> dict:
        return {**self.__dict__, "decode_tokens_per_s": self.decode_tokens_per_s}


def figures(per: dict[tuple, Phases], times: dict[tuple, tuple[float, float]]) -> Figures:
    """An option's `Figures` from its phases and its request times (`request_times`) on the same requests."""
    ph = [per[at] for at in times]
    tokens, decode = sum(p.tokens for p in ph), sum(p.decode_s for p in ph)
    wall = sum(p.ttft_s + p.decode_s for p in ph)
    return Figures(
        ttft_s=sum(p.ttft_s for p in ph) / len(ph),
        tpot_s=decode / max(1, tokens),
        tokens_per_s=tokens / wall if wall else 0.0,
        request_s=sum(s for _, s in times.values()) / len(times),
        requests=len(ph),
    )


def crossover(a: Figures, b: Figures) -> float | None:
    """The answer length (new tokens) at which a and b take equally long: below it the one with the shorter TTFT wins,
    beyond it the one with the shorter TPOT. None when one is never slower (no crossover at a positive length)."""
    if a.tpot_s == b.tpot_s:
        return None
    at = (b.ttft_s - a.ttft_s) / (a.tpot_s - b.tpot_s)
    return at if at > 0 else None


def crossover_sentence(a: Figures, other: str, b: Figures) -> str:
    """Where `other` (figures b) would win over the option of figures a, in words."""
    at = crossover(a, b)
    if at is None:
        slower = a.at(1) <= b.at(1)
        return f"{other} is {'slower' if slower else 'faster'} at every answer length"
    if b.tpot_s < a.tpot_s:
        return f"beyond ~{at:.0f} new tokens {other} is faster"
    return f"below ~{at:.0f} new tokens {other} is faster"


def requests_of(prompts: Sequence, temperatures: Sequence[float], own: bool) -> set[tuple[float, str]]:
    """The traffic's (temperature, prompt id) requests: with the user's file (`own`), each prompt at its own
    temperature (a line without one at OPENAI_TEMPERATURE); with the packaged suites, every prompt at every
    temperature."""
    if own:
        return {(temperature_of(p), p.id) for p in prompts}
    return {(float(t), p.id) for p in prompts for t in temperatures}


def temperature_of(prompt) -> float:
    """A line of the user's file decoded at its own temperature: its `temperature`, else OPENAI_TEMPERATURE."""
    return float(prompt.extra.get("temperature", OPENAI_TEMPERATURE))


def sets_temperatures(prompts: Sequence) -> bool:
    """Whether any line of the user's file sets its own temperature (a file of bare prompts sets none)."""
    return any("temperature" in p.extra for p in prompts)


def temperatures_of(prompts: Sequence, temperatures: Sequence[float], own: bool) -> tuple[float, ...]:
    """Every temperature the traffic holds, in order (each is measured)."""
    return tuple(sorted({t for t, _ in requests_of(prompts, temperatures, own)}))
