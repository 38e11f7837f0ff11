"""The design's candidates, built: the shape sweep and the trained shapes it picks, target data, each model
candidate's own stages (prune and distill, then agree: one executor item each per phase, the cuts' ranking between
them: `cut_stages`), the profile, and the lookup and hybrid candidates tuned on the target's own text (`lookup`).
`write_candidates` leaves them in the run folder for the report."""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from .. import cost
from ..config import (
    AgreeConfig,
    DesignConfig,
    DistillConfig,
    ProfileConfig,
    PruneConfig,
    SweepConfig,
    TeacherConfig,
    TrainFeatureConfig,
)
from ..executors import exclusive
from ..rundir import RunDir, write_atomic
from ..runtimes.base import ModelOptions
from ..runtimes.hf import model as hf
from ..runtimes.registry import load_drafter
from ..sd.families import drafter_kind
from ..shapes import Shape
from ..specs import split_hybrid
from ..stages import accuracy, agree, distill, feature, gen_data, profile, prune, sweep, teacher
from ..units import parse_count
from . import cut_stages, cuts, lookup, requests
from .candidates import FAMILY, FEATURE, Candidate, budget_shapes, choose_shapes
from .estimate import GAMMAS, SCREEN
from .measure import feasible_batch, held_weights
from .pipeline import CANDIDATES, Pipeline, Stages, runtime_options
from .sizes import Sizes


def spec_of(p: Stages, cand: Candidate) -> str:
    """What the engine loads for a candidate: its distilled checkpoint, its trained feature head, or the spec it is
    taken as."""
    if cand.role == FEATURE:
        return f"feature:{p.folder(f'feature-{cand.name}')}"
    if cand.source:  # a cut of the sibling drafts with its head on the target's most emitted tokens (`cuts`)
        more = cuts.more_stage(cand.name)  # the first-ranked cut, trained on from its pilot
        return str(p.folder(more if more in p.done else f"distill-{cand.name}") / "reduced")
    return str(p.folder(f"distill-{cand.name}")) if cand.trained else cand.spec


def candidate_stages(p: Stages, cand: Candidate, phase: str, n_cuts: int, prerank: bool = False) -> None:
    """One candidate's own stages of a `phase`: "train", prune and distill (trained shapes; a cut's pilot where
    `n_cuts` > 1, untrained with `prerank`) or the feature head's training, each on the teacher data; "agree",
    teacher-forced agreement."""
    if phase == "agree":
        p.stage(f"agree-{cand.name}", lambda f: agree.run(agree_config(p, spec_of(p, cand)), f))
    elif cand.role == FEATURE:
        feature_stage(p, cand)
    elif cand.source:
        cut_stages.distill_cut(p, cand, n_cuts, prerank)
    elif cand.trained:
        prune_distill(p, cand)


def agree_config(p: Stages, drafter: str) -> AgreeConfig:
    """A candidate's agreement: teacher-forced on the target's continuations, which the candidates share."""
    c = p.config
    return AgreeConfig(
        target=c.target,
        drafter=drafter,
        prompts=c.prompts,  # the traffic's own prompts where the user gave them (long ones included)
        max_prompt_tokens=2048 if c.prompts else 256,
        limit=p.sizes.agree_limit,
        max_new_tokens=c.max_new_tokens,
        gammas=GAMMAS,
        shared=str(p.folder("continuations")),
        **runtime_options(c),
    )


def feature_stage(p: Stages, cand: Candidate) -> None:
    """The feature-level head trained on the teacher data (its features) for the planned minutes."""
    c = p.config
    config = TrainFeatureConfig(
        target=c.target,
        data=str(p.folder("teacher")),
        minutes=p.sizes.feature_minutes,
        eval_prompts=16,
        seed=c.seed,
        **runtime_options(c),
    )
    p.stage(f"feature-{cand.name}", lambda f: feature.run(config, f))


def prune_distill(p: Stages, cand: Candidate) -> None:
    """A trained shape: pruned out of the target (calibrated on the teacher data), then distilled on it."""
    c, opts, teacher = p.config, runtime_options(p.config), str(p.folder("teacher"))
    prune_config = PruneConfig(
        target=c.target,
        shape=cand.prune_shape(),
        data=teacher,
        calib_tokens=1024,
        elimination_tokens=p.sizes.elimination_tokens,
        seed=c.seed,
        **opts,
    )
    p.stage(f"prune-{cand.name}", lambda f: prune.run(prune_config, f))
    distill_config = DistillConfig(
        target=c.target,
        drafter=str(p.folder(f"prune-{cand.name}")),
        data=teacher,
        loss=c.loss,
        minutes=p.sizes.distill_minutes,
        eval_prompts=16,
        eval_every=15,  # the stop rule fits its curve after the pilot: a few evaluations by then
        stop_below=needed_agreement(p, cand),
        seed=c.seed,
        **opts,
    )
    p.stage(f"distill-{cand.name}", lambda f: distill.run(distill_config, f))


def needed_agreement(p: Stages, cand: Candidate) -> float:
    """The agreement a trained shape must be predicted to reach, or its distillation stops after the pilot
    (`distill.stopped`): its break-even α at the draft cost the sweep's step model predicts for it, at its best γ, with
    a verify pass no dearer than one AR step — optimistic, so a drafter stopped could not pay whatever its verify cost.
    0 (never stopped) without a sweep fit."""
    path = p.folder("sweep") / "sweep.json"
    sweep = json.loads(path.read_text()) if path.exists() else {"fits": {}, "rows": []}
    fit = sweep["fits"].get("1")
    ref = [r["step_ms"] / r["c"] for r in sweep["rows"] if r["batch"] == 1 and r["c"]]
    if not fit or not ref or cand.shape is None:
        return 0.0
    return cost.optimistic_break_even(cost.StepModel.from_dict(fit).predict_ms(cand.shape) / statistics.median(ref))


@dataclass(frozen=True)
class CandidateWork:
    """The executor's recipe for one candidate's stages: items are (candidate, done records so far); the result is
    the done records the candidate's stages wrote."""

    config: DesignConfig
    stages: str
    sizes: Sizes
    phase: str  # "train" | "agree" (`candidate_stages`)
    n_cuts: int
    prerank: bool = False  # the cuts are ranked before training, not piloted (`cuts`)

    def __call__(self):
        if self.config.threads:
            torch.set_num_threads(self.config.threads)

        def run_candidate(item: tuple[Candidate, dict]) -> list[dict]:
            cand, done = item
            records: list[dict] = []
            stages = Stages(self.config, Path(self.stages), dict(done), records.append, self.sizes)
            candidate_stages(stages, cand, self.phase, self.n_cuts, self.prerank)
            return records

        return run_candidate


def teacher_config(p: Pipeline) -> TeacherConfig:
    """The teacher data every trained candidate learns from: the target's continuations (gen-data), the user's text,
    then the packaged suites' train split, scored teacher-forced up to the planned tokens."""
    c = p.config
    cut = cuts.source(c) is not None
    return TeacherConfig(
        target=c.target,
        precision=c.dtype if cut else "auto",  # a sibling's cuts learn the target as it is deployed
        # gen-data's shards hold the studied target's top-k already: a cut reads them beside the teacher's text (a
        # feature head needs the target's features at those positions too, so they are scored again for it)
        continuations=None if cut else str(p.folder("gen-data")),
        text=c.text,
        tokens=p.sizes.teacher_tokens,
        seed=c.seed,
        device=c.device,
        threads=c.threads,
    )


def build(p: Pipeline, cands: list[Candidate], prerank: bool = False) -> dict[str, str]:
    """Target data, then every candidate's own stages (each candidate an executor item); {name: drafter spec}, less
    the cut ranked second before training (`prerank`: `cuts.passed_over`)."""
    opts = runtime_options(p.config)
    p.stage("gen-data", lambda f: gen_data.run(lookup.gen_data_config(p, opts, p.sizes.gen_prompts), f))
    if any(x.trained or x.role == FEATURE for x in cands):
        # sized again once gen-data's time is known: where it overran (a host slower than the probe found it) the
        # build plan's teacher ate the minutes its distillation was to have (a Zen 3 run: 0.9 minutes of it left)
        if "teacher" not in p.done:
            p.replan("teacher")
        p.stage("teacher", lambda f: teacher.run(teacher_config(p), f))
    p.replan("train")
    todo = [cand for cand in cands if f"agree-{cand.name}" not in p.done]
    if todo:  # the target's continuations, generated once for every candidate's agreement
        p.stage("continuations", lambda f: agree.share(agree_config(p, spec_of(p, todo[0])), f))
    n_cuts = sum(1 for x in cands if x.source)
    run_items(p, CandidateWork(p.config, str(p.stages), p.sizes, "train", n_cuts, prerank), todo)
    if todo:
        cut_stages.focus(p, cands, prerank)
    out = cuts.passed_over(p.done.get("focus-cuts"))
    todo, cands = [x for x in todo if x.name not in out], [x for x in cands if x.name not in out]
    run_items(p, CandidateWork(p.config, str(p.stages), p.sizes, "agree", n_cuts, prerank), todo)
    return {cand.name: spec_of(p, cand) for cand in cands}


def run_items(p: Pipeline, work: CandidateWork, cands: list[Candidate]) -> None:
    """Each candidate's stages of one phase as an executor item; the driver records what the items finished."""
    items = [(cand, dict(p.done)) for cand in cands]
    for _, records in p.executor.map(work, items, exclusive(p.config.device, p.config.threads)):
        for record in records:
            p.add(record)


def budget(config: DesignConfig, target: Shape) -> int:
    """The drafters' non-embedding parameter budget: `--budget`, or that of the target's first `--wide-layers` (2)."""
    if config.budget:
        return parse_count(config.budget)
    return replace(target, layers=min(config.wide_layers or (2,))).params()["non_embedding"]


def sweep_shapes(p: Pipeline, target: Shape) -> tuple[Shape, Shape] | None:
    """The shape sweep (random weights: latency needs no training), then — unless `--wide-layers` overrides — the
    trained shapes from its fitted step model: the predicted-fastest at the budget and its control (a record)."""
    c, opts, n = p.config, runtime_options(p.config), budget(p.config, target)
    unit = target.head_dim * target.heads // target.kv_heads  # widths keep whole GQA groups
    widths = tuple(sorted({max(unit, round(target.hidden * m / unit) * unit) for m in (1 / 3, 2 / 3, 1, 4 / 3)}))
    depths = tuple(s.layers for s in budget_shapes(target, n) if s.layers in (1, 2, 3, 4, 6, 8, 12, 16))
    shallow = max(1, round(n / target.layer_params()))
    p.stage(
        "sweep",
        lambda f: sweep.run(
            SweepConfig(
                target=c.target,
                budget=str(n),
                layers=depths,
                widths=widths,
                width_depth=shallow,
                truncations=(),
                batches=(1,),
                warmup=2,
                repeats=5,
                seed=c.seed,
                **opts,
            ),
            f,
            p.executor,
        ),
    )
    if c.wide_layers:
        return None

    def decide(folder) -> dict:
        fit = json.loads((p.folder("sweep") / "sweep.json").read_text())["fits"]["1"]
        model = cost.StepModel.from_dict(fit)
        ranking = sorted(budget_shapes(target, n), key=model.predict_ms)
        fast, control = choose_shapes(target, n, model, c.narrow_factor)
        return {
            "budget": n,
            "head": target.vocab,
            "fit": fit,
            "shapes": [fast.__dict__, control.__dict__],
            "ranking": [{**s.__dict__, "predicted_ms": model.predict_ms(s)} for s in ranking],
            "predicted_ms": [model.predict_ms(fast), model.predict_ms(control)],
        }

    chosen = p.stage("choose-shapes", decide)["shapes"]
    return Shape(**chosen[0]), Shape(**chosen[1])


def measure_costs(p: Pipeline, target, target_shape: Shape, specs: dict[str, str], cands: list[Candidate]) -> None:
    """Profile at batch 1 and at each trained candidate's feasible batch (for γ* there), at the traffic's context."""
    c, opts = p.config, runtime_options(p.config)
    depths = tuple(k for k in (1, 2, 4, 8) if k < target_shape.layers)
    held = held_weights(p, target, specs, cands)
    batches = (1,) + tuple(
        sorted(
            {
                b
                for x in cands
                if x.name in held
                for b in [feasible_batch(c, held["target"] + held[x.name], target_shape, x.shape)[1]]
                if b > 1
            }
        )
    )
    p.stage(
        "profile",
        lambda f: profile.run(
            ProfileConfig(
                target=c.target,
                drafters=tuple(specs.values()),
                depths=depths,
                gammas=GAMMAS,
                batches=batches,
                warmup=2,
                repeats=7,
                context=requests.context(c, target),
                seed=c.seed,
                **opts,
            ),
            f,
            p.executor,
        ),
    )


def screen(cands: list[Candidate], best: dict[str, tuple[int, float]]) -> list[Candidate]:
    """The model candidates worth a benchmark: trained ones, the feature head and the user's always (the wide-vs-deep
    comparison, the feature-level family, the user's question), untrained baselines only when the cost model cannot
    rule them out (≥ SCREEN of the best)."""
    top = max(v for _, v in best.values())
    always = ("user", FEATURE, FAMILY)
    return [x for x in cands if x.trained or x.role in always or best[x.name][1] >= SCREEN * top]


def lookup_candidates(
    p: Pipeline, target, cands: list[Candidate], specs: dict[str, str], best: dict[str, tuple[int, float]]
) -> list[Candidate]:
    """Texts, corpus gain (and gen-data-more), the suffix index, then every lookup family's tuned candidate and the
    hybrid."""
    opts = runtime_options(p.config)
    lookup.lookup_text(p, opts)
    lookup.corpus_gain(p, opts, p.sizes.gen_prompts)
    lookup.suffix_index(p, target)
    top = max(cands, key=lambda x: best[x.name][1])
    tuned = lookup.tune(p, target, (top.name, specs[top.name], best[top.name][0]))
    return [Candidate(name, role, spec=spec) for name, role, spec in lookup.tuned_candidates(tuned)]


def kv_bytes(p: Pipeline, cands: list[Candidate], specs: dict[str, str]) -> dict[str, int]:
    """Each candidate's drafter KV cache per sequence at `context` (a lookup holds none; a hybrid its model's)."""
    drafters = json.loads((p.folder("profile") / "profile.json").read_text())["batches"]["1"]["drafters"]
    bpv = hf.bytes_per_value(p.config.dtype)
    model = {
        x.name: Shape(**drafters[specs[x.name]]["shape"]).kv_bytes(p.config.context, 1, bpv)
        for x in cands
        if drafter_kind(specs[x.name]) == "model"
    }
    by_spec = {specs[n]: v for n, v in model.items()}
    hybrid = {x.name: by_spec.get(split_hybrid(specs[x.name])[0], 0) for x in cands if x.role == "hybrid"}
    return {**model, **hybrid}


def measure_accuracy(config: DesignConfig, target, specs: dict[str, str], folder: Path, options: ModelOptions) -> None:
    """MMLU and HellaSwag log-likelihood accuracy of the target and every drafter; records resume per item."""

    run_dir = RunDir(folder, config)
    done = {(r["model"], r["task"], r["item"]) for r in run_dir.records()}
    tasks = {task: accuracy.items(task, target, config.accuracy_items) for task in accuracy.TASKS}
    for name, spec in {"target": None, **specs}.items():
        lm = target.lm if spec is None else load_drafter(spec, target, options).lm
        todo = [(task, it) for task, its in tasks.items() for it in its if (name, task, it.id) not in done]
        for task, item in tqdm(
            todo, desc=f"accuracy {name}", unit="item", file=sys.stderr, dynamic_ncols=True, disable=not todo
        ):
            run_dir.append({"model": name, "task": task, **accuracy.score(lm, item)})


def write_candidates(p: Pipeline, cands: list[Candidate], specs: dict[str, str]) -> None:
    """Every candidate the design measured, and the spec of each option (scheduled ones included), for the report."""
    rows = [
        {"name": x.name, "role": x.role, "spec": x.spec, "shape": asdict(x.shape) if x.shape else None}
        | {"source": x.source}
        for x in cands
    ]
    write_atomic(p.path / CANDIDATES, json.dumps({"candidates": rows, "specs": specs}, indent=1) + "\n")


def read_candidates(folder) -> tuple[list[Candidate], dict[str, str]]:
    """`write_candidates`' file, as Candidates and specs."""
    saved = json.loads((folder.path / CANDIDATES).read_text())
    cands = [
        Candidate(r["name"], r["role"], Shape(**r["shape"]) if r["shape"] else None, r["spec"], r.get("source", ""))
        for r in saved["candidates"]
    ]
    return cands, saved["specs"]
