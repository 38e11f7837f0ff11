"""`design`'s benchmarks: every decision between drafters is made from measurements on the same prompts.

  bench-select     one grid: every candidate (model drafters the cost model cannot rule out, the tuned n-gram and
                   suffix drafters, the hybrid) at its own γ beside one AR baseline, interleaved prompt by prompt on
                   `bench_limit` eval prompts of every bench suite at T = 0 — the per-task TAR and speedup come from it
  select-drafter   the largest measured speedup over AR; near-ties (within `select_tie`) go to the highest TAR
  bench-gamma      the chosen drafter at γ−1, γ, γ+1 (`refine_limit` prompts); select-gamma keeps the fastest
  bench-temps      the chosen drafter and AR at each non-zero temperature (lossless sampling; `refine_limit` prompts)
  max-batch-*, bench-*-batch   the batch dividend of the trained model candidates
  bench-headline   spec_bench: SD vs draftwise AR vs transformers generate() and its own assisted generation / prompt lookup
  reduced heads and adaptive lookahead, when the chosen drafter is a model
"""

from __future__ import annotations

import json
from pathlib import Path

from ... import cost
from ...config import BenchConfig, BenchGridConfig, drafter_kind
from ...models import hf
from .. import bench, bench_grid
from ..draft_vocab import write_reduced
from .candidates import Candidate


def _options(config) -> dict:
    return {"dtype": config.dtype, "device": config.device, "threads": config.threads}


def base_config(p, spec: str, gamma: int, limit: int, suite: str | None = None, **kw) -> BenchConfig:
    c = p.config
    return BenchConfig(target=c.target, drafter=spec, gamma=gamma, suite=suite or c.bench_suites, limit=limit,
                       max_new_tokens=c.max_new_tokens, seed=c.seed, **_options(c), **kw)


def run_bench(p, name: str, spec: str, gamma: int, limit: int, temperature: float = 0.0, baselines=(), suite=None,
              draft_stop: float = 0.0, batch_size: int = 1) -> dict:
    config = base_config(p, spec, gamma, limit, suite, temperature=temperature, baselines=tuple(baselines),
                         draft_stop=draft_stop, batch_size=batch_size)
    return p.stage(name, lambda f: bench.run(config, f, p.executor), drafter=spec, gamma=gamma, temperature=temperature)


def run_grid(p, name: str, grid: BenchGridConfig, **decision) -> dict:
    return p.stage(name, lambda f: bench_grid.run(grid, f, p.executor), **decision)


def summary(p, stage: str) -> dict:
    return json.loads((Path(p.done[stage]["folder"]) / "summary.json").read_text())


def grid_points(p, stage: str) -> list[dict]:
    return json.loads((Path(p.done[stage]["folder"]) / "grid.json").read_text())["points"]


SIMPLER = {"lookup": 0, "model": 1, "hybrid": 2}  # fewer moving parts first: no weights; one model; a model and a lookup


def pick_drafter(speeds: dict[str, float], tars: dict[str, float], tie: float, kinds: dict[str, str] | None = None) -> str:
    """The fastest drafter by measured speed; among those within `tie` (relative) of the fastest — differences one
    sequential benchmark cannot tell from machine noise — the one with the fewest moving parts (a lookup drafter has no
    weights, a hybrid needs a model and a lookup), then the highest TAR, which is a count and does not drift with the
    machine."""
    best = max(speeds.values())
    close = [n for n, v in speeds.items() if v >= (1 - tie) * best]
    rank = {n: SIMPLER[(kinds or {}).get(n, "model")] for n in close}
    return min(close, key=lambda n: (rank[n], -(tars.get(n) or 0.0), -speeds[n]))


def select(p, specs: dict[str, str], gammas: dict[str, int]) -> tuple[str, int]:
    """The chosen drafter (measured speedup over AR in one interleaved grid), then γ* (measured at γ ± 1)."""
    c, names = p.config, list(specs)
    grid = BenchGridConfig(bench=base_config(p, specs[names[0]], 1, c.bench_limit, baselines=("ar",)),
                           drafters=tuple(specs[n] for n in names), drafter_gammas=tuple(gammas[n] for n in names))
    run_grid(p, "bench-select", grid, drafters=specs, gammas=gammas)

    def decide(folder) -> dict:
        by_spec = {r["drafter"]: r for r in grid_points(p, "bench-select")}
        speedup = {n: by_spec[specs[n]]["speedup_vs_ar"] for n in names}
        tars = {n: by_spec[specs[n]]["tar"] for n in names}
        kinds = {n: drafter_kind(specs[n]) for n in names}
        return {"drafter": pick_drafter(speedup, tars, c.select_tie, kinds), "speedup_vs_ar": speedup, "tar": tars,
                "tokens_per_s": {n: by_spec[specs[n]]["tokens_per_s"] for n in names}, "tie": c.select_tie,
                "rule": "largest measured speedup over AR (same prompts, interleaved); within the tie band, fewest moving "
                        "parts (lookup, then model, then hybrid), then highest TAR"}

    chosen = p.stage("select-drafter", decide)["drafter"]
    g0 = gammas[chosen]
    tried = tuple(g for g in (g0 - 1, g0, g0 + 1) if g >= 1)
    run_grid(p, "bench-gamma", BenchGridConfig(bench=base_config(p, specs[chosen], g0, c.refine_limit, baselines=("ar",)),
                                               drafters=(specs[chosen],), gammas=tried), drafter=specs[chosen])

    def decide_gamma(folder) -> dict:
        speedup = {r["gamma"]: r["speedup_vs_ar"] for r in grid_points(p, "bench-gamma")}
        return {"gamma": max(speedup, key=speedup.get), "speedup_vs_ar": speedup}

    return chosen, p.stage("select-gamma", decide_gamma)["gamma"]


def temperatures(p, spec: str, gamma: int) -> None:
    temps = tuple(t for t in p.config.temperatures if t != 0)
    if temps:
        grid = BenchGridConfig(bench=base_config(p, spec, gamma, p.config.refine_limit, baselines=("ar",)),
                               drafters=(spec,), gammas=(gamma,), temperatures=temps)
        run_grid(p, "bench-temps", grid, drafter=spec, gamma=gamma)


def headline(p, spec: str, gamma: int) -> None:
    """spec_bench: SD against draftwise AR, transformers generate() and transformers' own SD with the same means."""
    own = ("hf-assisted",) if drafter_kind(spec) == "model" else ("hf-prompt-lookup",)
    run_bench(p, "bench-headline", spec, gamma, p.config.headline_limit, baselines=("ar", "hf-generate") + own,
              suite="spec_bench")


def feasible_batch(config, target: cost.Shape, drafter: cost.Shape) -> tuple[int, int]:
    """(largest batch whose SD footprint fits `memory`, the batch benchmarked: that capped at `batch_cap`)."""
    largest = int(cost.max_batch(cost.parse_count(config.memory), target, drafter, config.context,
                                 hf.bytes_per_value(config.dtype)))
    return largest, min(largest, config.batch_cap)


def batch_dividend(p, target_shape: cost.Shape, specs: dict[str, str], cands: list[Candidate], predicted=None) -> None:
    """Each trained candidate at the largest batch whose footprint with SD on fits `memory`: target + drafter
    weights, plus target + drafter KV of `context` positions per sequence (capped at `batch_cap`), SD beside AR.

    The decision (`max-batch-<name>`) is a record; the bench (`bench-<name>-batch`) decodes about `refine_limit`
    spec_bench eval prompts in full batches of that size at T = 0 and the γ* predicted at that batch (`predicted`:
    the profile at that batch, the candidate's greedy TAR; its batch-1 γ when the profile lacks the batch)."""
    if predicted is None:
        from . import predicted
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
        limit = batch * max(2, round(c.refine_limit / batch))
        pred = predicted(p, spec, cand.name, batch)
        gamma = max(pred, key=pred.get) if pred else measured_gamma(p, cand.name)
        run_bench(p, f"bench-{cand.name}-batch", spec, gamma, limit, baselines=("ar",), batch_size=batch,
                  suite="spec_bench")


def measured_gamma(p, name: str) -> int:
    """The γ a candidate runs at: γ* for the chosen drafter, else its γ in the selection grid."""
    if name == p.done["select-drafter"]["drafter"]:
        return p.done["select-gamma"]["gamma"]
    return p.done["bench-select"]["gammas"][name]


def tune_head(p, full_checkpoint: Path, vocab_size: int, gamma: int) -> tuple[str, int]:
    """Reduced draft heads of the chosen (model) drafter, each benchmarked beside AR on the headline prompts, the best by
    measured SD / AR; then adaptive lookahead (stop below τ = c, the drafter's step over the target's) against it."""
    c = p.config
    runs = {0: run_bench(p, "bench-vocab-full", str(full_checkpoint), gamma, c.headline_limit, baselines=("ar",),
                         suite="spec_bench")["stage"]}
    for n in (n for n in c.draft_vocabs if n < vocab_size):
        p.stage(f"vocab-{n}", lambda f, n=n: write_reduced(full_checkpoint, p.folder("gen-data"), n, f))
        runs[n] = run_bench(p, f"bench-vocab-{n}", str(p.folder(f"vocab-{n}")), gamma, c.headline_limit,
                            baselines=("ar",), suite="spec_bench")["stage"]

    def speedup(n):
        return summary(p, runs[n])["methods"]["sd"]["speedup_vs_ar"]

    n = p.stage("select-vocab", lambda f: {"vocab": max(runs, key=speedup)})["vocab"]
    spec = str(full_checkpoint) if n == 0 else str(p.folder(f"vocab-{n}"))
    if c.adaptive:
        s = summary(p, runs[n])
        tau = round(s["draft_step_ms"] / s["ar_step_ms"], 3)  # draft another token only if q(token) > t_q / t_p
        run_bench(p, "bench-adaptive", spec, 2 * gamma + 1, c.headline_limit, baselines=("ar",), suite="spec_bench",
                  draft_stop=tau)
    return spec, n
