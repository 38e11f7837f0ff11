"""`draftwise design`: the paper's study, run for one target on this machine, ending in a verdict: which drafter, with
which settings, and how fast.

  sweep → trained shapes from its fitted step model → gen-data → prune + distill each model candidate → agree →
  profile → lookup candidates (texts, corpus gain,
  gen-data-more, suffix index, tuned n-gram / suffix / hybrid settings; see `lookup`) → bench (one interleaved grid of
  every candidate beside AR, then γ*, temperatures, the batch dividend and the headline against transformers; see
  `measure`) → per row (lean-int8 and llama.cpp runtimes: profile, lookup tuning, one grid — on llama.cpp beside
  llama-server's built-ins — a verdict each; see `rows`) → the fastest (every runtime's plain decoding and each
  row's choice in one grid: the design's answer, see `fastest`) → export (serve.json: the deploy command of a
  draftwise-engine verdict, see `deploy`) → served (that command measured through draftwise serve's HTTP API, beside
  llama-server; see `served`) → accuracy → reduced heads (model drafters) → report

Each phase is a function below; the run folder and its resume rules are `pipeline`'s; the report renders from the
finished folder alone (`report.render`).

`--minutes` is the whole run's budget (`plan`): before each phase the stages still to come are sized to the time
left, from timings measured as the run goes; each phase's plan is a record too.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import machine
from ..config import DesignConfig, QualityConfig
from ..executors import Executor
from ..isolate import NativeCrash
from ..runtimes.base import Model, ModelOptions, put_down
from ..runtimes.registry import load, runtime
from ..sd.families import drafter_kind
from ..shapes import Shape
from ..stages import quality
from ..targets import vocab_map
from ..targets.checkpoint import config_and_tokenizer
from ..targets.named import family_model
from ..targets.source import resolve
from ..targets.spec import parse
from . import (
    build,
    cuts,
    export,
    export_rows,
    fastest,
    lookup,
    measure,
    report,
    requests,
    row_verdict,
    rows,
    served,
    verdict,
)
from .candidates import FEATURE, Candidate, candidates, family_drafter
from .estimate import best_gamma
from .measure import batch_dividend, feasible_batch  # noqa: F401  (the design's API)
from .pipeline import DesignFolder, Pipeline  # noqa: F401  (the design's API)

FAMILY = ("smollm2-135m", "default")  # the family candidate's name and spec: the packaged default model


@dataclass
class Pool:
    """The candidates a design measures, as the phases find them: `specs` what each one loads (a scheduled option
    the spec of its static candidate), `gammas` its γ, `benched` those the selection grid runs, `scheduled` each
    scheduled option's static candidate."""

    cands: list[Candidate]
    specs: dict[str, str]
    gammas: dict[str, int] = field(default_factory=dict)
    benched: list[Candidate] = field(default_factory=list)
    scheduled: dict[str, str] = field(default_factory=dict)
    best: dict[str, tuple[int, float]] = field(default_factory=dict)  # model candidates: (γ*, predicted tokens/s)


def run(
    config: DesignConfig,
    out: str | Path,
    executor: Executor | None = None,
    started: float | None = None,
    retry_died: bool = False,
) -> Path:
    """`started`: when the budget's clock started (`time.monotonic()`; the CLI's start, default now); `retry_died`:
    measure again the rows that died in an earlier run (`pipeline`)."""
    if config.threads:
        torch.set_num_threads(config.threads)
    p = Pipeline(config, out, executor, started, retry_died)
    config = p.base  # --dtype auto decided (`study`)
    p.know(**requests.outline(config))  # the traffic's temperatures and answer length: what the last grid measures
    machine_facts(p)
    rows.forget(p)  # rows that died in an earlier run are not planned for
    options = ModelOptions(config.dtype, config.device)
    reload = functools.partial(load, config.target, options)
    target = reload()
    if p.planner:
        p.planner.measure(target, reload)
    p.replan("start")  # a budget too small is refused here, before any stage
    shape = Shape.of(target.config)
    pool = model_candidates(p, target, shape, reload)
    lookup_candidates(p, target, pool)
    chosen, gamma = select(p, pool, shape)
    outcome = p.stage("verdict", lambda f: verdict.decide(p, gamma))
    verdicts = per_row(p, target, pool)
    final = answer(p)
    full = export.export(p, target, outcome, final)
    export_rows.export_rows(
        p.path / "export", verdicts, p.base, final, fastest.row_verdicts(p), rows.quality_of(p), p.dead
    )
    served.run(p, final)  # the answer's deploy command through draftwise serve's HTTP API, beside llama-server
    accuracy(p, target, pool)  # after the served figure: a sanity check absorbs an earlier overrun, not the deploy
    reduced_heads(p, pool.specs[chosen], full, shape.vocab, gamma)
    build.write_candidates(p, pool.cands, pool.specs)
    path = report.write(DesignFolder(p.path))
    for row, d in sorted(p.dead.items()):
        print(f"[design] {row} was not measured: {d['reason']} (rerun with --retry-died to measure it again)")
    print(f"report: {path}\nrun folder: {p.path}")
    return p.path


def model_candidates(p: Pipeline, target, shape: Shape, reload: Callable[[], Model]) -> Pool:
    """The sweep and the shapes it picks, then every model candidate built (the target's weights put down meanwhile,
    `reload()` them after), profiled and screened by prediction."""
    c = p.base
    shapes = build.sweep_shapes(p, shape) if c.trains and not p.dropped("training") else None
    p.replan("build")
    trains = c.trains and not p.dropped("training")  # the budget may leave only untrained and lookup drafters
    if not trains:
        shapes = None
    elif shapes and p.dropped("control"):
        shapes = shapes[:1]
    feature = trains and c.feature_drafter  # trained on the same teacher data as the pruned shapes
    family = family_of(c.target, target, shape)
    cands = candidates(shape, c.wide_layers if trains else (), c.narrow_factor, c.drafter, shapes, feature, family)
    if family and cuts.source(c) == family[1] and not p.dropped("training"):  # the paper's recipe on the sibling
        small = Shape.of(parse(family[1]).model_config())
        cands = cuts.candidates(small, family[1], c.narrow_factor) + cands  # both (`prerank`)
    n_cut = sum(1 for x in cands if x.source)
    prerank = n_cut > 1 and p.dropped("control")  # one cut's minutes: the cuts ranked before training (`cuts`)
    n_trained, n_feature = sum(x.trained for x in cands) - prerank, sum(x.role == FEATURE for x in cands)
    p.know(
        trained=n_trained,
        untrained=len(cands) - n_trained - prerank - n_feature,
        features=n_feature,
        benched=n_trained + n_feature + bool(c.drafter),
        built=True,
        prerank=prerank,
    )
    # gen-data, teacher, prune and distill each load the target they need: the design's own copy (2.4 GB at q4 for
    # the 1.5B) would only stack on their peaks
    with put_down(target, reload):
        specs = build.build(p, cands, prerank)
    cands = [x for x in cands if x.name in specs]  # less a cut passed over untrained
    build.measure_costs(p, target, shape, specs, cands)
    best = {x.name: best_gamma(p, specs[x.name], x.name) for x in cands}
    return Pool(cands, specs, {x.name: best[x.name][0] for x in cands}, build.screen(cands, best), best=best)


def family_of(spec: str, target, shape: Shape) -> tuple[str, str] | None:
    """The family's small model as a candidate (name, spec): a named target's named sibling (`targets.named`), else
    the packaged default model, where it speaks the target's vocabulary and the target is big enough beside it
    (`candidates.family_drafter`)."""
    family = family_model(spec, FAMILY)
    small = resolve(family[1])
    if target.path is None or target.path.resolve() == small.resolve():
        return None
    config, tokenizer = config_and_tokenizer(small, ModelOptions())
    same = tokenizer.get_vocab() == target.tokenizer.get_vocab()
    return family if family_drafter(shape, Shape.of(config), same) else None


def lookup_candidates(p: Pipeline, target, pool: Pool) -> None:
    """The tuned n-gram, suffix and hybrid candidates and, with the scheduler, their scheduled options."""
    p.replan("lookups", benched=len(pool.benched))
    if not p.base.lookups:
        return
    tuned = build.lookup_candidates(p, target, pool.cands, pool.specs, pool.best)
    done = p.done["tune-lookup"]
    pool.specs.update({x.name: x.spec for x in tuned})
    pool.gammas.update({x.name: done[x.name]["gamma"] for x in tuned})
    pool.cands, pool.benched = pool.cands + tuned, pool.benched + tuned
    if p.config.scheduler:
        lookup.calibrate_lookups(p, target, done)
        pool.scheduled = lookup.scheduled_options(done)


def select(p: Pipeline, pool: Pool, shape: Shape) -> tuple[str, int]:
    """The chosen drafter and γ* from one grid, then the temperatures, the batch dividend and the headline."""
    kv = build.kv_bytes(p, pool.cands, pool.specs)
    p.replan("select")
    sched = pool.scheduled
    selectable = {**{x.name: pool.specs[x.name] for x in pool.benched}, **{s: pool.specs[m] for s, m in sched.items()}}
    gammas = {n: pool.gammas[sched.get(n, n)] for n in selectable}
    chosen, gamma = measure.select(p, selectable, gammas, kv, sched)
    pool.specs.update({s: pool.specs[m] for s, m in sched.items()})
    spec = pool.specs[chosen]
    p.replan("temperatures", chosen_model=drafter_kind(spec) == "model")
    measure.temperatures(p, spec, gamma)
    p.replan("batch")
    if not p.dropped("batch"):
        measure.batch_dividend(p, shape, pool.specs, pool.cands)
    p.replan("headline")
    if not p.dropped("headline"):
        measure.headline(p, spec, gamma, measure.method_of(p, chosen))
    return chosen, gamma


def machine_facts(p: Pipeline) -> None:
    """The machine with its measured bandwidth, once per run folder (machine.json; the report's machine section)."""
    if "bandwidth" not in json.loads((p.path / "machine.json").read_text()):
        p.dir.write_json("machine.json", machine.describe(p.base.threads))


def per_row(p: Pipeline, target, pool: Pool) -> list[dict]:
    """Each further runtime's own verdict (lean-int8, llama.cpp's files), each planned with what the ones before
    took. A row whose native code dies ends there (`pipeline`); the others go on."""
    lean_models = {x.name: pool.specs[x.name] for x in pool.benched if x.role not in ("lookup", "hybrid")}
    out = []
    p.replan("rows")
    for i, e in enumerate(rows.planned(p.config)):
        if i:
            p.replan(f"row-{e.name}")
        if not rows.dropped(p, e) and e.name not in p.dead:
            # a feature head reads the target's hidden states, which only the lean engine hands out
            rt = runtime(e.backend)
            models = {n: row_spec(s, rt) for n, s in lean_models.items() if rt.features or drafter_kind(s) == "model"}
            try:
                out.append(row_verdict.run_row(p, e, target, models, p.base.lookups))
            except NativeCrash:
                rows.forget(p)  # the plan no longer counts its stages
    return out


def row_spec(spec: str, rt) -> str:
    """A model drafter's spec on a row's runtime: a cut drafts with its reduced head (`cuts`) where the runtime can,
    elsewhere from its distillation's full-vocabulary checkpoint (the run folder `reduced/` sits in)."""
    if rt.reduced_heads or vocab_map.read_map(Path(spec)) is None:
        return spec
    return str(Path(spec).parent)


def answer(p: Pipeline) -> dict:
    """What each lossy runtime costs in quality, then every runtime's plain decoding and each row's choice side by
    side: the design's answer (`fastest`). A row that dies in either is left out and the stage runs again without
    it; a crash no row accounts for ends the design."""
    p.replan("fastest")
    while True:
        try:
            lossy = {rows.quality_runtime(e): e.name for e in rows.live(p)}
            if lossy:
                config = QualityConfig(
                    target=p.base.target, runtimes=tuple(lossy), limit=p.sizes.agree_limit, threads=p.base.threads
                )
                p.isolated("quality", quality.run, config, "quality", names=lossy, rows=lossy)
            return fastest.run(p)
        except NativeCrash as crash:
            if crash.row not in {e.name for e in rows.planned(p.base)}:
                raise
            rows.forget(p)


def accuracy(p: Pipeline, target, pool: Pool) -> None:
    """The accuracy sanity check of the target and every model candidate, unless the budget left it out."""
    models = {x.name: pool.specs[x.name] for x in pool.cands if x.role not in ("lookup", "hybrid", FEATURE)}
    p.replan("accuracy")
    if not p.dropped("accuracy"):
        options = ModelOptions(p.base.dtype, p.base.device)
        p.stage("accuracy", lambda f: build.measure_accuracy(p.config, target, models, f, options))


def reduced_heads(p: Pipeline, spec: str, full: Path | None, vocab: int, gamma: int) -> None:
    """A model drafter's reduced draft heads and adaptive lookahead, exported when one pays."""
    p.replan("reduced-heads")
    if drafter_kind(spec) == "model" and (p.config.draft_vocabs or p.config.adaptive):
        reduced, n = measure.tune_head(p, full, vocab, gamma)
        if n:
            export.export_reduced(p, Path(reduced))
