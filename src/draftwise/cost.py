"""The cost model: what a drafter of a given shape costs per step on this machine, and what SD then yields.

Definitions (the same as `metrics` and the README):
  E[N]          expected tokens emitted per round = 1 + Σ_{k=1..γ} Π_{i≤k} a_i, from per-position acceptance a_i;
                with i.i.d. acceptance α: (1 − α^{γ+1}) / (1 − α).
  throughput    E[N] / (γ·t_q + t_verify(γ)) tokens/s: t_q one drafter step, t_verify(γ) the target's pass over γ+1
                tokens (a round's acceptance test and sampling are folded into t_verify when it is measured in-engine).
  γ*            the integer γ that maximises throughput.
  free-drafter  E[N] / t_verify(γ): the ceiling if drafting cost nothing.
  c             t_q / t_p, the drafter's step relative to the target's.
  break-even    in AR steps a round must emit as many tokens as it costs (draft + verify time): the TAR, or the
                i.i.d. α, a drafter would need at its measured c and proposal lengths, and the c it could afford at its
                measured TAR (acceptances come in runs — a lookup's long matches — so the measured TAR, not an i.i.d.
                α, prices it).
  mixture       a drafter whose proposal length varies (a lookup proposes only where it matches; a hybrid mixes
                sources): rounds drafting g tokens, with share P(g), emit E[N | g] and cost t_draft(g) + t_verify(g), so
                over many rounds throughput = Σ_g P(g)·E[N|g] / Σ_g P(g)·(t_draft(g) + t_verify(g)) (renewal-reward;
                t_verify(0) is one AR step). A lookup's t_draft is one proposal, whatever g.

Step time of a decoder (any lean-path family) at batch b (fitted to measured points, see `StepModel`):
  t(L, d, V) = fixed + L · (layer_overhead + layer_bytes(d) / bandwidth) + head_bytes(V, d) / bandwidth
Batch-1 decoding reads every weight once per step, so bytes over an effective bandwidth is the natural unit; the
per-layer overhead is what a layer costs beyond its bytes (launches, attention, norms, syncs).

Shapes, parameter counts (the convention every draftwise table uses), weight and KV bytes, the largest batch that
fits: `shapes`, imported from there.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import metrics
from .errors import DraftwiseError
from .shapes import Shape

# --- acceptance and throughput --------------------------------------------------------------------------------------


def expected_tokens(acceptance: Sequence[float]) -> float:
    """E[N] = 1 + Σ_k Π_{i≤k} a_i for per-position acceptance a_1..a_γ."""
    total, run = 1.0, 1.0
    for a in acceptance:
        run *= a
        total += run
    return total


def expected_tokens_iid(alpha: float, gamma: int) -> float:
    """E[N] with the same acceptance α at every position: (1 − α^{γ+1}) / (1 − α)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def throughput(expected: float, gamma: int, t_draft: float, t_verify: float) -> float:
    """Tokens per second for E[N] = `expected` with γ draft steps of `t_draft` s and a verify pass of `t_verify` s."""
    return expected / (gamma * t_draft + t_verify)


def mixture_totals(
    lengths: dict[int, float], acceptance: Sequence[float | None], t_draft, t_verify, cap: int | None = None
) -> tuple[float, float]:
    """(expected tokens, expected seconds) of rounds drafting g tokens `lengths[g]` times (shares or counts), with
    per-position acceptance a_1.. (measured over rounds drafting ≥ k); `t_draft(g)`, `t_verify(g)` in seconds. `cap`
    predicts the same proposals cut to at most `cap` tokens."""
    tokens = seconds = 0.0
    for g, share in lengths.items():
        g = min(g, cap) if cap is not None else g
        tokens += share * expected_tokens([a or 0.0 for a in acceptance[:g]] + [0.0] * max(0, g - len(acceptance)))
        seconds += share * (t_draft(g) + t_verify(g))
    return tokens, seconds


def throughput_mixture(
    lengths: dict[int, float], acceptance: Sequence[float | None], t_draft, t_verify, cap: int | None = None
) -> float:
    """Tokens/s of a drafter whose proposal length varies round to round (see `mixture_totals`)."""
    tokens, seconds = mixture_totals(lengths, acceptance, t_draft, t_verify, cap)
    return tokens / seconds if seconds else 0.0


def predict_rounds(
    rounds: Sequence[dict], t_verify, t_model_step: float | None = None, cap: int | None = None
) -> float:
    """Tokens/s predicted for a measured (or replayed) mix of rounds — raw round records with drafted, accepted and,
    where known, source and draft_s. Rounds are grouped by proposer; each group's proposal lengths and per-position
    acceptance go through `mixture_totals`. A lookup round's draft time is its group's median proposal; a model round's
    is g steps of `t_model_step` seconds (else the measured median step); a round without a proposal costs its
    measured median draft time (a lookup's miss) and one AR step, t_verify(0)."""
    groups: dict[str, list[dict]] = {}
    for r in rounds:
        groups.setdefault(metrics.source_of(r), []).append(r)
    tokens = seconds = 0.0
    for source, rs in groups.items():
        lengths: dict[int, int] = {}
        for r in rs:
            lengths[r["drafted"]] = lengths.get(r["drafted"], 0) + 1
        if source == "model":
            step = (
                t_model_step
                if t_model_step is not None
                else float(np.median([r.get("draft_s", 0.0) / r["drafted"] for r in rs]))
            )
            draft = lambda g, step=step: g * step  # noqa: E731
            seconds += catch_up_s(rounds, t_verify, step)
        else:
            once = float(np.median([r.get("draft_s", 0.0) for r in rs]))
            draft = lambda g, once=once: once  # noqa: E731
        t, sec = mixture_totals(lengths, metrics.acceptance_per_position(rs), draft, t_verify, cap)
        tokens, seconds = tokens + t, seconds + sec
    return tokens / seconds if seconds else 0.0


CATCH_UP_REF = 4  # catch-up tokens are priced at the target's marginal cost a token over its pass of this many


def catch_up_s(rounds: Sequence[dict], t_verify, step: float) -> float:
    """Seconds a hybrid's model spends catching up (`sd.drafters.HybridSession`): its first draft step after lookup
    rounds feeds it every token they emitted, one pass over fed + 1 tokens where a step feeds one. Each fed token is
    priced at the target's marginal cost a token in a short pass, relative to its step ((t_verify(REF) / t_verify(0)
    - 1) / REF), times the model's step: the target's curve past its profiled γ (extended linearly from a steeper
    segment) priced a catch-up over 113 tokens at 66 steps where the 0.5B took 29. Rounds in order; a new `prompt_id`
    starts afresh (the model was prefilled with the prompt). Why: on the 1.5B with its 0.5B sibling + n-gram such a
    round took 115 ms on average against 29 for the others, ~5 % of the run."""
    per_token = (t_verify(CATCH_UP_REF) / t_verify(0) - 1) / CATCH_UP_REF
    total, fed, prompt = 0.0, 0, None
    for r in rounds:
        if r.get("prompt_id") != prompt:
            fed, prompt = 0, r.get("prompt_id")
        source = metrics.source_of(r)
        if source == "model":
            total, fed = total + step * per_token * fed, 0
        elif source:  # a lookup's round: the model has not seen what it emitted
            fed += r["emitted"]
    return total


def break_even_alpha(lengths: dict[int, float], t_draft, t_verify) -> float | None:
    """The i.i.d. acceptance α at which a drafter drafting g tokens in a share `lengths[g]` of rounds, with the given
    draft and verify times (in AR steps), only matches plain decoding; None if even α = 1 does not (bisection)."""

    def surplus(a):  # tokens per round minus AR steps per round: 0 at break-even, increasing in α
        tokens = sum(s * expected_tokens_iid(a, g) for g, s in lengths.items())
        return tokens - sum(s * (t_draft(g) + t_verify(g)) for g, s in lengths.items())

    if surplus(1.0) < 0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if surplus(mid) < 0 else (lo, mid)
    return hi


def alpha_for_speedup(lengths: dict[int, float], t_draft, t_verify, speedup: float) -> float | None:
    """The i.i.d. acceptance α at which a drafter (as in `break_even_alpha`: proposal lengths, draft and verify times
    in AR steps) is predicted `speedup`× plain decoding — tokens per round over AR steps per round — e.g. the measured
    speedup of the best lookup, the α a trained drafter must reach to beat it; `break_even_alpha` is speedup 1. None
    if even α = 1 falls short (bisection)."""

    def surplus(a):  # tokens per round minus `speedup` × AR steps per round: increasing in α
        tokens = sum(s * expected_tokens_iid(a, g) for g, s in lengths.items())
        return tokens - speedup * sum(s * (t_draft(g) + t_verify(g)) for g, s in lengths.items())

    if surplus(1.0) < 0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if surplus(mid) < 0 else (lo, mid)
    return hi


def speedup_at(lengths: dict[int, float], t_draft, t_verify, alpha: float) -> float:
    """The speedup over plain decoding the cost model predicts for a drafter (as in `break_even_alpha`) at i.i.d.
    acceptance `alpha`: tokens per round over AR steps per round (batch 1, prefill left out)."""
    tokens = sum(s * expected_tokens_iid(alpha, g) for g, s in lengths.items())
    return tokens / sum(s * (t_draft(g) + t_verify(g)) for g, s in lengths.items())


OPTIMISTIC_GAMMAS = range(1, 9)


def optimistic_speedup(c: float, alpha: float) -> float:
    """The speedup a drafter of step cost `c` (AR steps) is predicted at i.i.d. acceptance α, at its best γ, a verify
    pass priced at one AR step: optimistic, what it could reach whatever its verify cost (`speedup_at`)."""
    return max(speedup_at({g: 1.0}, lambda n: n * c, lambda n: 1.0, alpha) for g in OPTIMISTIC_GAMMAS)


def optimistic_break_even(c: float) -> float:
    """The least agreement at which a drafter of step cost `c` pays at its best γ, a verify pass priced at one AR
    step: optimistic, so a drafter stopped below it could not pay whatever its verify cost."""
    needs = [break_even_alpha({g: 1}, lambda n: n * c, lambda n: 1.0) for g in OPTIMISTIC_GAMMAS]
    return min((a for a in needs if a is not None), default=1.0)


def break_even_tar(lengths: dict[int, float], t_draft, t_verify) -> float:
    """The tokens per round (TAR) at which a drafter with these proposal lengths and draft and verify times (AR steps)
    only matches plain decoding: a round must emit as many tokens as the AR steps it costs."""
    total = sum(lengths.values())
    return sum(s * (t_draft(g) + t_verify(g)) for g, s in lengths.items()) / total


def break_even_draft(lengths: dict[int, float], tar: float, t_verify) -> float | None:
    """The draft time per drafting round (AR steps; for a model drafter γ·c) at which a drafter emitting `tar` tokens
    per round (measured) only matches plain decoding; None when its verify passes alone cost more than it emits."""
    total = sum(lengths.values())
    verify = sum(s * t_verify(g) for g, s in lengths.items()) / total
    drafting = sum(s for g, s in lengths.items() if g) / total
    room = (tar - verify) / drafting if drafting else None
    return room if room is not None and room >= 0 else None


def free_drafter_limit(expected: float, t_verify: float) -> float:
    return expected / t_verify


def acceptance_for(gamma: int, alpha: float | None = None, per_position: Sequence[float] | None = None) -> list[float]:
    """a_1..a_γ: measured per-position values where known (the last one repeated beyond; a position no round
    reached counts as 0), else i.i.d. α."""
    if per_position:
        return [per_position[min(k, len(per_position) - 1)] or 0.0 for k in range(gamma)]
    if alpha is None:
        raise DraftwiseError("need an acceptance rate: give --alpha or a bench run with measured acceptance")
    return [alpha] * gamma


def best_gamma(
    t_draft: float,
    verify_time,
    gammas: Sequence[int],
    alpha: float | None = None,
    per_position: Sequence[float] | None = None,
) -> tuple[int, float]:
    """(γ*, its tokens/s) over `gammas`; `verify_time(γ)` gives the target's pass over γ+1 tokens in seconds."""
    scored = [
        (throughput(expected_tokens(acceptance_for(g, alpha, per_position)), g, t_draft, verify_time(g)), g)
        for g in gammas
    ]
    speed, gamma = max(scored)
    return gamma, speed


# --- the fitted step-time model --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepModel:
    """t(shape) in ms = fixed + layers·(layer_overhead + layer_MB·ms_per_MB) + head_MB·ms_per_MB_head
    (one batch size)."""

    fixed_ms: float
    layer_overhead_ms: float
    ms_per_layer_mb: float
    ms_per_head_mb: float
    bytes_per_value: int = 4

    def predict_ms(self, shape: Shape) -> float:
        return self.fixed_ms + shape.layers * self.layer_ms(shape) + self.head_ms(shape)

    def layer_ms(self, shape: Shape) -> float:
        return self.layer_overhead_ms + shape.layer_params() * self.bytes_per_value / 1e6 * self.ms_per_layer_mb

    def head_ms(self, shape: Shape) -> float:
        return shape.vocab * shape.hidden * self.bytes_per_value / 1e6 * self.ms_per_head_mb

    @classmethod
    def fit(cls, points: Sequence[tuple[Shape, float]], bytes_per_value: int = 4) -> StepModel:
        """Least squares (non-negative) over measured (shape, ms) points; needs ≥ 4 points of different shapes."""
        if len(points) < 4:
            raise DraftwiseError(f"the step model needs at least 4 measured shapes, got {len(points)}")
        rows = [
            [
                1.0,
                s.layers,
                s.layers * s.layer_params() * bytes_per_value / 1e6,
                s.vocab * s.hidden * bytes_per_value / 1e6,
            ]
            for s, _ in points
        ]
        a, y = np.array(rows), np.array([ms for _, ms in points])
        coef = _nonneg_lstsq(a, y)
        return cls(*map(float, coef), bytes_per_value=bytes_per_value)

    def as_dict(self) -> dict:
        return {
            "fixed_ms": self.fixed_ms,
            "layer_overhead_ms": self.layer_overhead_ms,
            "ms_per_layer_mb": self.ms_per_layer_mb,
            "ms_per_head_mb": self.ms_per_head_mb,
            "bytes_per_value": self.bytes_per_value,
        }

    @classmethod
    def from_dict(cls, d: dict) -> StepModel:
        """As `as_dict` wrote it (fits written before bytes_per_value was recorded were fp32)."""
        return cls(
            d["fixed_ms"],
            d["layer_overhead_ms"],
            d["ms_per_layer_mb"],
            d["ms_per_head_mb"],
            d.get("bytes_per_value", 4),
        )


def _nonneg_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with coefficients >= 0 (active-set on 4 unknowns: try every subset, keep the best feasible)."""
    n = a.shape[1]
    best, best_err = np.zeros(n), math.inf
    for mask in range(1, 2**n):
        cols = [i for i in range(n) if mask >> i & 1]
        sol, *_ = np.linalg.lstsq(a[:, cols], y, rcond=None)
        if (sol < 0).any():
            continue
        coef = np.zeros(n)
        coef[cols] = sol
        err = float(((a @ coef - y) ** 2).sum())
        if err < best_err:
            best, best_err = coef, err
    return best


def interpolate(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """Piecewise-linear through measured points, extended linearly past the ends."""
    order = np.argsort(xs)
    xs, ys = np.asarray(xs, float)[order], np.asarray(ys, float)[order]
    if len(xs) == 1:
        return float(ys[0])
    if x <= xs[0]:
        i = 0
    elif x >= xs[-1]:
        i = len(xs) - 2
    else:
        return float(np.interp(x, xs, ys))
    slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
    return float(ys[i] + slope * (x - xs[i]))


def drafter_step_ms(entry: dict, spec: str) -> tuple[float, float]:
    """(one draft step, a catch-up step over two tokens) of drafter `spec` in ms, from a profile.json batch entry, on
    the verify curve's footing: the step's ratio to the target step timed beside it (`c`) times the entry's AR step.
    Why not its own milliseconds: the AR step was timed at another moment, and where the host's speed moved between
    the two (10-45 % on a busy 2-core VM) absolute steps priced against ratio-anchored verify passes made a model
    drafter look up to 30 % cheaper than the loop then measured."""
    d = entry["drafters"][spec]
    scale = d["c"] * entry["ar_step_ms"] / d["step_ms"] if d.get("c") and d["step_ms"] else 1.0
    return d["step_ms"] * scale, (d.get("catch_up_ms") or d["step_ms"]) * scale


def verify_curve(entry: dict) -> Callable[[float], float]:
    """t_verify(g) in ms from a profile.json batch entry (g = 0: one AR step): each verify pass's ratio to the AR step
    timed beside it, times the AR step — the ratios are what survives drift (the AR step's own point, timed at
    another moment, moved 5–10 % away from the steps its verify passes were timed beside); piecewise-linear between
    the profiled γ, extended linearly past them. An entry without ratios: its verify milliseconds."""
    ar, ratios = entry["ar_step_ms"], entry.get("verify_over_ar_step")
    verify = (
        {int(g): ar * r for g, r in ratios.items()} if ratios else {int(g): ms for g, ms in entry["verify_ms"].items()}
    )
    points = [(0, ar)] + sorted(verify.items())
    xs, ys = [x for x, _ in points], [y for _, y in points]
    return lambda g: interpolate(xs, ys, g)
