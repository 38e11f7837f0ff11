"""What the time budget sets for a design's stages (`Sizes`): its counts at full size (`nominal`) and scaled by one σ
with optional stages left out (`scale`); `plan` chooses σ and the drops."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..config import DesignConfig
from . import cuts

FLOORS = {
    "gen_prompts": 8,
    "distill_minutes": 0.5,
    "elimination_tokens": 32,
    "agree_limit": 8,
    "tune_prompts": 9,
    "bench_limit": 6,
    "refine_limit": 3,
    "headline_limit": 3,
    "accuracy_items": 10,
    # a bf16 teacher scores ~80k tokens a minute (240k at σ = 0.5 of a 60-minute plan); a sibling's cuts' q4 teacher
    # ~40 a second on a 2-core Zen 3, where a floor at their full 60k held 25 minutes of a 60-minute plan and left
    # no room to train: 16k is ~7 of those minutes, the least a plan shorter than ~30 minutes scores
    "teacher_tokens": 16_000,
    "feature_minutes": 0.5,
}
# a sibling's cuts learn from the target as studied (q4 or int8), which scores ~160 tokens/s at 1.5B on 2 cores with
# its full 152k-row head, not bf16's thousands: ~1k tokens a minute of budget (60k in an hour, ~6 minutes), which
# distillation at 100-200 tokens/s reads about twice over in its share of the budget
CUT_TEACHER_TOKENS = 1000
TRAINING = ("gen_prompts", "distill_minutes", "teacher_tokens", "feature_minutes")  # the sizes σ > 1 grows


@dataclass(frozen=True)
class Sizes:
    """What the budget sets for the stages still to come; `dropped`: optional stages left out (`DROPS`)."""

    gen_prompts: int
    distill_minutes: float  # per trained candidate
    elimination_tokens: int  # scored positions of pruning's layer elimination (whole calibration rows of 64)
    agree_limit: int
    tune_prompts: int
    bench_limit: int
    refine_limit: int
    headline_limit: int
    accuracy_items: int
    teacher_tokens: int = 0  # positions the target scores teacher-forced (`stages.teacher`), shared by every trainee
    feature_minutes: float = 0.0  # the feature-level drafter's training
    sigma: float = 1.0
    dropped: tuple[str, ...] = ()

    def config(self, base: DesignConfig) -> DesignConfig:
        """The design config the planned stages read: counts, and the drops a config field expresses."""
        d = set(self.dropped)
        return replace(
            base,
            tune_prompts=self.tune_prompts,
            bench_limit=self.bench_limit,
            refine_limit=self.refine_limit,
            headline_limit=self.headline_limit,
            accuracy_items=self.accuracy_items,
            select_repeats=0 if "repeats" in d else base.select_repeats,
            temperatures=(0.0,) if "temperatures" in d else base.temperatures,
            gguf_quants=() if d & {"extra-rows", "llama.cpp"} else base.gguf_quants,
            rows=tuple(e for e in base.rows if e not in d),  # llama.cpp, lean-int8 rows
            scheduler=base.scheduler and "scheduler" not in d,
            draft_vocabs=() if "reduced-heads" in d else base.draft_vocabs,
            adaptive=base.adaptive and "reduced-heads" not in d,
        )


def nominal(config: DesignConfig, trained: int) -> Sizes:
    """The sizes at σ = 1: the config's counts; per minute of budget ~3 prompts generated and ~8k tokens scored
    teacher-forced (about 10 % of the budget at bf16 on 2 cores; for a sibling's cuts `CUT_TEACHER_TOKENS`),
    distillation ~22 % of the budget shared by the pruned candidates, the feature-level drafter ~8 %."""
    return Sizes(
        gen_prompts=max(8, round(3 * config.minutes)),
        distill_minutes=round(0.22 * config.minutes / max(1, trained), 2),
        elimination_tokens=96,
        agree_limit=24,
        tune_prompts=config.tune_prompts,
        bench_limit=config.bench_limit,
        refine_limit=config.refine_limit,
        headline_limit=config.headline_limit,
        accuracy_items=config.accuracy_items,
        teacher_tokens=round((CUT_TEACHER_TOKENS if cuts.source(config) else 8000) * config.minutes),
        feature_minutes=round(0.08 * config.minutes, 2) if config.feature_drafter else 0.0,
    )


def scale(full: Sizes, sigma: float, dropped: tuple[str, ...]) -> Sizes:
    """`full` at σ: each size σ × its full value (at most 1 × for the measurements), never below its floor (nor
    below the full value where that is smaller than the floor: a user's small count is kept)."""
    out = {}
    for name, floor in FLOORS.items():
        v = getattr(full, name)
        x = v * (sigma if name in TRAINING else min(sigma, 1.0))
        x = max(min(floor, v), x)
        out[name] = round(x, 2) if isinstance(v, float) else int(round(x))
    return Sizes(**out, sigma=round(sigma, 4), dropped=dropped)
