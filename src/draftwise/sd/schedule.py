"""The round scheduler: how many of a proposer's tokens a round verifies, priced by the engine's measured verify curve
and the proposer's calibrated confidence.

    k* = argmax_k E[N | k] / (t_draft + t_verify(k)),    E[N | k] = 1 + Σ_{j ≤ k} Π_{i ≤ j} â_i

k = 0 is a plain AR step (one target step emits one token). t_verify(k): the target's pass over k+1 tokens, from a
`profile` of this engine (k = 0: its AR step). t_draft: what the drafter spent on the round; it is already spent when
the scheduler decides (a lookup's proposal ~0; a model drafter's steps, whose number adaptive lookahead decides), so it
is 0 here: the scheduler chooses how much to *verify*. â_i: the calibrated probability that proposed token i is
accepted given that tokens 1..i−1 were (the glossary's acceptance per position).

Lossless: k depends on the proposal and on earlier rounds only, never on this round's target pass, and the acceptance
rule is untouched (the proposal is only shorter), so greedy output stays AR's and sampled output follows the target.

Calibration (`Calibration`): each proposed position has features — the proposer kind, its position, and two of the
proposer's own signals (see `Draft.features`: the match length and the continuation's count share for the suffix
corpus; the match length and how often earlier occurrences agreed for a request n-gram; q(x) for a model). Counts in
nested bins map them to acceptance, each bin shrunk towards its parent (a bin seen a few times says what its coarser
bin says). Observations are acceptance probabilities, not coin flips: 1[x = argmax p] under greedy, min(1, p(x)/q(x))
under sampling (p(x) for a lookup's one-hot q) — the chance the rule accepts x, known once the target's pass has run.
Every reached position is observed (up to the first rejection), plus one the round did not verify: when all k were
accepted the pass also gave the target's distribution after them, so x_{k+1} is priced for free, and a round with
k = 0 still teaches position 1. A request's observations count for its own later rounds at once and join the
scheduler's calibration when the request finishes (`commit`), so a run learns from its own rounds, warm-up runs
teach nothing, and a resumed run rebuilds the same calibration from its records.

Bypass: over each window of `window` rounds that verified something, the request's emitted tokens are compared with
the AR steps those rounds cost by the verify curve (counters, not clocks: a greedy request is scheduled the same way on
every run); fewer tokens than steps pauses speculation for `pause` rounds (doubling while it keeps failing), after
which the scheduler probes again.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import cost
from ..errors import DraftwiseError
from .roles import Draft, Signal
from .sampling import SamplingParams, argmax, probs

PRIOR = 0.3  # acceptance assumed where nothing was observed yet (about the lookups' α on this project's suites)
STRENGTH = 8.0  # observations a bin needs before it outweighs its parent


def best_k(a_hat: Sequence[float], t_verify: Callable[[int], float], t_draft: float = 0.0) -> int:
    """k* over the proposal's prefixes (0 ≤ k ≤ len(a_hat)); ties go to the shorter prefix."""
    best, best_rate, expected, run = 0, 1.0 / (t_draft + t_verify(0)), 1.0, 1.0
    for k, a in enumerate(a_hat, start=1):
        run *= a  # P(tokens 1..k all accepted)
        expected += run  # E[N | k]
        rate = expected / (t_draft + t_verify(k))
        if rate > best_rate * (1 + 1e-12):
            best, best_rate = k, rate
    return best


@dataclass(frozen=True)
class VerifyCurve:
    """t_verify(k) in ms for k = 0..: the target's pass over k+1 tokens (k = 0: one AR step)."""

    ms: tuple[float, ...]

    def __call__(self, k: int) -> float:
        if k < len(self.ms):
            return self.ms[k]
        return cost.interpolate(list(range(len(self.ms))), list(self.ms), k)  # past the curve: extended linearly

    def steps(self, k: int) -> float:
        """The same in AR steps."""
        return self(k) / self.ms[0]

    @classmethod
    def from_profile(cls, folder: str | Path, upto: int, machine: dict | None = None, batch: int = 1) -> VerifyCurve:
        """The curve of a `profile` run folder, interpolated between its profiled γ up to `upto`; with `machine` (the
        stamp of the engine it is to price) the profile must come from the same engine at the same precision."""
        path = Path(folder) / "profile.json"
        if not path.is_file():
            raise DraftwiseError(
                f"{folder}: not a finished profile run (no profile.json); run `draftwise profile` first"
            )
        profile = json.loads(path.read_text())
        theirs = {k: profile["machine"].get(k) for k in ("engine", "dtype")}
        if machine is not None and theirs != {k: machine.get(k) for k in theirs}:
            raise DraftwiseError(
                f"{folder}: profiled on {theirs['engine']} at {theirs['dtype']}, not on "
                f"{machine.get('engine')} at {machine.get('dtype')}: one engine's verify curve does not "
                "price another's rounds"
            )
        entry = profile["batches"].get(str(batch))
        if entry is None or not entry.get("verify_ms"):
            raise DraftwiseError(f"{folder}: no verify times at batch {batch}")
        curve = cost.verify_curve(entry)
        return cls(tuple(curve(k) for k in range(upto + 1)))


def _levels(feature: str) -> list[str]:
    """'suffix|2|m3|s4' -> ['suffix', 'suffix|2', 'suffix|2|m3', 'suffix|2|m3|s4']: coarse to fine."""
    parts = feature.split("|")
    return ["|".join(parts[: i + 1]) for i in range(len(parts))]


@dataclass
class Calibration:
    """Observed acceptance per feature bin: counts[key] = [observations, sum of acceptance probabilities]."""

    counts: dict[str, list[float]] = field(default_factory=dict)

    def estimate(self, feature: str, local: Calibration | None = None) -> float:
        est = PRIOR
        for key in _levels(feature):
            n, s = self.counts.get(key, (0.0, 0.0))
            if local is not None:
                ln, ls = local.counts.get(key, (0.0, 0.0))
                n, s = n + ln, s + ls
            est = (s + STRENGTH * est) / (n + STRENGTH)
        return est

    def observe(self, feature: str, accept_prob: float) -> None:
        for key in _levels(feature):
            entry = self.counts.setdefault(key, [0.0, 0.0])
            entry[0] += 1
            entry[1] += accept_prob


def feature(position: int, signal: Signal) -> str:
    """A proposed position's calibration key: its proposer's signal (kind first) and the position, capped at 4."""
    kind, _, rest = signal.partition("|")
    return f"{kind}|p{min(position, 4)}" + (f"|{rest}" if rest else "")


def accept_probs(tokens: list[int], qs: list | None, logits: torch.Tensor, params: SamplingParams) -> list[float]:
    """The acceptance rule's probability for each of `tokens` given its predecessors ([n, V] logits: row j is the
    target's distribution for token j)."""
    out = []
    for j, x in enumerate(tokens):
        if params.greedy:
            out.append(float(int(argmax(logits[j])) == x))
        else:
            p = float(probs(logits[j], params)[x])
            q = float(qs[j][x]) if qs else 1.0
            out.append(min(1.0, p / q) if q > 0 else 0.0)
    return out


@dataclass
class Plan:
    """One round's decision: the proposal's features and â, and k."""

    full: Draft
    features: list[str]
    a_hat: list[float]
    k: int
    paused: bool


class Scheduler:
    def __init__(self, curve: VerifyCurve, calibration: Calibration | None = None, window: int = 8, pause: int = 16):
        self.curve, self.window, self.pause = curve, window, pause
        self.calibration = calibration if calibration is not None else Calibration()

    def start(self) -> ScheduleSession:
        return ScheduleSession(self)

    def commit(self, rounds: list[dict]) -> None:
        """A finished request's observations (its round records' `schedule`) join the calibration."""
        for r in rounds:
            s = r.get("schedule")
            for f, a in zip(s["features"], s["observed"]) if s else ():
                self.calibration.observe(f, a)


class ScheduleSession:
    """One request: its own observations so far, and the bypass counters."""

    def __init__(self, scheduler: Scheduler):
        self.s, self.local = scheduler, Calibration()
        self.tokens, self.cost, self.rounds, self.paused_for, self.trips = 0, 0.0, 0, 0, 0

    def plan(self, draft: Draft) -> tuple[Draft, Plan]:
        """The proposal cut to its k* tokens (the draft to verify) and the decision."""
        signals = draft.features or []
        features = [feature(j + 1, signals[j]) for j in range(len(signals))][: len(draft.tokens)]
        a_hat = [self.s.calibration.estimate(f, self.local) for f in features]
        paused = self.paused_for > 0
        k = 0 if paused else best_k(a_hat, self.s.curve)
        self.paused_for = max(0, self.paused_for - 1)
        kept = Draft(draft.tokens[:k], None if draft.qs is None else draft.qs[:k], draft.source, draft.features)
        return kept, Plan(draft, features, a_hat, k, paused)

    def observe(self, plan: Plan, logits: torch.Tensor, params: SamplingParams, accepted: int, emitted: int) -> dict:
        """After the round's pass (logits [k+1, V]): observe every reached position, update the bypass counters, and
        return the round's `schedule` record."""
        reached = min(accepted + 1, len(plan.features))  # up to the first rejection; x_{k+1} when all k were accepted
        observed = accept_probs(plan.full.tokens[:reached], plan.full.qs, logits, params)
        for f, a in zip(plan.features, observed):
            self.local.observe(f, a)
        if plan.k:
            self.tokens, self.cost, self.rounds = (
                self.tokens + emitted,
                self.cost + self.s.curve.steps(plan.k),
                self.rounds + 1,
            )
            if self.rounds == self.s.window:
                if self.tokens < self.cost:  # speculating emitted fewer tokens than its passes cost in AR steps
                    self.paused_for, self.trips = self.s.pause * 2 ** min(self.trips, 3), self.trips + 1
                else:
                    self.trips = 0
                self.tokens, self.cost, self.rounds = 0, 0.0, 0
        return {
            "proposed": len(plan.full.tokens),
            "k": plan.k,
            "a_hat": [round(a, 4) for a in plan.a_hat],
            "features": plan.features[:reached],
            "observed": [round(a, 4) for a in observed],
            "paused": plan.paused,
        }
