"""Learning curves of trained drafters: when would more training pay?

A trained drafter (pruned + distilled, or a feature-level head) logs its held-out teacher-forced top-1 agreement after
every so many teacher tokens (`eval` records, one at step 0) and each step's time (`train` records, tokens
cumulative). Greedy per-token acceptance α of a drafter is its teacher-forced top-1 agreement, so the curve
agreement(tokens) predicts α(tokens), and with the cost model's break-even α (`cost.break_even_alpha`) and the α that
would match the best lookup (`cost.alpha_for_speedup`) it says how many more tokens — and minutes at the training rate
measured on this machine — a drafter of this shape needs to pay, or that it never will.

The curve: a(t) = a_inf − b·(t + t0)^(−c), a saturating power law in teacher tokens t. Why this form:
  - loss falls as a power law in data towards a floor set by the model's capacity (Kaplan et al. 2020; Hoffmann et
    al. 2022), so an accuracy such as agreement rises as a power law towards a plateau a_inf below 1: a drafter of a
    given shape cannot match the target everywhere however long it trains;
  - t0 keeps a(0) finite: a pruned drafter starts above chance, at the agreement its inherited weights give;
  - a power law approaches its plateau slowly (an exponential would promise the plateau soon), so the tokens it
    predicts for an α near the plateau are large — the honest answer for a curve measured at few points.
The fit has few points (2–8 evaluations), so it is constrained rather than free: a grid over c (and over t0 when
there are ≥ 5 points; else t0 is the first evaluation's token count, the scale where the curve starts to move), with
a_inf and b by least squares under 0 ≤ a_inf ≤ 1 and b ≥ 0. With fewer than 3 evaluations, or an agreement that did
not rise, the curve says so (`Curve.valid` False, `Curve.reason`) and predicts nothing beyond what was measured.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

MIN_POINTS = 3  # a_inf, b, c need three evaluations
FREE_T0 = 5  # evaluations from which t0 is fitted too (a residual degree of freedom left)
MIN_RISE = 0.005  # an agreement gain below this between the first and last evaluation is no rise
HORIZON = 100  # a prediction beyond this many times the tokens trained so far is flagged as a long extrapolation
C_GRID = np.geomspace(0.02, 4.0, 400)
T0_SCALES = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 10.0)


def latest(records: list[dict], event: str) -> list[dict]:
    """A run's records of one event by step (a resumed run's repeated steps: the last wins)."""
    by_step = {r["step"]: r for r in records if r.get("event") == event}
    return [by_step[s] for s in sorted(by_step)]


def points(records: list[dict]) -> list[tuple[float, float]]:
    """(teacher tokens seen, held-out agreement) of every evaluation, in order of tokens."""
    return sorted((float(r["tokens"]), float(r["agreement"])) for r in latest(records, "eval"))


@dataclass(frozen=True)
class Curve:
    """A fitted learning curve a(t) = a_inf − b·(t + t0)^(−c) and what it was fitted on. An invalid curve (`reason`
    says why) predicts the last measured agreement at every t: it does not extrapolate."""

    a_inf: float
    b: float
    c: float
    t0: float
    tokens_seen: float  # the most teacher tokens any evaluation had seen
    agreement_now: float  # the agreement measured at `tokens_seen`
    points: int
    valid: bool
    reason: str | None = None

    def predict(self, tokens) -> np.ndarray | float:
        """Agreement (≈ greedy α) after `tokens` teacher tokens (a number or an array)."""
        t = np.asarray(tokens, dtype=float)
        a = self.a_inf - self.b * (t + self.t0) ** (-self.c) if self.valid else np.full_like(t, self.agreement_now)
        return float(a) if a.ndim == 0 else a

    def tokens_for(self, alpha: float) -> float | None:
        """Teacher tokens (from the start) after which the curve reaches α; None when its plateau is at or below α
        (or, for an invalid curve, when α is above the measured agreement)."""
        if not self.valid:
            return 0.0 if self.agreement_now >= alpha else None
        if alpha >= self.a_inf:
            return None
        if self.b == 0.0:
            return 0.0
        return max(0.0, (self.b / (self.a_inf - alpha)) ** (1.0 / self.c) - self.t0)

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Curve:
        return cls(**d)


def fit(records: list[dict]) -> Curve:
    """The learning curve of a run's eval records (module docstring); invalid with fewer than 3 evaluations or an
    agreement that did not rise."""
    pts = points(records)
    ts, ys = np.array([t for t, _ in pts]), np.array([a for _, a in pts])
    seen, now = (float(ts[-1]), float(ys[-1])) if pts else (0.0, 0.0)
    flat = Curve(now, 0.0, 1.0, 1.0, seen, now, len(pts), False)
    if len(np.unique(ts)) < MIN_POINTS or ts[ts > 0].size == 0:
        return Curve(**{**flat.as_dict(), "reason": f"only {len(pts)} evaluation(s), too few to fit a learning curve"})
    if ys[-1] - ys[0] < MIN_RISE:
        reason = f"its agreement has not risen with training ({ys[0]:.2f} → {ys[-1]:.2f})"
        return Curve(**{**flat.as_dict(), "reason": reason})
    first = float(ts[ts > 0].min())
    scales = T0_SCALES if len(pts) >= FREE_T0 else (1.0,)
    a_inf, b, c, t0 = min((_best_for(ts, ys, first * s) for s in scales), key=lambda x: x[0])[1:]
    if b <= 0.0:
        return Curve(**{**flat.as_dict(), "reason": "its agreement does not rise along any saturating curve"})
    return Curve(a_inf, b, c, t0, seen, now, len(pts), True)


def _best_for(ts: np.ndarray, ys: np.ndarray, t0: float) -> tuple[float, float, float, float, float]:
    """(squared error, a_inf, b, c, t0) of the best c on the grid at this t0: for each c, a_inf and b by least squares
    under the bounds (all c at once: rows of `x` are the grid's c)."""
    x = (ts[None, :] + t0) ** (-C_GRID[:, None])  # [c, points]
    xm, ym = x.mean(1), ys.mean()
    var = ((x - xm[:, None]) ** 2).sum(1)
    b = np.where(var > 0, -((x - xm[:, None]) * (ys - ym)).sum(1) / np.where(var > 0, var, 1.0), 0.0)
    b = np.maximum(b, 0.0)
    a = np.where(b > 0, ym + b * xm, ym)
    over = a > 1.0  # the plateau may not exceed full agreement: refit b with a_inf = 1
    b = np.where(over, np.maximum(((1.0 - ys) * x).sum(1) / (x**2).sum(1), 0.0), b)
    a = np.clip(a, 0.0, 1.0)
    err = ((a[:, None] - b[:, None] * x - ys) ** 2).sum(1)
    i = int(np.argmin(err))
    return float(err[i]), float(a[i]), float(b[i]), float(C_GRID[i]), t0


def rate(records: list[dict]) -> float | None:
    """Training tokens per second on this machine: the tokens the train steps added (their cumulative counts
    differenced) over those steps' own seconds; None without train records. A step whose predecessor's record is
    missing (lost to a resume) is left out, its token gain being unknown."""
    train = latest(records, "train")
    cumulative = {r["step"]: r["tokens"] for r in train}
    gained = seconds = 0.0
    for r in train:
        before = 0 if r["step"] == 1 else cumulative.get(r["step"] - 1)
        if before is not None:
            gained, seconds = gained + r["tokens"] - before, seconds + r["seconds"]
    return gained / seconds if seconds > 0 and gained > 0 else None


@dataclass(frozen=True)
class Prediction:
    """When the curve reaches one target α. status: 'already' (measured agreement ≥ α), 'after' (`tokens` in all,
    `more_tokens` beyond those seen, `minutes` of training at the measured rate), 'never' (the plateau is below α) or
    'unknown' (the curve is invalid). `far`: beyond `HORIZON`× the tokens seen, a long extrapolation."""

    goal: str  # "break-even" | "beat"
    alpha: float
    status: str
    tokens: float | None = None
    more_tokens: float | None = None
    minutes: float | None = None
    far: bool = False

    @classmethod
    def of(cls, curve: Curve, goal: str, alpha: float, tokens_per_s: float | None) -> Prediction:
        if curve.agreement_now >= alpha:
            return cls(goal, alpha, "already", curve.tokens_seen, 0.0, 0.0)
        if not curve.valid:
            return cls(goal, alpha, "unknown")
        t = curve.tokens_for(alpha)
        if t is None:
            return cls(goal, alpha, "never")
        more = max(t - curve.tokens_seen, 0.0)
        minutes = more / tokens_per_s / 60 if tokens_per_s else None
        return cls(goal, alpha, "after", max(t, curve.tokens_seen), more, minutes, t > HORIZON * curve.tokens_seen)

    def as_dict(self) -> dict:
        return asdict(self)


def predict(
    records: list[dict],
    alpha_needed: float | None,
    alpha_to_beat: float | None = None,
    *,
    name: str = "the drafter",
    rival: str | None = None,
) -> dict:
    """The learning-curve outlook of one trained drafter from its run's records: the fitted curve, the training rate,
    one `Prediction` per target α (its break-even, and the α that would match `rival` — the best lookup — when given)
    and the outlook in one sentence. `alpha_needed` None: even α = 1 does not pay at its draft cost; `rival` given
    with `alpha_to_beat` None: even α = 1 would not match the rival."""
    curve, speed = fit(records), rate(records)
    goals = [("break-even", alpha_needed), ("beat", alpha_to_beat)]
    preds = [Prediction.of(curve, g, a, speed) for g, a in goals if a is not None]
    by_goal = {x.goal: x for x in preds}
    rival = rival or ("the best lookup" if alpha_to_beat is not None else None)
    return {
        "curve": curve.as_dict(),
        "tokens_per_s": speed,
        "alpha_needed": alpha_needed,
        "alpha_to_beat": alpha_to_beat,
        "rival": rival,
        "predictions": [x.as_dict() for x in preds],
        "sentence": sentence(name, curve, by_goal.get("break-even"), by_goal.get("beat"), rival),
    }


def sentence(name: str, curve: Curve, pay: Prediction | None, beat: Prediction | None, rival: str | None) -> str:
    """The outlook in one sentence: whether and when the drafter would pay, then whether and when it would beat
    the rival (only once paying is within the curve's reach)."""
    if pay is None:
        return f"{name}: even α = 1 would not pay at its draft cost, so no training of this shape pays."
    now = curve.agreement_now
    if pay.status == "unknown":
        return (
            f"{name} is at agreement {now:.2f}, below the break-even α {pay.alpha:.2f}, and {curve.reason}: no "
            "prediction of when it would pay."
        )
    if pay.status == "never":
        return (
            f"{name}'s curve levels off at α ≈ {curve.a_inf:.2f}, below the break-even {pay.alpha:.2f}: more training "
            "of this shape will not pay."
        )
    if pay.status == "already":
        # the cost model prices decode alone: whether it pays on this machine is the measured speedup's to say
        first = f"{name} is past its break-even by the cost model: agreement {now:.2f} ≥ α {pay.alpha:.2f}"
    else:
        first = f"{name} would pay (α {pay.alpha:.2f}) after {_when(pay, curve)}"
    return first + ("." if rival is None else "; " + _beat_clause(curve, beat, rival) + ".")


def _beat_clause(curve: Curve, beat: Prediction | None, rival: str) -> str:
    if beat is None:
        return f"even α = 1 would not beat {rival}"
    if beat.status == "after":
        return f"it would beat {rival} at α {beat.alpha:.2f} after {_when(beat, curve)}"
    return {
        "already": f"its agreement already reaches the α {beat.alpha:.2f} that would beat {rival}",
        "unknown": f"when it would beat {rival} (at α {beat.alpha:.2f}) the curve cannot say",
        "never": f"its plateau (α ≈ {curve.a_inf:.2f}) stays below the α {beat.alpha:.2f} that would beat {rival}",
    }[beat.status]


def _when(x: Prediction, curve: Curve) -> str:
    """'about 17 more minutes of training here (about 420k teacher tokens in all)'; beyond a week of training, what
    that means for the user instead of the figure (a projection that far out is a direction, not a plan)."""
    times = x.tokens / curve.tokens_seen if curve.tokens_seen else None
    if x.minutes is not None and x.minutes > OUT_OF_REACH_MIN:
        return (
            f"{_times(times)} the teacher text trained so far — {_minutes(x.minutes)} of training here, "
            "out of reach: drop this shape, or train it on a bigger machine only if nothing else pays"
        )
    spent = "no training rate measured" if x.minutes is None else f"{_minutes(x.minutes)} more of training here"
    far = f" — {_times(times)} what it trained on, a rough guess" if x.far and times else ""
    return f"{spent} (about {tokens_text(x.tokens)} teacher tokens in all){far}"


OUT_OF_REACH_MIN = 7 * 24 * 60  # a projection past a week of training here is reported as out of reach


def _times(ratio: float | None) -> str:
    """'about 40 times', 'about a million times' ('an unknown multiple of' without a ratio)."""
    if ratio is None:
        return "an unknown multiple of"
    for scale, word in ((1e12, "a trillion"), (1e9, "a billion"), (1e6, "a million"), (1e3, "a thousand")):
        if ratio >= scale:
            return f"over {word} times"
    return f"about {_two_figures(ratio):g} times"


def _two_figures(v: float) -> float:
    return float(f"{v:.2g}")


def tokens_text(n: float) -> str:
    """A token count to two significant figures: 420k, 2.1M, 950."""
    n = _two_figures(n)
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}"


def _minutes(m: float) -> str:
    if m < 1:
        return "under a minute"
    if m < 90:
        return f"about {_two_figures(m):g} minutes"
    if m < 48 * 60:
        return f"about {_two_figures(m / 60):g} hours"
    if m < 60 * 24 * 60:
        return f"about {_two_figures(m / 1440):g} days"
    if m < 2 * 365 * 1440:
        return f"about {_two_figures(m / (30 * 1440)):g} months"
    return "years" if m < 1000 * 365 * 1440 else "longer than anyone can wait"


def worth_training(
    curve: Curve, rate_tokens_per_s: float | None, alpha_needed: float | None, minutes_left: float
) -> float:
    """For a planner: the minutes of further training after which the curve reaches the break-even α, when that fits
    in `minutes_left`; 0 when it already pays, when its plateau is below α (or even α = 1 does not pay), when the
    curve or the rate is unknown, or when reaching α would take longer than `minutes_left` — time spent training that
    ends below break-even buys nothing, so the planner is told to spend none rather than all of it."""
    if alpha_needed is None or not rate_tokens_per_s:
        return 0.0
    x = Prediction.of(curve, "break-even", alpha_needed, rate_tokens_per_s)
    return x.minutes if x.status == "after" and x.minutes <= minutes_left else 0.0


def pilot(records: list[dict], needed: float, tokens_at_end: float) -> dict | None:
    """The stop rule after a pilot: the agreement the curve predicts once training has seen `tokens_at_end` teacher
    tokens (what the budget buys at the rate measured so far), against the agreement it `needed` to break even. `stop`
    when the prediction falls short — training on would end below break-even, time that buys nothing. None while
    the evaluations are too few to fit a curve (an agreement that has not risen is a flat curve: it predicts what it
    measured)."""
    curve = fit(records)
    if curve.points < MIN_POINTS:
        return None
    predicted = float(curve.predict(tokens_at_end))
    return {
        "predicted": predicted,
        "needed": needed,
        "tokens_at_end": tokens_at_end,
        "tokens_seen": curve.tokens_seen,
        "stop": predicted < needed,
        "curve": curve.as_dict(),
    }
