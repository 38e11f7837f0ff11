"""`draftwise design`: the paper's study, run for one target on this machine, ending in a chosen drafter and γ*.

  gen-data → prune + distill each candidate → profile → sweep → agree → predict γ* → bench (select drafter,
  then γ*, then temperatures, then each trained candidate at the largest batch that fits `memory`, then the
  headline against transformers) → accuracy → report → export

Every stage writes its own run folder under `stages/` and, when finished, one `done` record in this folder's
records.jsonl; a rerun skips finished stages and resumes the unfinished one from its own folder, so a kill at any
point loses no finished work. Decisions (chosen drafter, γ*) are records too, so a rerun never re-decides them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ... import cost
from ...config import (
    AgreeConfig,
    BenchConfig,
    DesignConfig,
    DistillConfig,
    GenDataConfig,
    ProfileConfig,
    PruneConfig,
    SweepConfig,
)
from ...errors import DraftwiseError
from ...executors import Executor, InProcess, exclusive
from ...models import ModelOptions, hf, load, load_drafter
from ...rundir import RunDir
from .. import accuracy, agree, bench, distill, gen_data, profile, prune, sweep
from ..draft_vocab import write_reduced
from .candidates import Candidate, candidates

GAMMAS = (1, 2, 3, 4, 6, 8)


class Stages:
    """Which stages are done and where each one's folder is; `stage` runs one unless it is done, writes its done
    record into the stage's own folder (done.json) and hands it to `on_done`. A worker (see `CandidateWork`) holds
    one of these without the run folder: it returns its records to the driver, which alone appends to
    records.jsonl; a done.json whose item never returned (a kill) is collected by the next `Pipeline`."""

    def __init__(self, config: DesignConfig, stages: Path, done: dict[str, dict], on_done: Callable[[dict], None]):
        self.config, self.stages, self.done, self.on_done = config, stages, done, on_done

    def folder(self, name: str) -> Path:
        return self.stages / name

    def stage(self, name: str, work, **decision) -> dict:
        """Run `work(folder)` unless `name` is finished; returns the stage's done record."""
        if name in self.done:
            return self.done[name]
        print(f"[design] {name} ...", file=sys.stderr, flush=True)
        result = work(self.folder(name))
        result = result if isinstance(result, dict) else {}  # stage runs return their folder; decisions a dict
        record = {"event": "done", "stage": name, "folder": str(self.folder(name)), **decision, **result}
        self.folder(name).mkdir(parents=True, exist_ok=True)
        tmp = self.folder(name) / "done.json.tmp"
        tmp.write_text(json.dumps(record) + "\n")
        tmp.replace(self.folder(name) / "done.json")
        self.done[name] = record
        self.on_done(record)
        return record


class Pipeline(Stages):
    """The design run folder: config.json, and one done record per finished stage in records.jsonl."""

    def __init__(self, config: DesignConfig, out: str | Path, executor: Executor | None = None):
        self.dir, self.executor = RunDir(out, config), executor or InProcess()  # where every stage's items run
        done = {r["stage"]: r for r in self.dir.records() if r.get("event") == "done"}
        super().__init__(config, self.dir.path / "stages", done, self.dir.append)
        for marker in sorted(self.stages.glob("*/done.json")):  # finished in an item that was killed before returning
            self.add(json.loads(marker.read_text()))

    def add(self, record: dict) -> None:
        """A done record a worker returned."""
        if record["stage"] not in self.done:
            self.done[record["stage"]] = record
            self.dir.append(record)


def budgets(config: DesignConfig, n_trained: int) -> dict:
    """How `minutes` is shared: target data ~11 %, distillation ~28 % split over the trained candidates; the
    rest (profile, sweep, pruning, agreement, benchmarks, accuracy) is sized to fit the default 30 minutes."""
    return {"gen_prompts": max(8, round(3 * config.minutes)),
            "distill_minutes": round(0.28 * config.minutes / max(1, n_trained), 2)}


def _options(config: DesignConfig) -> dict:
    return {"dtype": config.dtype, "device": config.device, "threads": config.threads}


def spec_of(p: Stages, cand: Candidate) -> str:
    """What the engine loads for a candidate: its distilled checkpoint, or the spec it is taken as."""
    return str(p.folder(f"distill-{cand.name}")) if cand.trained else cand.spec


def candidate_stages(p: Stages, cand: Candidate, n_trained: int) -> None:
    """One candidate's own stages: prune and distill (trained candidates), then teacher-forced agreement."""
    c, opts = p.config, _options(p.config)
    if cand.trained:
        p.stage(f"prune-{cand.name}", lambda f: prune.run(PruneConfig(
            target=c.target, shape=cand.prune_shape(), calib_tokens=384, elimination_tokens=96, seed=c.seed, **opts), f))
        p.stage(f"distill-{cand.name}", lambda f: distill.run(DistillConfig(
            target=c.target, drafter=str(p.folder(f"prune-{cand.name}")), data=str(p.folder("gen-data")), loss=c.loss,
            minutes=budgets(c, n_trained)["distill_minutes"], eval_prompts=16, eval_every=50, seed=c.seed, **opts), f))
    p.stage(f"agree-{cand.name}", lambda f: agree.run(AgreeConfig(
        target=c.target, drafter=spec_of(p, cand), limit=24, max_new_tokens=c.max_new_tokens, gammas=GAMMAS, **opts), f))


@dataclass(frozen=True)
class CandidateWork:
    """The executor's recipe for one candidate's stages: items are (candidate, done records so far); the result is
    the done records the candidate's stages wrote."""

    config: DesignConfig
    stages: str
    n_trained: int

    def __call__(self):
        if self.config.threads:
            torch.set_num_threads(self.config.threads)

        def run_candidate(item: tuple[Candidate, dict]) -> list[dict]:
            cand, done = item
            records: list[dict] = []
            candidate_stages(Stages(self.config, Path(self.stages), dict(done), records.append), cand, self.n_trained)
            return records

        return run_candidate


def build(p: Pipeline, cands: list[Candidate]) -> dict[str, str]:
    """Target data, then every candidate's own stages (each candidate an executor item); {name: drafter spec}."""
    c, opts = p.config, _options(p.config)
    n_trained = sum(x.trained for x in cands)
    p.stage("gen-data", lambda f: gen_data.run(GenDataConfig(
        target=c.target, max_new_tokens=96, temperatures=(0.0, 1.0), limit=budgets(c, n_trained)["gen_prompts"],
        seed=c.seed, **opts), f))
    todo = [(cand, dict(p.done)) for cand in cands if f"agree-{cand.name}" not in p.done]
    work = CandidateWork(c, str(p.stages), n_trained)
    for _, records in p.executor.map(work, todo, exclusive(c.device, c.threads)):
        for record in records:
            p.add(record)
    return {cand.name: spec_of(p, cand) for cand in cands}


def feasible_batch(config: DesignConfig, target: cost.Shape, drafter: cost.Shape) -> tuple[int, int]:
    """(largest batch whose SD footprint fits `memory`, the batch benchmarked: that capped at `batch_cap`)."""
    largest = int(cost.max_batch(cost.parse_count(config.memory), target, drafter, config.context,
                                 hf.bytes_per_value(config.dtype)))
    return largest, min(largest, config.batch_cap)


def measure_costs(p: Pipeline, target_shape: cost.Shape, specs: dict[str, str], cands: list[Candidate]) -> None:
    """Profile at batch 1 and at each trained candidate's feasible batch (for γ* there), then the shape sweep."""
    c, opts = p.config, _options(p.config)
    depths = tuple(k for k in (1, 2, 4, 8) if k < target_shape.layers)
    batches = (1,) + tuple(sorted({b for x in cands if x.trained
                                   for b in [feasible_batch(c, target_shape, x.shape)[1]] if b > 1}))
    p.stage("profile", lambda f: profile.run(ProfileConfig(
        target=c.target, drafters=tuple(specs.values()), depths=depths, gammas=GAMMAS, batches=batches, warmup=2,
        repeats=7, seed=c.seed, **opts), f, p.executor))
    hd = target_shape.head_dim
    unit = hd * target_shape.heads // target_shape.kv_heads  # widths keep whole GQA groups
    widths = tuple(sorted({max(unit, round(target_shape.hidden * m / unit) * unit) for m in (1 / 3, 2 / 3, 1, 4 / 3)}))
    budget = min(replace(target_shape, layers=k).params()["non_embedding"] for k in c.wide_layers)
    p.stage("sweep", lambda f: sweep.run(SweepConfig(
        target=c.target, budget=str(budget), layers=_budget_depths(target_shape, budget), widths=widths,
        width_depth=min(c.wide_layers), truncations=(), batches=(1,), warmup=2, repeats=5, seed=c.seed, **opts), f,
        p.executor))


def _budget_depths(target: cost.Shape, budget: int) -> tuple[int, ...]:
    """Depths (of 1, 2, 4, 8) at which a shape of `budget` non-embedding parameters exists."""
    out = []
    for k in (1, 2, 4, 8):
        try:
            cost.shape_for_budget(target, k, budget)
            out.append(k)
        except DraftwiseError:
            break
    return tuple(out)


def predicted(p: Pipeline, spec: str, name: str, batch: int = 1) -> dict[int, float]:
    """Predicted greedy tokens/s per γ (per sequence, at `batch`): the exact greedy TAR replayed from `agree` over
    step and verify times measured at that batch. Empty when the profile has no such batch."""
    prof = json.loads((p.folder("profile") / "profile.json").read_text())["batches"].get(str(batch))
    if prof is None:
        return {}
    tar = json.loads((p.folder(f"agree-{name}") / "agree.json").read_text())["predicted_greedy_tar"]
    verify = {int(g): ms for g, ms in prof["verify_ms"].items()}
    step = prof["drafters"][spec]["step_ms"]
    return {g: 1e3 * cost.throughput(tar[str(g)], g, step, verify[g]) for g in GAMMAS if tar.get(str(g))}


def _bench(p: Pipeline, name: str, spec: str, gamma: int, temperature: float = 0.0, baselines=(), suite=None,
           limit=None, draft_stop: float = 0.0, batch_size: int = 1) -> dict:
    c = p.config
    config = BenchConfig(target=c.target, drafter=spec, gamma=gamma, draft_stop=draft_stop, temperature=temperature,
                         suite=suite or c.bench_suites, limit=limit or c.bench_limit, max_new_tokens=c.max_new_tokens,
                         baselines=tuple(baselines), batch_size=batch_size, seed=c.seed, **_options(c))
    return p.stage(name, lambda f: bench.run(config, f, p.executor), drafter=spec, gamma=gamma, temperature=temperature)


def summary(p: Pipeline, stage: str) -> dict:
    return json.loads((Path(p.done[stage]["folder"]) / "summary.json").read_text())


def sd_tokens_per_s(p: Pipeline, stage: str) -> float:
    return summary(p, stage)["methods"]["sd"]["tokens_per_s"]


def tune_head(p: Pipeline, full_checkpoint: Path, vocab_size: int, gamma: int) -> tuple[str, int]:
    """Reduced draft heads of the chosen drafter (each benchmarked beside AR on the headline prompts), the best by
    measured SD / AR; then adaptive lookahead (stop below τ = c, the drafter's step over the target's) against it."""
    c = p.config
    runs = {0: _bench(p, "bench-vocab-full", str(full_checkpoint), gamma, baselines=("ar",), suite="spec_bench",
                      limit=c.headline_limit)["stage"]}
    for n in (n for n in c.draft_vocabs if n < vocab_size):
        p.stage(f"vocab-{n}", lambda f, n=n: write_reduced(full_checkpoint, p.folder("gen-data"), n, f))
        runs[n] = _bench(p, f"bench-vocab-{n}", str(p.folder(f"vocab-{n}")), gamma, baselines=("ar",), suite="spec_bench",
                         limit=c.headline_limit)["stage"]

    def speedup(n):
        return summary(p, runs[n])["methods"]["sd"]["speedup_vs_ar"]

    n = p.stage("select-vocab", lambda f: {"vocab": max(runs, key=speedup)})["vocab"]
    spec = str(full_checkpoint) if n == 0 else str(p.folder(f"vocab-{n}"))
    if c.adaptive:
        s = summary(p, runs[n])
        tau = round(s["draft_step_ms"] / s["ar_step_ms"], 3)  # draft another token only if q(token) > t_q / t_p
        _bench(p, "bench-adaptive", spec, 2 * gamma + 1, baselines=("ar",), suite="spec_bench", limit=c.headline_limit,
               draft_stop=tau)
    return spec, n


def pick_drafter(speeds: dict[str, float], tars: dict[str, float], tie: float) -> str:
    """The fastest drafter by measured tokens/s; among those within `tie` (relative) of the fastest — differences one
    sequential benchmark cannot tell from machine noise — the one with the highest TAR, which is a count and does not
    drift with the machine."""
    best = max(speeds.values())
    close = [n for n, v in speeds.items() if v >= (1 - tie) * best]
    return max(close, key=lambda n: (tars.get(n) or 0.0, speeds[n]))


def select(p: Pipeline, specs: dict[str, str]) -> tuple[str, int]:
    """Chosen drafter (measured tokens/s at its predicted γ*), then γ* (measured at the predicted γ* ± 1)."""
    runs = {}
    for name, spec in specs.items():
        pred = predicted(p, spec, name)
        gamma = max(pred, key=pred.get) if pred else 1
        runs[name] = _bench(p, f"bench-{name}-g{gamma}", spec, gamma)["stage"]
    def decide(folder) -> dict:
        speeds = {n: sd_tokens_per_s(p, runs[n]) for n in runs}
        tars = {n: summary(p, runs[n])["tar"] for n in runs}
        return {"drafter": pick_drafter(speeds, tars, p.config.select_tie), "tokens_per_s": speeds, "tar": tars,
                "tie": p.config.select_tie}

    chosen = p.stage("select-drafter", decide)["drafter"]
    g0 = p.done[runs[chosen]]["gamma"]
    tried = {g0: runs[chosen]}
    for g in (g0 - 1, g0 + 1):
        if g >= 1:
            tried[g] = _bench(p, f"bench-{chosen}-g{g}", specs[chosen], g)["stage"]
    gamma = p.stage("select-gamma", lambda f: {"gamma": max(tried, key=lambda g: sd_tokens_per_s(p, tried[g]))})["gamma"]
    return chosen, gamma


def measured_gamma(p: Pipeline, name: str) -> int:
    """The γ a candidate runs at: γ* for the chosen drafter, else the fastest γ of its selection bench(es)."""
    if name == p.done["select-drafter"]["drafter"]:
        return p.done["select-gamma"]["gamma"]
    prefix = f"bench-{name}-g"
    runs = {p.done[n]["gamma"]: n for n in p.done if n.startswith(prefix) and n[len(prefix):].isdigit()}
    return max(runs, key=lambda g: sd_tokens_per_s(p, runs[g])) if runs else p.done["select-gamma"]["gamma"]


def batch_dividend(p: Pipeline, target_shape: cost.Shape, specs: dict[str, str], cands: list[Candidate]) -> None:
    """Each trained candidate at the largest batch whose footprint with SD on fits `memory`: target + drafter
    weights, plus target + drafter KV of `context` positions per sequence (capped at `batch_cap`), SD beside AR.

    The decision (`max-batch-<name>`) is a record; the bench (`bench-<name>-batch`) decodes about `bench_limit`
    eval prompts in full batches of that size at T = 0 and the γ* predicted at that batch (the profile at that batch,
    the candidate's greedy TAR; its measured batch-1 γ when the profile lacks the batch). A candidate's shape is the
    one it was pruned to (`Candidate.shape`), the same that sized the profile's batches."""
    c = p.config
    memory, bpv = cost.parse_count(c.memory), hf.bytes_per_value(c.dtype)
    for cand in (x for x in cands if x.trained):
        spec, shape = specs[cand.name], cand.shape

        def decide(folder, shape=shape) -> dict:
            largest, batch = feasible_batch(c, target_shape, shape)
            return {"memory": memory, "context": c.context, "bytes_per_value": bpv,
                    "weight_bytes_target": target_shape.weight_bytes(bpv), "weight_bytes_drafter": shape.weight_bytes(bpv),
                    "kv_bytes_per_seq_target": target_shape.kv_bytes(c.context, 1, bpv),
                    "kv_bytes_per_seq_drafter": shape.kv_bytes(c.context, 1, bpv),
                    "max_batch": largest, "batch": batch, "capped": largest > c.batch_cap}

        batch = p.stage(f"max-batch-{cand.name}", decide, drafter=spec)["batch"]
        if batch < 1:
            continue  # not even one sequence fits beside the weights: nothing to benchmark
        # full batches only (every record decodes `batch` prompts), at least two of them; spec_bench's prompts, as the
        # headline's: the batch's prefill pads every prompt to its longest, and long articles would swamp the decode
        limit = batch * max(2, round(c.bench_limit / batch))
        pred = predicted(p, spec, cand.name, batch)
        gamma = max(pred, key=pred.get) if pred else measured_gamma(p, cand.name)
        _bench(p, f"bench-{cand.name}-batch", spec, gamma, baselines=("ar",), limit=limit, batch_size=batch,
               suite="spec_bench")


def run(config: DesignConfig, out: str | Path, executor: Executor | None = None) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    p = Pipeline(config, out, executor)
    options = ModelOptions(config.dtype, config.device)
    target = load(config.target, options)
    target_shape = cost.Shape.of(target.config)
    cands = candidates(target_shape, config.wide_layers, config.narrow_factor, config.drafter)
    specs = build(p, cands)
    measure_costs(p, target_shape, specs, cands)
    chosen, gamma = select(p, specs)
    for t in config.temperatures:
        _bench(p, f"bench-chosen-t{t:g}", specs[chosen], gamma, t, baselines=("ar",))
    batch_dividend(p, target_shape, specs, cands)
    _bench(p, "bench-headline", specs[chosen], gamma, baselines=("ar", "hf-generate", "hf-assisted"), suite="spec_bench",
           limit=config.headline_limit)
    p.stage("accuracy", lambda f: measure_accuracy(config, target, specs, f, options))
    from ...report import design as report
    from .export import export, export_reduced

    full = export(p, target, specs[chosen], chosen, gamma)
    if config.draft_vocabs or config.adaptive:
        spec, n = tune_head(p, full, target_shape.vocab, gamma)
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
