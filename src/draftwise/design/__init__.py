"""`draftwise design`: the paper's study, run for one target on this machine, ending in a verdict: which drafter, with
which settings, and how fast.

  sweep → trained shapes from its fitted step model → gen-data → prune + distill each model candidate → agree →
  profile → lookup candidates (texts, corpus gain,
  gen-data-more, suffix index, tuned n-gram / suffix / hybrid settings; see `lookup`) → bench (one interleaved grid of
  every candidate beside AR, then γ*, temperatures, the batch dividend and the headline against transformers; see
  `measure`) → per engine (lean-int8 and llama.cpp rows: profile, lookup tuning, one grid — on llama.cpp beside
  llama-server's built-ins — a verdict each; see `engines`) → the fastest (every runtime's plain decoding and each
  row's choice in one grid: the design's answer, see `fastest`) → accuracy → export → reduced heads (model drafters)
  → report

Every stage writes its own run folder under `stages/` and, when finished, one `done` record in this folder's
records.jsonl; a rerun skips finished stages and resumes the unfinished one from its own folder, so a kill at any
point loses no finished work. Decisions (chosen drafter, γ*, lookup settings, more gen-data) are records too, so a
rerun never re-decides them.

`--minutes` is the whole run's budget (`plan`): before each phase the stages still to come are sized to the time
left, from timings measured as the run goes; each phase's plan is a record too.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from .. import cost
from ..config import (AgreeConfig, DesignConfig, DistillConfig, ProfileConfig, PruneConfig, QualityConfig,
                       SweepConfig, drafter_kind)
from ..executors import Executor, InProcess, exclusive
from ..models import ModelOptions, hf, load, load_drafter
from ..rundir import RunDir, write_atomic
from ..specs import split_hybrid
from ..stages import accuracy, agree, bench, distill, gen_data, profile, prune, quality, sweep  # noqa: F401  (stages it calls)
from . import export_rows, rows, fastest, lookup, measure, verdict
from .plan import Planner, Sizes, nominal
from .candidates import Candidate, budget_shapes, candidates, choose_shapes
from .measure import batch_dividend, feasible_batch  # noqa: F401  (the design's API)

GAMMAS = (1, 2, 3, 4, 6, 8)
SCREEN = 0.9  # an untrained model drafter predicted below this share of the best model drafter is not benchmarked


class Stages:
    """Which stages are done and where each one's folder is; `stage` runs one unless it is done, writes its done
    record into the stage's own folder (done.json) and hands it to `on_done`. A worker (see `CandidateWork`) holds
    one of these without the run folder: it returns its records to the driver, which alone appends to
    records.jsonl; a done.json whose item never returned (a kill) is collected by the next `Pipeline`."""

    def __init__(self, config: DesignConfig, stages: Path, done: dict[str, dict], on_done: Callable[[dict], None],
                 sizes: Sizes):
        self.config, self.stages, self.done, self.on_done, self.sizes = config, stages, done, on_done, sizes

    def folder(self, name: str) -> Path:
        return self.stages / name

    def progress(self) -> str:
        return ""

    def stage(self, name: str, work, **decision) -> dict:
        """Run `work(folder)` unless `name` is finished; returns the stage's done record."""
        if name in self.done:
            return self.done[name]
        print(f"[design] {name} ...{self.progress()}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        result = work(self.folder(name))
        result = result if isinstance(result, dict) else {}  # stage runs return their folder; decisions a dict
        record = {"event": "done", "stage": name, "folder": str(self.folder(name)), **decision, **result,
                  "seconds": time.perf_counter() - start}
        self.folder(name).mkdir(parents=True, exist_ok=True)
        write_atomic(self.folder(name) / "done.json", json.dumps(record) + "\n")
        self.done[name] = record
        self.on_done(record)
        return record


class Pipeline(Stages):
    """The design run folder: config.json, and one done record per finished stage in records.jsonl. `base`: the
    config the user gave; `config`: the one the current phase's stages read (its planned sizes)."""

    def __init__(self, config: DesignConfig, out: str | Path, executor: Executor | None = None,
                 started: float | None = None):
        self.dir, self.executor = RunDir(out, config), executor or InProcess()  # where every stage's items run
        self.base, records, self.trained = config, self.dir.records(), 2  # trained: `know` updates it
        done = {r["stage"]: r for r in records if r.get("event") == "done"}
        super().__init__(config, self.dir.path / "stages", done, self._append, nominal(config, 2))
        self.planner = Planner(self, records, started) if config.plan else None
        for marker in sorted(self.stages.glob("*/done.json")):  # finished in an item that was killed before returning
            self.add(json.loads(marker.read_text()))

    def _append(self, record: dict) -> None:
        if self.planner:  # its kind, prediction and time, which the planner's corrections learn from
            record = self.done[record["stage"]] = self.planner.stamp(record)
        self.dir.append(record)

    def add(self, record: dict) -> None:
        """A done record a worker returned."""
        if record["stage"] not in self.done:
            self.done[record["stage"]] = record
            self._append(record)

    def progress(self) -> str:
        return self.planner.progress() if self.planner else ""

    def know(self, **outline) -> None:
        """Figures of the run's shape now known (`plan.Outline`)."""
        self.trained = outline.get("trained", self.trained)
        if self.planner:
            self.planner.know(**outline)

    def replan(self, phase: str, **outline) -> None:
        """Size the stages from `phase` on (`plan`); without a budget plan, the full sizes and nothing dropped."""
        self.know(**outline)
        if self.planner is None:
            self.sizes = nominal(self.base, self.trained)
            return
        self.sizes = self.planner.plan(phase)
        self.config = self.sizes.config(self.base)

    def dropped(self, name: str) -> bool:
        return name in self.sizes.dropped


def _options(config: DesignConfig) -> dict:
    return {"dtype": config.dtype, "device": config.device, "threads": config.threads}


def spec_of(p: Stages, cand: Candidate) -> str:
    """What the engine loads for a candidate: its distilled checkpoint, or the spec it is taken as."""
    return str(p.folder(f"distill-{cand.name}")) if cand.trained else cand.spec


def candidate_stages(p: Stages, cand: Candidate) -> None:
    """One candidate's own stages: prune and distill (trained candidates), then teacher-forced agreement."""
    c, opts = p.config, _options(p.config)
    if cand.trained:
        p.stage(f"prune-{cand.name}", lambda f: prune.run(PruneConfig(
            target=c.target, shape=cand.prune_shape(), calib_tokens=384, elimination_tokens=p.sizes.elimination_tokens,
            seed=c.seed, **opts), f))
        p.stage(f"distill-{cand.name}", lambda f: distill.run(DistillConfig(
            target=c.target, drafter=str(p.folder(f"prune-{cand.name}")), data=str(p.folder("gen-data")), loss=c.loss,
            minutes=p.sizes.distill_minutes, eval_prompts=16, eval_every=50, seed=c.seed, **opts), f))
    p.stage(f"agree-{cand.name}", lambda f: agree.run(AgreeConfig(
        target=c.target, drafter=spec_of(p, cand), limit=p.sizes.agree_limit, max_new_tokens=c.max_new_tokens, gammas=GAMMAS, **opts), f))


@dataclass(frozen=True)
class CandidateWork:
    """The executor's recipe for one candidate's stages: items are (candidate, done records so far); the result is
    the done records the candidate's stages wrote."""

    config: DesignConfig
    stages: str
    sizes: Sizes

    def __call__(self):
        if self.config.threads:
            torch.set_num_threads(self.config.threads)

        def run_candidate(item: tuple[Candidate, dict]) -> list[dict]:
            cand, done = item
            records: list[dict] = []
            candidate_stages(Stages(self.config, Path(self.stages), dict(done), records.append, self.sizes), cand)
            return records

        return run_candidate


def build(p: Pipeline, cands: list[Candidate]) -> dict[str, str]:
    """Target data, then every candidate's own stages (each candidate an executor item); {name: drafter spec}."""
    opts = _options(p.config)
    p.stage("gen-data", lambda f: gen_data.run(lookup.gen_data_config(p, opts, p.sizes.gen_prompts), f))
    p.replan("train")
    todo = [(cand, dict(p.done)) for cand in cands if f"agree-{cand.name}" not in p.done]
    work = CandidateWork(p.config, str(p.stages), p.sizes)
    for _, records in p.executor.map(work, todo, exclusive(p.config.device, p.config.threads)):
        for record in records:
            p.add(record)
    return {cand.name: spec_of(p, cand) for cand in cands}


def budget(config: DesignConfig, target: cost.Shape) -> int:
    """The drafters' non-embedding parameter budget: `--budget`, or that of the target's first `--wide-layers` (2)."""
    if config.budget:
        return cost.parse_count(config.budget)
    return replace(target, layers=min(config.wide_layers or (2,))).params()["non_embedding"]


def sweep_shapes(p: Pipeline, target: cost.Shape) -> tuple[cost.Shape, cost.Shape] | None:
    """The shape sweep (random weights: latency needs no training), then — unless `--wide-layers` overrides — the
    trained shapes from its fitted step model: the predicted-fastest at the budget and its control (a record)."""
    c, opts, n = p.config, _options(p.config), budget(p.config, target)
    unit = target.head_dim * target.heads // target.kv_heads  # widths keep whole GQA groups
    widths = tuple(sorted({max(unit, round(target.hidden * m / unit) * unit) for m in (1 / 3, 2 / 3, 1, 4 / 3)}))
    depths = tuple(s.layers for s in budget_shapes(target, n) if s.layers in (1, 2, 3, 4, 6, 8, 12, 16))
    shallow = max(1, round(n / target.layer_params()))
    p.stage("sweep", lambda f: sweep.run(SweepConfig(
        target=c.target, budget=str(n), layers=depths, widths=widths, width_depth=shallow, truncations=(), batches=(1,),
        warmup=2, repeats=5, seed=c.seed, **opts), f, p.executor))
    if c.wide_layers:
        return None

    def decide(folder) -> dict:
        fit = json.loads((p.folder("sweep") / "sweep.json").read_text())["fits"]["1"]
        model = cost.StepModel.from_dict(fit)
        ranking = sorted(budget_shapes(target, n), key=model.predict_ms)
        fast, control = choose_shapes(target, n, model, c.narrow_factor)
        return {"budget": n, "head": target.vocab, "fit": fit, "shapes": [fast.__dict__, control.__dict__],
                "ranking": [{**s.__dict__, "predicted_ms": model.predict_ms(s)} for s in ranking],
                "predicted_ms": [model.predict_ms(fast), model.predict_ms(control)]}

    chosen = p.stage("choose-shapes", decide)["shapes"]
    return cost.Shape(**chosen[0]), cost.Shape(**chosen[1])


def measure_costs(p: Pipeline, target_shape: cost.Shape, specs: dict[str, str], cands: list[Candidate]) -> None:
    """Profile at batch 1 and at each trained candidate's feasible batch (for γ* there)."""
    c, opts = p.config, _options(p.config)
    depths = tuple(k for k in (1, 2, 4, 8) if k < target_shape.layers)
    batches = (1,) + tuple(sorted({b for x in cands if x.trained and not p.dropped("batch")
                                   for b in [feasible_batch(c, target_shape, x.shape)[1]] if b > 1}))
    p.stage("profile", lambda f: profile.run(ProfileConfig(
        target=c.target, drafters=tuple(specs.values()), depths=depths, gammas=GAMMAS, batches=batches, warmup=2,
        repeats=7, seed=c.seed, **opts), f, p.executor))


def predicted(p: Pipeline, spec: str, name: str, batch: int = 1, profile: str = "profile") -> dict[int, float]:
    """Predicted greedy tokens/s per γ (per sequence, at `batch`): the exact greedy TAR replayed from `agree` over
    step and verify times measured at that batch by `profile` (a profile stage: each engine has its own). Empty when
    the profile has no such batch."""
    prof = json.loads((p.folder(profile) / "profile.json").read_text())["batches"].get(str(batch))
    if prof is None:
        return {}
    tar = json.loads((p.folder(f"agree-{name}") / "agree.json").read_text())["predicted_greedy_tar"]
    verify = {int(g): ms for g, ms in prof["verify_ms"].items()}
    step = prof["drafters"][spec]["step_ms"]
    return {g: 1e3 * cost.throughput(tar[str(g)], g, step, verify[g]) for g in GAMMAS if tar.get(str(g))}


def best_gamma(p: Pipeline, spec: str, name: str, profile: str = "profile") -> tuple[int, float]:
    """(γ*, its predicted tokens/s) of a model candidate at batch 1."""
    pred = predicted(p, spec, name, profile=profile)
    return max(pred.items(), key=lambda kv: kv[1]) if pred else (1, 0.0)


def screen(cands: list[Candidate], best: dict[str, tuple[int, float]]) -> list[Candidate]:
    """The model candidates worth a benchmark: trained ones and the user's always (the wide-vs-deep comparison, the
    user's question), untrained baselines only when the cost model cannot rule them out (≥ SCREEN of the best)."""
    top = max(v for _, v in best.values())
    return [x for x in cands if x.trained or x.role == "user" or best[x.name][1] >= SCREEN * top]


def lookup_candidates(p: Pipeline, target, cands: list[Candidate], specs: dict[str, str],
                      best: dict[str, tuple[int, float]]) -> list[Candidate]:
    """Texts, corpus gain (and gen-data-more), the suffix index, then tuned n-gram, suffix and hybrid candidates."""
    opts = _options(p.config)
    lookup.lookup_text(p, opts)
    lookup.corpus_gain(p, opts, p.sizes.gen_prompts)
    lookup.suffix_index(p, target)
    top = max(cands, key=lambda x: best[x.name][1])
    tuned = lookup.tune(p, target, (top.name, specs[top.name], best[top.name][0]))
    roles = {"ngram": "lookup", "suffix": "lookup", "hybrid": "hybrid"}
    return [Candidate(m, roles[m], spec=tuned[m]["spec"]) for m in ("ngram", "suffix", "hybrid") if m in tuned]


def kv_bytes(p: Pipeline, cands: list[Candidate], specs: dict[str, str]) -> dict[str, int]:
    """Each candidate's drafter KV cache per sequence at `context` (a lookup holds none; a hybrid its model's)."""
    drafters = json.loads((p.folder("profile") / "profile.json").read_text())["batches"]["1"]["drafters"]
    bpv = hf.bytes_per_value(p.config.dtype)
    model = {x.name: cost.Shape(**drafters[specs[x.name]]["shape"]).kv_bytes(p.config.context, 1, bpv)
             for x in cands if drafter_kind(specs[x.name]) == "model"}
    by_spec = {specs[n]: v for n, v in model.items()}
    hybrid = {x.name: by_spec.get(split_hybrid(specs[x.name])[0], 0) for x in cands if x.role == "hybrid"}
    return {**model, **hybrid}


def run(config: DesignConfig, out: str | Path, executor: Executor | None = None, started: float | None = None) -> Path:
    """`started`: when the budget's clock started (`time.monotonic()`; the CLI's start, default now)."""
    if config.threads:
        torch.set_num_threads(config.threads)
    p = Pipeline(config, out, executor, started)
    options = ModelOptions(config.dtype, config.device)
    target = load(config.target, options)
    if p.planner:
        p.planner.measure(target)
    p.replan("start")  # a budget too small is refused here, before any stage
    target_shape = cost.Shape.of(target.config)
    shapes = sweep_shapes(p, target_shape) if not p.dropped("training") else None
    p.replan("build")
    trains = not p.dropped("training")  # the budget may leave only untrained and lookup drafters
    if not trains:
        shapes = None
    elif shapes and p.dropped("control"):
        shapes = shapes[:1]
    cands = candidates(target_shape, config.wide_layers if trains else (), config.narrow_factor, config.drafter, shapes)
    n_trained = sum(x.trained for x in cands)
    p.know(trained=n_trained, untrained=len(cands) - n_trained, benched=n_trained + bool(config.drafter), built=True)
    specs = build(p, cands)
    measure_costs(p, target_shape, specs, cands)
    best = {x.name: best_gamma(p, specs[x.name], x.name) for x in cands}
    benched = screen(cands, best)
    gammas = {x.name: best[x.name][0] for x in cands}
    scheduled: dict[str, str] = {}  # scheduled option -> its static candidate
    p.replan("lookups", benched=len(benched))
    if config.lookups:
        tuned = lookup_candidates(p, target, cands, specs, best)
        done = p.done["tune-lookup"]
        specs.update({x.name: x.spec for x in tuned})
        gammas.update({x.name: done[x.name]["gamma"] for x in tuned})
        cands, benched = cands + tuned, benched + tuned
        if p.config.scheduler:
            lookup.calibrate_lookups(p, target, done)
            scheduled = lookup.scheduled_options(done)
    kv = kv_bytes(p, cands, specs)
    p.replan("select")
    selectable = {**{x.name: specs[x.name] for x in benched}, **{s: specs[m] for s, m in scheduled.items()}}
    chosen, gamma = measure.select(p, selectable, {n: gammas[scheduled.get(n, n)] for n in selectable}, kv, scheduled)
    specs.update({s: specs[m] for s, m in scheduled.items()})
    p.replan("temperatures", chosen_model=drafter_kind(specs[chosen]) == "model")
    measure.temperatures(p, specs[chosen], gamma)
    p.replan("batch")
    if not p.dropped("batch"):
        measure.batch_dividend(p, target_shape, specs, cands, predicted)
    p.replan("headline")
    if not p.dropped("headline"):
        measure.headline(p, specs[chosen], gamma, measure.method_of(p, chosen))
    outcome = p.stage("verdict", lambda f: verdict.decide(p, gamma))
    lean_models = {x.name: specs[x.name] for x in benched if x.role not in ("lookup", "hybrid")}
    row_verdicts = []
    p.replan("rows")
    for i, e in enumerate(rows.planned(p.config)):
        if i:  # each further row planned with what the ones before it took
            p.replan(f"row-{e.name}")
        if not rows.dropped(p, e):
            row_verdicts.append(rows.run_row(p, e, target, lean_models, config.lookups, predicted))
    p.replan("fastest")
    lossy = tuple(rows.quality_runtime(e) for e in rows.planned(p.base))
    if lossy:  # what each lossy runtime costs in quality, reported wherever its speed is
        p.stage("quality", lambda f: quality.run(QualityConfig(
            target=config.target, runtimes=lossy, limit=p.sizes.agree_limit, threads=config.threads), f))
    final = fastest.run(p)  # every runtime's plain decoding and each row's choice, side by side
    models = {x.name: specs[x.name] for x in cands if x.role not in ("lookup", "hybrid")}
    p.replan("accuracy")
    if not p.dropped("accuracy"):
        p.stage("accuracy", lambda f: measure_accuracy(p.config, target, models, f, options))
    from . import report
    from .export import export, export_reduced

    full = export(p, target, outcome, final)
    export_rows.export_rows(p.dir.path / "export", row_verdicts, p.base, final, fastest.row_verdicts(p), rows.quality_of(p))
    p.replan("reduced-heads")
    if drafter_kind(specs[chosen]) == "model" and (p.config.draft_vocabs or p.config.adaptive):
        spec, n = measure.tune_head(p, full, target_shape.vocab, gamma)
        if n:
            export_reduced(p, Path(spec))
    path = report.write(p, cands, specs)
    print(f"report: {path}\nrun folder: {p.dir.path}")
    return p.dir.path


def measure_accuracy(config: DesignConfig, target, specs: dict[str, str], folder: Path, options: ModelOptions) -> None:
    """MMLU and HellaSwag log-likelihood accuracy of the target and every drafter; records resume per item."""
    from tqdm import tqdm

    run_dir = RunDir(folder, config)
    done = {(r["model"], r["task"], r["item"]) for r in run_dir.records()}
    tasks = {task: accuracy.items(task, target, config.accuracy_items) for task in accuracy.TASKS}
    for name, spec in {"target": None, **specs}.items():
        lm = target.lm if spec is None else load_drafter(spec, target, options).lm
        todo = [(task, it) for task, its in tasks.items() for it in its if (name, task, it.id) not in done]
        for task, item in tqdm(todo, desc=f"accuracy {name}", unit="item", file=sys.stderr, dynamic_ncols=True,
                               disable=not todo):
            run_dir.append({"model": name, "task": task, **accuracy.score(lm, item)})
