"""How far the server speculates at each batch size: the paper's batch finding as a live policy, priced from curves
measured on this machine.

At batch 1 the server drafts as it was told (the design measured that γ on this runtime, or the user chose it). With
n rows decoding together, one round costs a target pass over n blocks of γ+1 tokens; its cost against a plain step
of those n rows is what `verify_curve` measures at start-up (the lean engine's pass grows with its rows once the
weights are no longer the whole cost: the verify pass over γ+1 tokens at batch 7 cost 1.6–2.6 AR steps, docs/results.md,
Batch dividend). Each row then gains E(γ) = (1 − α^(γ+1)) / (1 − α) tokens a round at acceptance α, the acceptance
measured so far (drafted tokens kept, shrunk towards PRIOR_ALPHA by PRIOR_DRAFTS drafted tokens). γ* for n rows is
the γ ≤ the batch-1 one whose E(γ) ÷ cost(n, γ) is largest; 0 (plain decoding) where none beats a plain step.

Requests differ by temperature, and so does acceptance (a lookup that pays at T = 0 may not at T = 1): α is measured
per request temperature, and each row's γ is priced from its own temperature's α. `tops` gives the batch-1 γ per
temperature (`serve --gamma-by-temperature`, from the design's per-temperature verdicts: 0 where plain decoding won).
"""

from __future__ import annotations

import time

import torch

PRIOR_ALPHA = 0.5  # acceptance assumed before any is measured (a lookup's on ordinary chat, roughly)
PRIOR_DRAFTS = 32  # drafted tokens of evidence the prior counts for
REPEATS = 3  # timed passes per point (the fastest counts), after a warm-up
CONTEXT = 128  # the positions each row holds while the curve is timed


class Chunks:
    """How many prompt tokens a joining request prefills in each round's pass beside the rows already decoding: what
    one round's time buys at the prefill cost measured so far (both smoothed), so a decoding row waits about one more
    round for it — its time per output token at most about twice its usual — instead of the whole prompt's prefill.
    The chunk rides in the rows' pass (`batch.round_`), so its cost is what a round with it takes beyond one without."""

    FIRST = 32  # tokens, before a round without a chunk and one with it have been timed
    LEAST = 8  # a chunk is never smaller: fewer tokens leave the pass's weight reads mostly to the decoding rows
    SMOOTH = 0.3  # weight of the newest measurement
    FLOOR = 0.1  # a chunk's measured cost is at least this share of a round (noise can make it look free)

    def __init__(self):
        self.round_s: float | None = None
        self.token_s: float | None = None

    def tokens(self) -> int:
        if self.round_s is None or self.token_s is None:
            return self.FIRST
        return max(self.LEAST, round(self.round_s / self.token_s))

    def timed_round(self, seconds: float, chunk: int = 0) -> None:
        """A round's time, with `chunk` prompt tokens in its pass (0: none)."""
        if not chunk:
            self.round_s = self._smooth(self.round_s, seconds)
        elif self.round_s is not None:
            self.token_s = self._smooth(self.token_s, max(seconds - self.round_s, self.FLOOR * self.round_s) / chunk)

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.SMOOTH) * old + self.SMOOTH * new


def expected_tokens(alpha: float, gamma: int) -> float:
    """Tokens a round emits per row at acceptance α with γ drafts (accepted drafts and the recovered/bonus one)."""
    return gamma + 1.0 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)


def verify_curve(batch, sizes: list[int], gamma: int) -> dict[int, list[float]]:
    """Seconds of one target pass over n rows of t tokens, for each n in `sizes` and t = 1..γ+1, in `batch`'s cache
    (random tokens at CONTEXT positions; what it writes there a request's prefill overwrites)."""
    lm, curve = batch.lm, {}
    for n in sizes:
        cache, pos = batch.cache(slice(0, n)), [min(CONTEXT, batch.max_len - 1)] * n
        times = []
        for t in range(1, gamma + 2):
            ids = torch.randint(0, lm.vocab_size, (n, t))
            runs = []
            for _ in range(REPEATS + 1):
                start = time.perf_counter()
                lm.forward(ids, pos, None, cache=cache)
                runs.append(time.perf_counter() - start)
            times.append(min(runs[1:]))
        curve[n] = times
    return curve


class Tops:
    """The batch-1 γ of a request at each temperature: `by` {temperature: γ}, a request taking the nearest listed
    temperature's (a tie: the lower); `gamma` for every temperature when `by` is empty."""

    def __init__(self, gamma: int, by: dict[float, int] | None = None):
        self.gamma, self.by = gamma, dict(sorted((by or {}).items()))

    def __call__(self, temperature: float) -> int:
        if not self.by:
            return self.gamma
        return self.by[min(self.by, key=lambda t: (abs(t - temperature), t))]

    @property
    def most(self) -> int:
        """The largest γ any request may draft (what each row's cache keeps room for)."""
        return max(self.by.values(), default=self.gamma)


class Lookahead:
    """γ per batch size and request temperature (module docstring); `observe` takes each round's drafted and accepted
    tokens at a temperature."""

    def __init__(self, tops: Tops | int, curve: dict[int, list[float]], model_drafter: bool):
        self.tops = tops if isinstance(tops, Tops) else Tops(tops)
        self.curve, self.model = curve, model_drafter
        self.counts: dict[float, list[int]] = {}  # temperature: [drafted, accepted]

    def alpha(self, temperature: float = 0.0) -> float:
        drafted, accepted = self.counts.get(round(temperature, 3), (0, 0))
        return (accepted + PRIOR_ALPHA * PRIOR_DRAFTS) / (drafted + PRIOR_DRAFTS)

    def cost(self, n: int, gamma: int) -> float:
        """Seconds of a pass of n rows of γ+1 tokens: measured, or interpolated between the sizes measured."""
        sizes = sorted(self.curve)
        lo = max((s for s in sizes if s <= n), default=sizes[0])
        hi = min((s for s in sizes if s >= n), default=sizes[-1])
        a, b = self.curve[lo][gamma], self.curve[hi][gamma]
        return a if hi == lo else a + (b - a) * (n - lo) / (hi - lo)

    def gamma(self, n: int, temperature: float = 0.0) -> int:
        """γ for a row at `temperature` in a round of n rows."""
        top = self.tops(temperature)
        if n <= 1 or not top:
            return top
        if self.model:  # its one cache drafts for a request alone (`batch`)
            return 0
        alpha = self.alpha(temperature)
        gain = {g: expected_tokens(alpha, g) / self.cost(n, g) for g in range(top + 1)}
        return max(gain, key=lambda g: (gain[g], -g))

    def observe(self, drafted: int, accepted: int, temperature: float = 0.0) -> None:
        counts = self.counts.setdefault(round(temperature, 3), [0, 0])
        counts[0] += drafted
        counts[1] += accepted
