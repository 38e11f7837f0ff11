"""`design`'s benchmarks: every decision between drafters is made from measurements on the same prompts.

bench-select     one grid: every candidate (model drafters the cost model cannot rule out, the tuned n-gram and
                 suffix drafters, the hybrid) at its own γ beside one AR baseline, interleaved prompt by prompt on
                 `bench_limit` eval prompts of every bench suite at T = 0 — the per-task TAR and speedup come from it
select-drafter   a paired decision (`decide`): the fastest beyond noise, else — after one re-measuring pass of the tied
                 candidates (bench-select-repeat) — the tied candidate with the cheapest draft step, then the smaller
                 drafter KV cache
bench-gamma      the chosen drafter at γ−1, γ, γ+1 (`refine_limit` prompts); select-gamma: the same rule, a smaller γ
                 being the cheaper
bench-temps      the chosen drafter and AR at each non-zero temperature (lossless sampling; `refine_limit` prompts)
max-batch-*, bench-*-batch   the batch dividend of the trained model candidates
bench-headline   spec_bench: SD vs draftwise AR vs transformers generate() and its own assisted generation / prompt
                 lookup
reduced heads (one grid; the same rule, a smaller head being the cheaper) and adaptive lookahead, when the chosen
drafter is a model
"""

from __future__ import annotations

import json
from pathlib import Path

from ..config import BenchConfig, BenchGridConfig
from ..runtimes.base import ModelOptions
from ..runtimes.hf import model as hf
from ..runtimes.registry import load_drafter
from ..sd.families import drafter_kind
from ..shapes import Shape, max_batch
from ..stages import bench, bench_grid
from ..stages.draft_vocab import write_reduced
from ..units import memory_budget
from . import decide, estimate, requests
from .candidates import Candidate
from .pipeline import runtime_options


def base_config(p, spec: str, gamma: int, limit: int, suite: str | None = None, **kw) -> BenchConfig:
    c = p.config
    return BenchConfig(
        target=c.target,
        drafter=spec,
        gamma=gamma,
        suite=suite or c.bench_suites,
        prompts=c.prompts if suite is None else None,  # the user's traffic, where a stage names no suite of its own
        limit=limit,
        max_new_tokens=c.max_new_tokens,
        seed=c.seed,
        **runtime_options(c),
        **kw,
    )


def run_bench(
    p,
    name: str,
    spec: str,
    gamma: int,
    limit: int,
    temperature: float = 0.0,
    baselines=(),
    suite=None,
    draft_stop: float = 0.0,
    batch_size: int = 1,
) -> dict:
    config = base_config(
        p,
        spec,
        gamma,
        limit,
        suite,
        temperature=temperature,
        baselines=tuple(baselines),
        draft_stop=draft_stop,
        batch_size=batch_size,
    )
    return p.stage(name, lambda f: bench.run(config, f, p.executor), drafter=spec, gamma=gamma, temperature=temperature)


def run_grid(p, name: str, grid: BenchGridConfig, runtime: str | None = None, **decision) -> dict:
    """A grid stage; given the `runtime` it runs (a row's, or the first of a grid over rows), in a child process
    (`pipeline.Stages.isolated`: native code that dies there costs its row, not the design)."""
    if runtime is None:
        return p.stage(name, lambda f: bench_grid.run(grid, f, p.executor), **decision)
    return p.isolated(name, bench_grid.run, grid, runtime, **decision)


def limit_of(p, stage: str) -> int:
    """The prompts a finished bench, grid or agree stage ran on (its own config: a planned run's sizes vary by
    phase)."""
    config = json.loads((p.folder(stage) / "config.json").read_text())
    return config.get("bench", config)["limit"]


def summary(p, stage: str) -> dict:
    return json.loads((p.folder(stage) / "summary.json").read_text())


def grid_points(p, stage: str) -> list[dict]:
    return json.loads((p.folder(stage) / "grid.json").read_text())["points"]


def records(p, stages: list[str]) -> list[dict]:
    """The T = 0 records of finished grid or bench stages."""
    out = []
    for stage in (s for s in stages if s in p.done):
        path = p.folder(stage) / "records.jsonl"
        out += [r for r in map(json.loads, path.read_text().splitlines()) if r.get("temperature", 0.0) == 0]
    return out


def paired(p, decision: str, stage: str, key, cost, regrid) -> dict:
    """A decision between the options of a grid stage (`key(record)` -> option, None for AR), re-measuring a tie once
    in `<stage>-repeat` (`regrid(tied options)` -> its grid); see `decide`."""
    if decision in p.done:
        return p.done[decision]

    def result(stages):
        by = decide.timings(records(p, stages), key)
        ar = by.pop(None)
        return decide.compare(by, ar, p.config.seed)

    stages = [stage]
    for i in range(p.config.select_repeats):  # a bounded number of re-measuring passes of whatever still ties
        tie = decide.tied(result(stages))
        if len(tie) < 2:
            break
        stages.append(f"{stage}-repeat" + (f"-{i + 1}" if i else ""))
        run_grid(p, stages[-1], regrid(tie))
    return p.stage(decision, lambda f: {**decide.choose(result(stages), cost), "passes": len(stages)})


SCHEDULED = "+scheduled"  # a scheduled option's name: its static candidate's name and this


def scheduling(p, profile: str = "profile", calibration: str = "calibrate-lookup") -> dict:
    """The BenchConfig fields that add the round scheduler: this engine's profile (its verify curve) and the
    calibration measured on the target's text."""
    return {"schedule": str(p.folder(profile)), "calibration": str(p.folder(calibration))}


def method_of(p, name: str, stage: str = "bench-select") -> str:
    """The bench method that measured option `name` of a selection grid: static SD, or SD with the scheduler."""
    return bench.SCHEDULED if name in p.done[stage].get("scheduled", {}) else "sd"


def option_key(specs: dict[str, str], scheduled: dict[str, str]):
    """A records key for a decision between drafters and their scheduled variants (AR: None)."""
    option = {(specs[n], bench.SCHEDULED if n in scheduled else "sd"): n for n in specs}
    return lambda r: None if r["method"] == "ar" else option.get((r["drafter"], r["method"]), decide.IGNORE)


def select(
    p, specs: dict[str, str], gammas: dict[str, int], kv: dict[str, int], scheduled: dict[str, str] | None = None
) -> tuple[str, int]:
    """The chosen drafter (paired speedups over AR in one interleaved grid), then γ* (the same at γ ± 1). A tie goes
    to the cheaper draft step (measured per drafted token in the grid), then to the smaller drafter KV cache, then to
    static SD over its scheduled variant. `scheduled`: {option name: its static option's name} (the same spec and γ;
    it runs in that option's grid point, the scheduler beside static SD)."""
    c, names, scheduled = p.config, list(specs), scheduled or {}

    def grid(names):
        drafters = list(dict.fromkeys(specs[n] for n in names))
        ours = tuple(dict.fromkeys(specs[n] for n in names if n in scheduled))
        gamma = {specs[n]: gammas[n] for n in names}
        return BenchGridConfig(
            bench=base_config(p, drafters[0], 1, c.bench_limit, baselines=("ar",), **(scheduling(p) if ours else {})),
            drafters=tuple(drafters),
            drafter_gammas=tuple(gamma[d] for d in drafters),
            scheduled=ours,
        )

    run_grid(p, "bench-select", grid(names), drafters=specs, gammas=gammas, scheduled=scheduled)
    # a draft step's cost in AR steps, to 0.01: lookups' 0.01-0.05 ms proposals are all free beside a 20-30 ms step,
    # and timing noise is ±10 %, so finer differences are not a cost one could measure again
    step = {
        r["drafter"]: round((r["draft_step_ms"] or 0.0) / r["ar_step_ms"], 2) for r in grid_points(p, "bench-select")
    }
    decision = paired(
        p,
        "select-drafter",
        "bench-select",
        option_key(specs, scheduled),
        lambda n: (step[specs[n]], kv.get(scheduled.get(n, n), 0), n in scheduled),
        grid,
    )
    chosen = decision["chosen"]
    g0, method = gammas[chosen], method_of(p, chosen)

    def gamma_grid(gs):
        return BenchGridConfig(
            bench=base_config(
                p, specs[chosen], g0, c.refine_limit, baselines=("ar",), **(scheduling(p) if method != "sd" else {})
            ),
            drafters=(specs[chosen],),
            gammas=tuple(sorted(gs)),
        )

    tried = tuple(g for g in (g0 - 1, g0, g0 + 1) if g >= 1)
    run_grid(p, "bench-gamma", gamma_grid(tried), drafter=specs[chosen], method=method)
    gamma = paired(
        p,
        "select-gamma",
        "bench-gamma",
        lambda r: r["gamma"] if r["method"] == method else None if r["method"] == "ar" else decide.IGNORE,
        lambda g: (g,),
        gamma_grid,
    )
    return chosen, gamma["chosen"]


def temperatures(p, spec: str, gamma: int) -> None:
    """The chosen drafter at each non-zero temperature of the traffic; a lookup with its scheduled variant beside it."""
    temps = tuple(t for t in requests.temperatures(p.config, p.config.bench_limit) if t != 0)
    scheduled = scheduling(p) if drafter_kind(spec) == "lookup" and "calibrate-lookup" in p.done else {}
    if temps:
        grid = BenchGridConfig(
            bench=base_config(p, spec, gamma, p.config.refine_limit, baselines=("ar",), **scheduled),
            drafters=(spec,),
            gammas=(gamma,),
            temperatures=temps,
        )
        run_grid(p, "bench-temps", grid, drafter=spec, gamma=gamma)


def headline(p, spec: str, gamma: int, method: str = "sd") -> None:
    """spec_bench: SD (and the scheduled variant, when that is the chosen method) against draftwise AR, transformers
    generate() and transformers' own SD with the same means."""
    # transformers' own SD with the same means (a feature head has none: transformers cannot hand it the features)
    own = {"model": ("hf-assisted",), "feature": ()}.get(drafter_kind(spec), ("hf-prompt-lookup",))
    config = base_config(
        p,
        spec,
        gamma,
        p.config.headline_limit,
        suite="spec_bench",
        baselines=("ar", "hf-generate") + own,
        **(scheduling(p) if method != "sd" else {}),
    )
    p.stage("bench-headline", lambda f: bench.run(config, f, p.executor), drafter=spec, gamma=gamma, method=method)


def held_weights(p, target, specs: dict[str, str], cands: list[Candidate]) -> dict[str, int]:
    """Bytes of weights the target and each trained candidate hold as the verdicts run them (`Model.held_bytes`:
    measured on the loaded models, at the design's precision, a q4 target's drafter at its own), {} where the batch
    dividend does not run. A record (`weights-held`): the profile's batches and the dividend's decisions read it."""
    trained = [x for x in cands if x.trained]
    if p.dropped("batch") or not trained:
        return {}

    def measure(folder) -> dict:
        options = ModelOptions(p.config.dtype, p.config.device)
        held = {"target": target.held_bytes()}
        for x in trained:
            held[x.name] = load_drafter(specs[x.name], target, options).held_bytes(beside=target)
        return {"bytes": held}

    return p.stage("weights-held", measure)["bytes"]


def feasible_batch(config, weights: int, target: Shape, drafter: Shape) -> tuple[int, int]:
    """(largest batch whose SD footprint fits `memory` beside `weights`, the bytes both models hold; the batch
    benchmarked: that capped at `batch_cap`). KV at the design's precision's bytes a value (fp32 around integer
    weights)."""
    bpv = hf.bytes_per_value(config.dtype)
    largest = max_batch(memory_budget(config.memory), target, drafter, config.context, bpv, weights=weights)
    return largest, min(largest, config.batch_cap)


def batch_dividend(p, target_shape: Shape, specs: dict[str, str], cands: list[Candidate]) -> None:
    """Each trained candidate at the largest batch whose footprint with SD on fits `memory`: the weights target and
    drafter hold (`weights-held`), plus target + drafter KV of `context` positions per sequence (capped at
    `batch_cap`), SD beside AR.

    The decision (`max-batch-<name>`) is a record; the bench (`bench-<name>-batch`) decodes about `refine_limit`
    spec_bench eval prompts in full batches of that size at T = 0 and the γ* predicted at that batch (`estimate`:
    the profile at that batch, the candidate's greedy TAR; its batch-1 γ when the profile lacks the batch)."""
    c = p.config
    memory, bpv = memory_budget(c.memory), hf.bytes_per_value(c.dtype)
    held = p.done.get("weights-held", {}).get("bytes", {})  # none where no candidate was trained
    for cand in (x for x in cands if x.name in held):
        spec, shape = specs[cand.name], cand.shape

        def decide(folder, shape=shape, name=cand.name) -> dict:
            largest, batch = feasible_batch(c, held["target"] + held[name], target_shape, shape)
            return {
                "memory": memory,
                "context": c.context,
                "bytes_per_value": bpv,
                "weight_bytes_target": held["target"],
                "weight_bytes_drafter": held[name],
                "kv_bytes_per_seq_target": target_shape.kv_bytes(c.context, 1, bpv),
                "kv_bytes_per_seq_drafter": shape.kv_bytes(c.context, 1, bpv),
                "max_batch": largest,
                "batch": batch,
                "capped": largest > c.batch_cap,
            }

        batch = p.stage(f"max-batch-{cand.name}", decide, drafter=spec)["batch"]
        if batch < 1:
            continue  # not even one sequence fits beside the weights: nothing to benchmark
        # full batches only (every record decodes `batch` prompts), at least two of them; spec_bench's prompts, as the
        # headline's: the batch's prefill pads every prompt to its longest, and long articles would swamp the decode
        limit = batch * max(2, round(c.refine_limit / batch))
        pred = estimate.predicted(p, spec, cand.name, batch)
        gamma = max(pred, key=pred.get) if pred else measured_gamma(p, cand.name)
        run_bench(
            p, f"bench-{cand.name}-batch", spec, gamma, limit, baselines=("ar",), batch_size=batch, suite="spec_bench"
        )


def measured_gamma(p, name: str) -> int:
    """The γ a candidate runs at: γ* for the chosen drafter, else its γ in the selection grid."""
    if name == p.done["select-drafter"]["chosen"]:
        return p.done["select-gamma"]["chosen"]
    return p.done["bench-select"]["gammas"][name]


def tune_head(p, full_checkpoint: Path, vocab_size: int, gamma: int) -> tuple[str, int]:
    """Reduced draft heads of the chosen (model) drafter in one grid beside AR on the headline prompts, decided like the
    drafter (a smaller head is the cheaper step); then adaptive lookahead (stop below τ = c, the drafter's step over
    the target's) against it."""
    c = p.config
    sizes = [0] + [n for n in c.draft_vocabs if n < vocab_size]
    for n in sizes[1:]:
        p.stage(f"vocab-{n}", lambda f, n=n: write_reduced(full_checkpoint, p.folder("gen-data"), n, f))
    spec = {n: str(full_checkpoint) if n == 0 else str(p.folder(f"vocab-{n}")) for n in sizes}
    size_of = {v: n for n, v in spec.items()}

    def grid(ns):
        return BenchGridConfig(
            bench=base_config(p, spec[0], gamma, c.headline_limit, suite="spec_bench", baselines=("ar",)),
            drafters=tuple(spec[n] for n in sorted(ns)),
            gammas=(gamma,),
        )

    run_grid(p, "bench-vocab", grid(sizes), drafters={str(n): s for n, s in spec.items()})
    n = paired(
        p, "select-vocab", "bench-vocab", lambda r: size_of.get(r["drafter"]), lambda n: (n or vocab_size,), grid
    )["chosen"]
    if c.adaptive:
        point = next(r for r in grid_points(p, "bench-vocab") if r["drafter"] == spec[n])
        # draft another token only if q(token) > t_q / t_p; a draft step timed at or above a target step (a tiny
        # target, noise) asks for the least drafting there is, one token a round: τ just below 1, not past it
        tau = min(round(point["draft_step_ms"] / point["ar_step_ms"], 3), 0.999)
        run_bench(
            p,
            "bench-adaptive",
            spec[n],
            2 * gamma + 1,
            c.headline_limit,
            baselines=("ar",),
            suite="spec_bench",
            draft_stop=tau,
        )
    return spec[n], n
