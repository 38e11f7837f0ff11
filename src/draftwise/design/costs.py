"""What each stage of a design costs, for the time budget (`plan`): a stage's time in target decode steps from its
size, plus the seconds it is told to take (distillation's minutes). The figures per unit were measured on the
default target on a 2-core CPU; `plan.Planner` corrects them with what the run's own stages took.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import DesignConfig
from . import cuts, lean_rows
from .sizes import Sizes

REF_TOKENS = 96  # new tokens per prompt the token-based costs below were measured at
# a prompt's prefill, in the target's decode steps, that the per-prompt factors below include: the default target at
# fp32 on a 2-core CPU, the selection prompts' mean length of 223 tokens (AMD EPYC: 379 ms against a 24.1 ms step); a
# target whose prefill costs more steps (a bigger model, whose prefill is compute-bound while its step reads weights:
# a 1.7B at q4, 45.8) has the excess priced wherever a stage prefills a prompt (`Outline.prefill`)
REF_PREFILL_STEPS = 16.0
# weight bytes per weight at each precision: what a lean row's step is beside the study's (int8: a byte, an fp16 scale
# and offset and a sum of q per 32; q4: half a byte and an fp16 scale and offset per 32 — Q4_0 and Q4_1; Q4_K 19/32)
BYTES_PER_WEIGHT = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.1875, "q4": 0.625}
# a candidate's agreement per prompt on the shared continuations, in target steps: 4.7–5.3 s for 12 prompts against
# 12.9 s generating them too (the default target at fp32, a 2- and an 8-layer drafter, the command's own start included)
AGREE_STEPS = 8.0
# an accuracy item (MMLU, HellaSwag: one pass over context and choice per choice) in target steps, the default target
# at fp32 (where a prompt's prefill is REF_PREFILL_STEPS); a target whose prefill costs more steps pays its items in
# proportion: a 1.5B at q4 on 2 AVX2 cores, whose 220-token prefill is 97 steps, ~6× as many
ACCURACY_ITEM_STEPS = 9.2
# a cut's teacher token in the studied target's decode steps until the probe times one (`Outline.teacher`): a 1.5B
# at q4, ~160 tokens/s on 2 Zen 5 cores
TEACHER_STEPS = 0.35
# a lossy teacher's fidelity check (`stages.teacher.fidelity`: the fp32 target loaded, 8 pieces scored at both
# precisions) for a cut's teacher, in its decode steps: the fp32 load and passes and the q4 step all grow with the
# target's size. The 1.5B at q4: 172 s at a 60-76 ms step (Zen 3), ~80 s at a 33 ms step (Zen 4: the teacher stage's
# 348 s less its shards' 262 s and the q4 load); priced 300 steps before, the stage ran 21 % over its plan on Zen 4
FIDELITY_STEPS = 2600
# a cut of the sibling pruned at fp32 (loaded from its file, calibrated, layers eliminated, written with its reduced
# head), in the studied target's decode steps: on Zen 4 at a 33 ms step the 0.5B's wide cut took 164 s, its
# deep-narrow twin (no elimination) 70 s — priced 1,700 steps (56 s) before
CUT_PRUNE_STEPS = 3500
LEAN_FLOOR = 0.35  # a lean row's step beside an fp32 study's (the default target): about a third, with overheads
STAGE_S = 0.5  # per stage beyond loading the target (the probe times that: `Planner.stage_s`): files, imports
# the families whose stages share one correction (measured ÷ predicted); any other kind is a family of its own
FAMILY = {
    "bench-select": "bench",
    "bench-select-repeat": "bench",
    "bench-gamma": "bench",
    "bench-gamma-repeat": "bench",
    "bench-temps": "bench",
    "bench-batch": "bench",
    "bench-headline": "bench",
    "reduced-heads": "bench",
    "gen-data-more": "gen-data",
    "profile@": "llama.cpp",
    "tune-lookup@": "llama.cpp",
    "bench-fastest": "bench",
    "bench-serve": "bench",
    "bench-select@lean": "bench",
    "profile@lean": "profile",
    "tune-lookup@lean": "tune",
}


@dataclass(frozen=True)
class Outline:
    """What the plan knows of the run's shape; `design.run` fills in each figure once it is known."""

    trained: int  # pruned and distilled candidates
    untrained: int  # first-k, self-speculative, the user's
    benched: int  # model drafters in the selection grid
    lookups: int  # tuned n-gram, suffix and hybrid candidates
    rows: int  # llama.cpp rows
    lean_rows: tuple[str, ...] = ()  # the lean engine's rows of their own (lean-int8, lean-q4)
    chosen_model: bool = False  # the chosen drafter is a model (reduced heads follow)
    trained_control: bool = True  # the trained count includes the deep-narrow control (`control` drops it)
    prerank: bool = False  # a dropped control cut is still pruned and ranked untrained beside the other (`cuts`)
    built: bool = False  # the candidates are known: `training` and `control` no longer change anything
    serve: bool = True  # the deploy command is measured through `draftwise serve` (`served`; False once settled)
    serve_token_s: float | None = None  # its seconds per new token, served and llama-server's, from the last grid
    features: int = 1  # feature-level drafters trained (on the teacher data)
    prefill: float = 0.0  # a prompt's prefill in decode steps beyond REF_PREFILL_STEPS (the probe's; `plan`)
    lean_step: float = LEAN_FLOOR  # the lean rows' mean step in the study's steps (`lean_share`)
    answer: float = 0.0  # the traffic's mean answer tokens (its file's max_tokens; 0: --max-new-tokens)
    temperatures: int = 0  # the traffic's temperatures, each measured in the last grid (0: --temperatures')
    cuts: bool = False  # the trained shapes are cut from the sibling: no sweep; their teacher is the studied target
    teacher: float = 0.0  # a cut's teacher token in decode steps, the probe's (`plan.probe_teacher`; 0: TEACHER_STEPS)

    @classmethod
    def of(cls, config: DesignConfig) -> Outline:
        cut = cuts.source(config) is not None  # a q4 study of a target with a sibling trains the sibling's cuts
        trained = 2 if cut else 0 if not config.trains else 2 * len(config.wide_layers) if config.wide_layers else 2
        user = 1 if config.drafter else 0
        rows = (1 + len(config.gguf_quants)) if "llama.cpp" in config.rows else 0
        lean = lean_rows.planned(config)
        return cls(
            trained,
            2 + user,
            trained + user,
            3 if config.lookups else 0,
            rows,
            lean_rows=tuple(lean),
            lean_step=sum(lean_share(x, config.dtype) for x in lean.values()) / len(lean) if lean else LEAN_FLOOR,
            trained_control=not config.wide_layers,
            features=int(config.feature_drafter and config.trains),
            cuts=cut,
        )


@dataclass(frozen=True)
class Item:
    """`count` stages of one kind still to run, each `steps` target decode steps plus `exact_s` seconds."""

    kind: str
    count: int
    steps: float
    exact_s: float = 0.0


@dataclass(frozen=True)
class Counts:
    """What an outline at some sizes makes of its candidates: the trained ones, the benched model drafters, all
    candidates, the scheduled lookups (0 or 2), the chosen drafter's and the lookups' cost per token in AR steps, and
    the model drafters a row benches."""

    trained: int
    benched: int
    cands: int
    sched: int
    chosen: float
    lookups: float
    row_models: int
    features: int = 0

    @classmethod
    def of(cls, o: Outline, d: set[str], cfg: DesignConfig) -> Counts:
        trained = o.trained if o.built else 0 if "training" in d else o.trained - ("control" in d and o.trained_control)
        benched = o.benched - (o.trained - trained)  # the benched model drafters count the trained ones
        # a benchmark's methods per new token, in AR steps (prefill included): AR 1, a model drafter's SD 1.2, a
        # lookup's 0.8, a hybrid's 0.9, transformers' generate() and its own SD about 2 each (the default target)
        chosen = 1.2 if o.chosen_model or not o.lookups else 0.8
        lookups = 0.8 * min(2, o.lookups) + 0.9 * max(0, o.lookups - 2)  # n-gram and suffix, then the hybrid
        sched = 2 if cfg.scheduler and o.lookups else 0
        features = o.features if o.built or "training" not in d else 0
        cands = trained + o.untrained + features
        return cls(trained, benched, cands, sched, chosen, lookups, 0 if o.lookups else benched, features)


def items(o: Outline, s: Sizes, c: DesignConfig) -> list[Item]:
    """Every stage of a design of this outline at sizes `s`, with its cost (module docstring)."""
    d, cfg = set(s.dropped), s.config(c)
    n = Counts.of(o, d, cfg)
    return (
        _building(o, s, c, d, n)
        + _selecting(s, cfg, d, n, (o.answer or c.max_new_tokens) + o.prefill)
        + _rows(o, s, d, n, (o.answer or c.max_new_tokens) + o.prefill)
        + _finishing(o, s, c, d, n)
    )


def _building(o: Outline, s: Sizes, c: DesignConfig, d: set[str], n: Counts) -> list[Item]:
    """The sweep, data, each candidate's prune, distill and agree, the profile, and the lookups' tuning."""
    t = c.max_new_tokens / REF_TOKENS
    learns = int(o.trained + o.features > 0 and (o.built or "training" not in d))  # a study at int8/q4 trains none
    learns_target = learns and not o.cuts  # a sibling's cuts need no sweep of the target's shapes
    # cuts ranked untrained (a dropped control: the cut passed over is pruned and evaluated, never trained)
    prerank = int(o.prerank if o.built else o.cuts and o.trained_control and "control" in d and "training" not in d)
    # the first-ranked cut trained on from its pilot or its untrained ranking (`cut_stages.focus`)
    focus = int(o.cuts and n.trained + prerank > 1)
    out = [
        Item("sweep", learns_target, 300),
        # each prompt at two temperatures from one prefill (`sd.batched.prefill`)
        Item("gen-data", 1, 100 + (52 + o.prefill) * s.gen_prompts),
        # teacher-forced scoring: ~1,300 tokens/s at bf16 on 2 cores, about 40 tokens per fp32 AR step; a cut's
        # teacher is the target as studied, its token timed by the probe (`plan.probe_teacher`)
        Item(
            "teacher",
            learns,
            FIDELITY_STEPS + (o.teacher or TEACHER_STEPS) * s.teacher_tokens
            if o.cuts
            else 300 + 0.025 * s.teacher_tokens,
        ),
        Item(
            "prune",
            n.trained + prerank,
            CUT_PRUNE_STEPS if o.cuts else 600 + 1100 * math.ceil(s.elimination_tokens / 64),  # per calibration row
        ),
        # its minutes, then loading and evaluations; a sibling's cuts share theirs with the first-ranked one's more
        Item(
            "distill",
            n.trained + prerank + focus,
            400,
            60 * s.distill_minutes * n.trained / max(1, n.trained + prerank + focus),
        ),
        Item("feature", n.features, 400, 60 * s.feature_minutes),
        # the target's continuations once (generation and prefill), then each candidate teacher-forced on them
        Item("continuations", int(n.cands > 0), 100 + (32 * t + o.prefill) * s.agree_limit),
        Item("agree", n.cands, 100 + AGREE_STEPS * t * s.agree_limit),
        Item("profile", 1, 100 + 80 * n.cands + (0 if "batch" in d else 500 * n.trained)),
    ]
    if o.lookups:
        all_temps = sum(1 for x in c.temperatures if x)  # the calibration covers every temperature asked for
        out += [Item("agree-lookup", 1, 150 + (72 * t + o.prefill) * s.tune_prompts), Item("tune", 3, 50)]
        more = Item("gen-data-more", 1, 100 + (52 + o.prefill) * s.gen_prompts)
        out += [] if "gen-data-more" in d else [more]
        out += [Item("calibrate", 1, s.tune_prompts * t * (10 + 15 * all_temps))] if n.sched else []
    return out


def _selecting(s: Sizes, cfg: DesignConfig, d: set[str], n: Counts, tok: float) -> list[Item]:
    """The selection grid, γ, their repeats, the temperatures, the batch dividend and the headline; `tok`: a prompt's
    steps per method, its new tokens and the prefill beyond what the factors include."""
    temps = sum(1 for x in cfg.temperatures if x)
    out = [
        Item("bench-select", 1, 100 + tok * s.bench_limit * (1 + 1.2 * n.benched + n.lookups + 0.8 * n.sched)),
        Item("bench-gamma", 1, 100 + tok * s.refine_limit * (1 + 3 * n.chosen)),
    ]
    if cfg.select_repeats:  # a tie re-measured: about two options beside AR
        out += [
            Item("bench-select-repeat", 1, tok * s.bench_limit * 3),
            Item("bench-gamma-repeat", 1, tok * s.refine_limit * (1 + 2 * n.chosen)),
        ]
    if temps:  # sampling: AR and SD about 1.1 each, the scheduled variant beside a lookup
        out.append(Item("bench-temps", 1, 100 + 1.1 * tok * s.refine_limit * temps * (3 if n.sched else 2)))
    if "batch" not in d:
        out.append(Item("bench-batch", n.trained, 100 + 18.4 * tok))
    if "headline" not in d:
        headline = 1 + n.chosen + 4 + (0.8 if n.sched else 0)
        out.append(Item("bench-headline", 1, 200 + tok * s.headline_limit * headline))
    return out


def _rows(o: Outline, s: Sizes, d: set[str], n: Counts, tok: float) -> list[Item]:
    """The llama.cpp rows and the lean rows (lean-int8, lean-q4): profile, lookup tuning and one grid each."""
    rows = 0 if "llama.cpp" in d else 1 if "extra-rows" in d else o.rows
    # a row's grid: draftwise AR, llama-cpp-python, llama-server plain, --spec-default and 4 spec types, each
    # candidate and its nearest built-in (model drafters rarely within reach of a lookup there), the scheduled ones;
    # about 0.7 AR steps of the lean engine per method and token (prompts ending early at EOS included)
    row_methods = 2 + 6 + 2 * (o.lookups + n.row_models) + n.sched
    out = []
    if rows:
        out += [
            Item("profile@", rows, 1500 + 300 * n.benched),
            Item("tune-lookup@", rows, 300),
            Item("bench-select@", rows, 200 + 0.7 * tok * s.bench_limit * row_methods),
        ]
    lean = sum(1 for e in o.lean_rows if e not in d)
    if lean:  # the lean engine at its rows' precisions (`lean_share`), no llama.cpp peers
        lean_methods = 1 + 1.2 * n.row_models + n.lookups + n.sched
        slower = o.lean_step / LEAN_FLOOR  # the profile's and tuning's figures were measured beside an fp32 study
        out += [
            Item("profile@lean", lean, (300 + 80 * n.benched) * slower),
            Item("tune-lookup@lean", lean, 300 * slower),
            Item("bench-select@lean", lean, 100 + o.lean_step * tok * s.bench_limit * lean_methods),
        ]
    return out


def lean_share(row: str, study: str) -> float:
    """A lean row's step in the study's steps: their weights' bytes a step, never below LEAN_FLOOR. A 1.7B target
    studied at q4: its int8 row's step is 1.4 of the study's, where an fp32 study's int8 row takes a third."""
    return max(LEAN_FLOOR, BYTES_PER_WEIGHT[row] / BYTES_PER_WEIGHT.get(study, BYTES_PER_WEIGHT["fp32"]))


def _finishing(o: Outline, s: Sizes, c: DesignConfig, d: set[str], n: Counts) -> list[Item]:
    """The last grid, quality, accuracy, reduced heads, and export with the report."""
    tok = (o.answer or c.max_new_tokens) + o.prefill
    # the last grid, whatever was dropped, at every temperature of the traffic: every runtime's plain decoding
    # (draftwise AR, and llama-server on each llama.cpp file) and each row's choice, about half an fp32 AR step per
    # method and token on average
    options = (2 * (1 + len(o.lean_rows)) + 3 * o.rows) * (o.temperatures or len(c.temperatures))
    out = [Item("bench-fastest", 1, 100 + 0.5 * tok * s.bench_limit * options)]
    if o.lean_rows or o.rows:  # teacher-forced passes over eval prompts, a few AR steps each, per runtime
        out.append(Item("quality", 1, 50 + (5 + o.prefill) * s.agree_limit * (1 + len(o.lean_rows) + o.rows)))
    if "accuracy" not in d:  # an item: a pass over its context per choice, prefill-bound like a prompt's prefill
        per_item = ACCURACY_ITEM_STEPS * (1 + o.prefill / REF_PREFILL_STEPS)
        out.append(Item("accuracy", 1, per_item * s.accuracy_items * 2 * (1 + n.cands)))
    if o.chosen_model and "reduced-heads" not in d:
        out.append(Item("reduced-heads", 1, 400 + 1.3 * tok * s.headline_limit * (4 + len(c.draft_vocabs))))
    if o.serve and "serve" not in d:
        out.append(_serve(o, s, tok))
    out.append(Item("finish", 1, 450 if o.chosen_model else 150))  # export (a model drafter's files) and report
    return out


SERVE_START_S = 10.0  # `draftwise serve` and llama-server started (imports, the target loaded and warmed), both


def _serve(o: Outline, s: Sizes, tok: float) -> Item:
    """The deploy command through `draftwise serve` beside llama-server's plain decoding (`served`): the headline's
    prompts and one warm-up each, at the seconds per token the last grid measured once it has (before it: about an AR
    step served and half of one for llama-server), plus the servers' start."""
    tokens = tok * (s.headline_limit + 1)
    if o.serve_token_s is None:
        return Item("bench-serve", 1, 100 + 1.5 * tokens, SERVE_START_S)
    return Item("bench-serve", 1, 100, SERVE_START_S + o.serve_token_s * tokens)


def kind_of(stage: str) -> str | None:
    """The cost kind of a finished stage (None: a decision, free)."""
    for prefix in ("profile@", "tune-lookup@", "bench-select@"):
        if stage.startswith(prefix):
            return prefix + "lean" if stage.startswith(prefix + "lean-") else prefix
    if stage.startswith("bench-serve@"):  # the served figure measured per temperature of the traffic (`served`)
        return "bench-serve"
    if stage.startswith("bench-select-repeat"):
        return "bench-select-repeat"
    if stage.startswith("bench-gamma-repeat"):
        return "bench-gamma-repeat"
    if stage in ("corpus-gain", "suffix-index", "tune-lookup"):
        return "tune"
    if stage == "calibrate-lookup":
        return "calibrate"
    if stage.startswith("bench-") and stage.endswith("-batch"):
        return "bench-batch"
    if stage in ("bench-vocab", "bench-adaptive"):
        return "reduced-heads"
    if stage.startswith(("prune-", "distill-", "feature-")):
        return stage.split("-")[0]
    if stage.startswith("agree-") and stage != "agree-lookup":
        return "agree"
    known = {
        "sweep",
        "gen-data",
        "teacher",
        "continuations",
        "gen-data-more",
        "profile",
        "agree-lookup",
        "bench-select",
        "bench-gamma",
        "bench-temps",
        "bench-headline",
        "accuracy",
        "bench-fastest",
        "bench-serve",
        "quality",
    }
    return stage if stage in known else None
