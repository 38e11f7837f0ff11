"""`--minutes` as the whole design's budget: data, training, benchmarks, grids, export and report.

Before each phase (`design.run` names them) the design plans every stage still to come. A stage's predicted time is
its size in target decode steps (`costs`: prompts × new tokens × methods for a benchmark, prompts for data,
calibration rows for pruning's layer elimination, plus the distillation minutes themselves) times the step measured
on this machine by a probe at the start (`probe`), times a correction learnt from the stages already finished
(measured ÷ predicted, per family of stages; `Planner.kappa`). The probe also times one prefill of the selection
prompts' mean length: a benchmark prices each prompt's prefill beyond what its per-token factors include
(`costs.REF_PREFILL_STEPS`), which a big target needs (its prefill is compute-bound while its step reads weights).
Where the design trains a sibling's cuts, it times one teacher pass too (`probe_teacher`): their teacher is the target
as studied, and its price a token differs by CPU more than the step does.

The plan then picks the sizes (`Sizes`) that fill the time left: one scale σ for every prompt count and for the data
and distillation (σ > 1 grows only these two), each count kept at or above its floor (`FLOORS`). When even
σ = SIGMA_KEEP does not fit, optional stages go first, in `DROPS` order (an earlier phase's drop is provisional: a
later phase plans afresh, and a drop takes effect in the phase `DECIDED` names; the report names those). A budget
that the floors cannot meet with every optional stage left out is refused at the start, with the smallest that
fits. Each phase's plan is a record (event "plan"), so a resumed run reuses it and every stage starts from the
config it had; the probe is a record too. Elapsed time counts from the command's start and across resumes.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, replace
from types import SimpleNamespace

import torch

from ..data import load_prompts
from ..errors import DraftwiseError
from ..sd.loop import generate
from ..sd.sampling import SamplingParams
from .costs import FAMILY, REF_PREFILL_STEPS, STAGE_S, Item, Outline, items, kind_of
from .sizes import FLOORS, TRAINING, Sizes, nominal, scale  # noqa: F401  (the plan's API)

SIGMA_KEEP = 0.5  # below this share of the full sizes, optional stages are dropped before counts shrink further
SIGMA_MAX = 4.0  # above 1 only data and distillation grow: the benchmarks keep their full sizes
PRIOR_S = 30.0  # the weight of the prior in a correction, in seconds of predicted time
PROBE_S = 8.0  # the probe decodes at least this long (`probe`): a few seconds of a design's minutes
PROBE_MAX = 12  # ... in at most this many generations (a tiny target's take milliseconds)
# the probe's teacher pass: the teacher stage's own on the int8 kernel (`teacher.KERNEL_ROWS` ÷ its 256-token pieces)
TEACHER_LEN, TEACHER_ROWS, TEACHER_TOPK = 256, 2, 32
KEEP_MAX = 8  # a stage left out is said to need at most this many times the budget (`keep_minutes`)
# optional stages, first dropped first: what a verdict on this machine can do without
DROPS = (
    "repeats",
    "accuracy",
    "batch",
    "gen-data-more",
    "headline",
    "temperatures",
    "extra-rows",
    "reduced-heads",
    "control",
    "scheduler",
    "llama.cpp",
    "lean-int8",
    "lean-q4",
    "training",
)
# the phase whose plan a drop takes effect in (earlier phases' drops are provisional): `design.run` names them
DECIDED = {
    "training": "build",
    "control": "build",
    "gen-data-more": "lookups",
    "scheduler": "lookups",
    "repeats": "select",
    "temperatures": "temperatures",
    "batch": "batch",
    "headline": "headline",
    "llama.cpp": "rows",
    "extra-rows": "rows",
    "lean-int8": "rows",
    "lean-q4": "rows",
    "accuracy": "accuracy",
    "reduced-heads": "reduced-heads",
}


def probe(target, tokens: int = 24, repeats: int = 3, min_s: float = PROBE_S) -> float:
    """Seconds per greedy decode step of the target on this machine: the median of short generations after a
    warm-up, at least `repeats` of them and at least `min_s` seconds of decoding (at most PROBE_MAX). Why the time:
    on a shared 2-core host the step drifts by a quarter within a minute, and a median of three 1.5-second
    generations caught one slow stretch and moved the whole plan (a 1.5B's training kept at 45 ms, dropped at 60)."""
    prompt = list(range(1, 33))
    times: list[float] = []
    for i in range(PROBE_MAX + 1):  # the first is a warm-up
        gen = generate(target.lm, prompt, SamplingParams(), tokens, torch.Generator().manual_seed(i))
        if i:
            times.append((gen.seconds - gen.prefill_s) / max(1, len(gen.tokens)))
        if len(times) >= repeats and sum(times) * tokens >= min_s:
            break
    return sorted(times)[len(times) // 2]


def prompt_tokens(target, config) -> int:
    """The mean length in tokens of the selection grid's prompts (through the chat template, as benchmarks encode)."""
    prompts = load_prompts(config.bench_suites, "eval", limit=config.bench_limit)
    return round(sum(len(target.encode(x.text)) for x in prompts) / max(1, len(prompts)))


def probe_prefill(target, tokens: int, repeats: int = 2) -> float:
    """Seconds of one prefill of a `tokens`-token prompt of the target on this machine (the fastest of `repeats`)."""
    prompt = [1 + i % 1000 for i in range(tokens)]
    return min(
        generate(target.lm, prompt, SamplingParams(), 1, torch.Generator().manual_seed(i)).prefill_s
        for i in range(repeats)
    )


def probe_teacher(target, tokens: int = TEACHER_LEN, rows: int = TEACHER_ROWS) -> float:
    """Seconds per scored token of one teacher pass of the target on this machine (`stages.teacher.score`: every
    position teacher-forced, the head and its top-k at each). Why measured: a cut's teacher was priced at a Zen 5
    figure, 0.35 of a decode step a token, where a pass over many rows is the matrix units' work and a step the
    memory's: the ratio is the CPU's, and its error comes out of the distillation's minutes."""
    from ..stages.teacher import Piece, score

    ids = min(1000, target.vocab_size - 1)
    batch = [Piece("probe", tuple(1 + (i * 7 + r) % ids for i in range(tokens))) for r in range(rows)]
    return timed(lambda: score(target.lm, batch, TEACHER_TOPK, False)) / sum(x.scored for x in batch)


def probed_outline(probed: dict) -> dict:
    """What a probe record tells the plan's outline: a prompt's prefill beyond the costs' factors and, where it was
    timed, a cut's teacher token, both in decode steps."""
    out = {"prefill": excess_prefill(probed)}
    if "teacher_ms" in probed:
        out["teacher"] = probed["teacher_ms"] / probed["step_ms"]
    return out


def timed(work) -> float:
    """Seconds `work()` takes (what it returns is dropped at once: a second copy of a target is not kept)."""
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def excess_prefill(probed: dict) -> float:
    """A prompt's prefill in decode steps beyond the REF_PREFILL_STEPS that the costs' per-token factors include."""
    if "prefill_ms" not in probed:
        return 0.0
    return max(0.0, probed["prefill_ms"] / probed["step_ms"] - REF_PREFILL_STEPS)


def bisect(total, lo: float, hi: float, left_s: float) -> float:
    """The largest σ in [lo, hi] whose plan `total(σ)` fits in `left_s` (total(lo) fits); σ > 1 only where growing
    data and distillation still changes anything (else the full sizes, σ = 1)."""
    if total(hi) <= left_s:
        return 1.0 if hi > 1 >= lo and total(1.0) == total(hi) else hi
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) <= left_s else (lo, mid)
    return lo


def solve(total, full: Sizes, left_s: float) -> Sizes | None:
    """The plan (module docstring): drops in `DROPS` order until σ = SIGMA_KEEP fits, then back in whichever of them
    still fits at that σ (the later, the more wanted), then the largest σ that fits; with every drop, σ down to the
    floors; None when even that does not fit. A drop that saves nothing is not taken. A later phase plans afresh: a
    stage left out for now comes back when the time is there (`DECIDED` says where each drop takes effect)."""
    dropped: tuple[str, ...] = ()

    def fits(d: tuple[str, ...]) -> bool:
        return total(scale(full, SIGMA_KEEP, d)) <= left_s

    for name in (None, *DROPS):
        if name is not None:
            trial = (*dropped, name)
            if total(scale(full, SIGMA_KEEP, trial)) >= total(scale(full, SIGMA_KEEP, dropped)):
                continue  # nothing of it in this design
            dropped = trial
        if fits(dropped):
            for back in reversed(dropped[:-1]):
                trial = tuple(x for x in dropped if x != back)
                dropped = trial if fits(trial) else dropped
            return scale(full, bisect(lambda x: total(scale(full, x, dropped)), SIGMA_KEEP, SIGMA_MAX, left_s), dropped)
    if total(scale(full, 0.0, dropped)) > left_s:
        return None
    return scale(full, bisect(lambda x: total(scale(full, x, dropped)), 0.0, SIGMA_KEEP, left_s), dropped)


class Planner:
    """The budget of one design run folder (`design.Pipeline` holds it): elapsed time across resumes, the probe,
    per-family corrections, and each phase's plan (a record)."""

    def __init__(self, pipeline, records: list[dict], started: float | None = None):
        self.p = pipeline
        self.start = time.monotonic() if started is None else started
        self.before = max((r.get("elapsed_s", 0.0) for r in records), default=0.0)  # spent by earlier processes
        probed = next((r for r in records if r.get("event") == "probe"), None)
        self.step_s = probed["step_ms"] / 1e3 if probed else None
        self.stage_s = STAGE_S + (probed or {}).get("load_ms", 0.0) / 1e3  # a stage's own start: the target loaded
        self.plans = {r["phase"]: r for r in records if r.get("event") == "plan"}
        self.outline = Outline.of(pipeline.base)
        if probed:
            self.know(**probed_outline(probed))
        self.current: Sizes | None = None

    @property
    def budget_s(self) -> float:
        return 60 * self.p.base.minutes

    def elapsed(self) -> float:
        return self.before + time.monotonic() - self.start

    def measure(self, target, load=None) -> None:
        """The probe (a record): the target's decode step, a prefill of the selection prompts' mean length, and
        `load()` timed, the target loaded as each stage loads it (the run's own load may have built a pack of it:
        `runtimes.lean.packed`)."""
        if self.step_s is None:
            self.step_s = probe(target)
            tokens = prompt_tokens(target, self.p.base)
            record = {
                "event": "probe",
                "step_ms": 1e3 * self.step_s,
                "prompt_tokens": tokens,
                "prefill_ms": 1e3 * probe_prefill(target, tokens),
                "load_ms": 1e3 * timed(load) if load else 0.0,
            }
            if self.outline.cuts:
                record["teacher_ms"] = 1e3 * probe_teacher(target)
            self.stage_s = STAGE_S + record["load_ms"] / 1e3
            self.know(**probed_outline(record))
            self.p.dir.append({**record, "elapsed_s": self.elapsed()})

    def families(self) -> dict[str, dict[str, float]]:
        """Per family of the finished stages ('*': all of them): stages, seconds, seconds beyond their exact part
        (`spent`), that exact part, and the predicted rest (`predicted`: before any correction)."""
        sums: dict[str, dict[str, float]] = {}
        for r in self.p.done.values():
            if "predicted_steps" not in r or "seconds" not in r:
                continue
            for key in (FAMILY.get(r["kind"], r["kind"]), "*"):
                s = sums.setdefault(key, dict.fromkeys(("stages", "seconds", "spent", "exact", "predicted"), 0.0))
                s["stages"] += 1
                s["seconds"] += r["seconds"]
                s["spent"] += max(r["seconds"] - r["predicted_exact_s"], 0.0)
                s["exact"] += r["predicted_exact_s"]
                s["predicted"] += r["predicted_steps"] * self.step_s + self.stage_s
        return sums

    def kappa(self) -> dict[str, float]:
        """Measured ÷ predicted per family over the finished stages ('*': all of them), each within [0.25, 4]. Each
        is shrunk toward its prior by PRIOR_S seconds of predictions that held (the global toward 1, a family toward
        the global): one short stage does not re-plan the run."""
        sums = {k: [s["spent"], s["predicted"]] for k, s in self.families().items()}
        a, b = sums.pop("*", [0.0, 0.0])
        out = {"*": min(4.0, max(0.25, (a + PRIOR_S) / (b + PRIOR_S)))} if b else {}
        out.update({k: min(4.0, max(0.25, (a + PRIOR_S * out["*"]) / (b + PRIOR_S))) for k, (a, b) in sums.items()})
        return out

    def remaining(self, sizes: Sizes) -> list[Item]:
        """The items of `sizes` not yet run."""
        done: dict[str, int] = {}
        for name in self.p.done:
            k = kind_of(name)
            if k:
                done[k] = done.get(k, 0) + 1
        return [
            replace(i, count=i.count - done.get(i.kind, 0))
            for i in items(self.outline, sizes, self.p.base)
            if i.count > done.get(i.kind, 0) and i.steps + i.exact_s > 0
        ]

    def seconds(self, item: Item, kappa: dict[str, float]) -> float:
        k = kappa.get(FAMILY.get(item.kind, item.kind), kappa.get("*", 1.0))
        return item.count * (k * (item.steps * self.step_s + self.stage_s) + item.exact_s)

    def ahead_s(self) -> float:
        """Predicted seconds of what the current plan still has to run."""
        if self.current is None or self.step_s is None:
            return 0.0
        return self.predicted_s(self.current, self.kappa())

    def predicted_s(self, sizes: Sizes, kappa: dict[str, float]) -> float:
        """Predicted seconds of the stages of `sizes` not yet run, under the corrections `kappa`."""
        return sum(self.seconds(i, kappa) for i in self.remaining(sizes))

    def know(self, **outline) -> None:
        """Figures of the run's shape now known (`Outline` fields)."""
        self.outline = replace(self.outline, **outline)

    def plan(self, phase: str) -> Sizes:
        """The sizes of the stages from `phase` on (reused from its record on a resumed run)."""
        if phase in self.plans:
            r = self.plans[phase]
            self.current = Sizes(**{k: tuple(v) if k == "dropped" else v for k, v in r["sizes"].items()})
            return self.current
        kappa, left = self.kappa(), self.budget_s - self.elapsed()
        full = nominal(self.p.base, self.outline.trained)

        def total(s: Sizes) -> float:
            return self.predicted_s(s, kappa)

        sizes = solve(total, full, left)
        if sizes is None:
            every = tuple(x for x in DROPS if total(scale(full, 0.0, (x,))) < total(scale(full, 0.0, ())))
            floor = scale(full, 0.0, every)
            need = self.elapsed() + total(floor)
            if not self.p.done:
                raise DraftwiseError(
                    f"--minutes {self.p.base.minutes:g} is too small for a design of {self.p.base.target} on this "
                    f"machine: its smallest plan (every count at its floor; {', '.join(every) or 'nothing'} left out) "
                    f"is predicted at {need / 60:.1f} minutes; use --minutes {math.ceil(need / 30) / 2:g} or more"
                )
            print(
                f"[design] over budget: {need / 60:.1f} of {self.p.base.minutes:g} minutes predicted at the floors",
                file=sys.stderr,
                flush=True,
            )
            sizes = floor
        self.current = sizes
        keep = self.keep_minutes(phase, sizes, total)
        record = {
            "event": "plan",
            "phase": phase,
            "elapsed_s": self.elapsed(),
            "left_s": left,
            "predicted_s": total(sizes),
            "kappa": kappa,
            "step_ms": 1e3 * self.step_s,
            "sizes": asdict(sizes),
            "keep_minutes": keep,
        }
        for name, minutes in keep.items():
            print(
                f"[design] the budget leaves out {name} (at {1e3 * self.step_s:.0f} ms a target step here): "
                f"--minutes {minutes:g} would keep it",
                file=sys.stderr,
                flush=True,
            )
        self.plans[phase] = record
        self.p.dir.append(record)
        return sizes

    def keep_minutes(self, phase: str, sizes: Sizes, total) -> dict[str, float]:
        """{drop: --minutes} for each drop that takes effect in `phase` (`DECIDED`): the least whole budget, to a half
        minute, that keeps it — the one at which this run's stages from here, at that budget's sizes (`nominal` grows
        with it) with every drop before it in `DROPS` order, fit at σ = SIGMA_KEEP, where `solve` stops dropping.
        What a user asks on being told a stage was left out; none past KEEP_MAX × the budget."""
        out, spent = {}, self.elapsed()
        for name in sizes.dropped:
            if DECIDED.get(name) != phase:
                continue

            def fits(halves: int) -> bool:
                full = nominal(replace(self.p.base, minutes=halves / 2), self.outline.trained)
                return spent + total(scale(full, SIGMA_KEEP, DROPS[: DROPS.index(name)])) <= 30 * halves

            lo, hi = math.floor(2 * self.p.base.minutes), math.ceil(2 * KEEP_MAX * self.p.base.minutes)
            if not fits(hi):
                continue
            while hi - lo > 1:  # fits(hi), not fits(lo): the budget asked for dropped it
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if fits(mid) else (mid, hi)
            out[name] = hi / 2
        return out

    @classmethod
    def preview(cls, config, step_s: float) -> Sizes | None:
        """The plan a design of `config` would start with on a machine whose target decode step takes `step_s`
        (nothing run yet; None when even its floors do not fit): what `study` prices an fp32 study by."""
        planner = cls(SimpleNamespace(base=config, done={}), [])
        planner.step_s = step_s
        full = nominal(config, planner.outline.trained)
        return solve(lambda s: planner.predicted_s(s, {}), full, planner.budget_s)

    def stamp(self, record: dict) -> dict:
        """A finished stage's done record with its kind, this plan's prediction and the elapsed time."""
        kind = kind_of(record["stage"])
        pred = (
            next((i for i in items(self.outline, self.current, self.p.base) if i.kind == kind), None)
            if self.current and kind
            else None
        )
        extra = {"kind": kind, "predicted_steps": pred.steps, "predicted_exact_s": pred.exact_s} if pred else {}
        return {**record, **extra, "elapsed_s": self.elapsed()}

    def progress(self) -> str:
        if self.current is None:
            return ""
        return f" ({self.elapsed() / 60:.1f} of {self.p.base.minutes:g} min used, ~{self.ahead_s() / 60:.1f} min ahead)"
