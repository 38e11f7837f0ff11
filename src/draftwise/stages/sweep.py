"""`draftwise sweep`: how a drafter's shape sets its step time on this machine.

Three families of shapes, each timed as a drafter (one token per step, `context` positions cached, batch b),
interleaved with the target's AR step as a reference:
  equal_budget  k layers at the same non-embedding parameter budget (width, heads and FFN scaled together, the
                target's head_dim and GQA ratio kept): the paper's depth-vs-width question;
  width         a fixed depth at several widths: is width nearly free?
  truncation    the target's first k layers at full width (its own weights).
Each shape is also timed with every LM-head size in `vocabs`, so the head's part is visible. Shapes are built with
random weights; latency does not depend on their values. Points run through an executor, are appended as they
finish, and are skipped on rerun. sweep.json (fits, KV bytes, largest batch) and the plots are derived.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .. import cost
from ..config import SweepConfig
from ..errors import DraftwiseError
from ..executors import Executor, InProcess, exclusive
from ..rundir import RunDir
from ..runtimes.base import ModelOptions
from ..runtimes.checkpoint import random_lm
from ..runtimes.hf.model import torch_dtype
from ..runtimes.lean.forward import LeanLM
from ..runtimes.registry import fill_cache, load, load_drafter, runtime, stamp
from ..shapes import Shape, max_batch, shape_for_budget
from ..targets.layers import layer_subset
from ..targets.random import llama_config
from ..timing import check_machine, measure_interleaved, median
from ..units import memory_budget, parse_count

DEFINITIONS = """\
step_ms: one drafter step (1 token per sequence, `context` positions cached), median of repeats. \
c = step / target AR step,
timed interleaved. params: the draftwise convention (see draftwise.cost). kv_bytes_per_seq: keys + values of `context`
positions at the run's dtype. max_batch: the largest batch whose target + drafter KV caches fit in `memory` beside \
both models' weights.
fit: least squares step_ms = fixed + layers·(layer_overhead + layer_MB·ms_per_layer_MB) + head_MB·ms_per_head_MB."""


def points(config: SweepConfig, target: Shape) -> list[dict]:
    budget = parse_count(config.budget)
    shapes: list[tuple[str, Shape]] = []
    for k in config.layers:
        shapes.append(("equal_budget", shape_for_budget(target, k, budget)))
    unit = target.head_dim * (target.heads // target.kv_heads)
    for w in config.widths:
        if w % unit:
            raise DraftwiseError(f"width {w} is not a multiple of head_dim × (heads / kv_heads) = {unit}")
        kv = w // unit
        ffn = int(round(target.ffn / target.hidden * w / 8)) * 8
        shapes.append(
            (
                "width",
                replace(
                    target,
                    layers=config.width_depth,
                    hidden=w,
                    heads=kv * unit // target.head_dim,
                    kv_heads=kv,
                    ffn=ffn,
                ),
            )
        )
    for k in config.truncations:
        if k > target.layers:
            raise DraftwiseError(f"truncation to {k} layers: the target has only {target.layers}")
        shapes.append(("truncation", replace(target, layers=k)))
    out = []
    for b in config.batches:
        for family, shape in shapes:
            for v in config.vocabs:
                s = replace(shape, vocab=v or target.vocab)
                out.append({"family": family, "batch": b, **s.__dict__})
    return out


def shape_of(point: dict) -> Shape:
    return Shape(**{k: point[k] for k in Shape.__dataclass_fields__ if k in point})


def key(point: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in point.items() if k not in ("ms", "ref_ms", "machine")))


def random_model(
    template_config, shape: Shape, dtype: torch.dtype, device: str, seed: int, precision: str = "fp32"
) -> LeanLM:
    """A random-weight drafter of `shape` at the sweep's precision (int8: its matrices quantized, as a drafter's
    are)."""
    return random_lm(llama_config(shape.__dict__, template_config), dtype, device, seed, precision=precision)


def options_of(config: SweepConfig) -> ModelOptions:
    return ModelOptions(config.dtype, config.device, config.backend, gguf_quant=config.gguf_quant)


def random_spec(shape: Shape, seed: int) -> str:
    """The `random:` drafter spec of a shape (left-out settings, such as a tied head, are the target's)."""
    keys = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")
    return "random:" + ",".join(f"{k}={getattr(shape, k)}" for k in keys) + f",seed={seed}"


@dataclass(frozen=True)
class SweepWork:
    """The executor's recipe: load the target (once per process), then time points with it."""

    config: SweepConfig

    def __call__(self) -> Timer:
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        options = options_of(self.config)
        target = load(self.config.target, options)
        return Timer(target, self.config, stamp(target, options))


class Timer:
    def __init__(self, target, config: SweepConfig, machine: dict):
        self.target, self.config, self.machine = target, config, machine
        self.target_shape = Shape.of(target.config)

    def drafter_lm(self, point: dict, shape: Shape):
        """The shape as a model of the run's engine: a truncation shares the target's weights; other shapes get random
        ones (on llama.cpp, written as GGUF files at `gguf_quant` first)."""
        ids = list(range(shape.layers))
        truncation = point["family"] == "truncation" and shape.vocab == self.target_shape.vocab
        if runtime(self.config.backend).file_drafters:  # e.g. llama.cpp: drafters are GGUF files it writes
            spec = "layers:" + ",".join(map(str, ids)) if truncation else random_spec(shape, self.config.seed)
            return load_drafter(spec, self.target, options_of(self.config)).lm
        if truncation:
            return self.target.lm.subset(ids, layer_subset(self.target.config, {}, ids)[0])
        return random_model(
            self.target.config, shape, self.target.lm.dtype, self.config.device, self.config.seed, self.config.dtype
        )

    def __call__(self, point: dict) -> dict:
        shape, b, ctx = shape_of(point), point["batch"], self.config.context
        lm = self.drafter_lm(point, shape)
        gen = torch.Generator().manual_seed(self.config.seed)
        for m in (lm, self.target.lm):
            fill_cache(m, b, ctx, 1, gen)
        ids = torch.randint(0, shape.vocab, (b, 1), generator=gen).to(self.config.device)
        ref_ids = ids.clamp_max(self.target_shape.vocab - 1)
        ms, ref_ms = measure_interleaved(
            [lambda: lm.forward(ids, ctx, 1), lambda: self.target.lm.forward(ref_ids, ctx, 1)],
            self.config.device,
            self.config.warmup,
            self.config.repeats,
        )
        return {"ms": ms, "ref_ms": ref_ms, "machine": self.machine}


def run(config: SweepConfig, out: str | Path, executor: Executor | None = None) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    torch_dtype(config.dtype)
    run_dir = RunDir(out, config)
    work = SweepWork(config)
    timer = work()  # the target here too: its shape; an in-process executor times with this same Timer
    target = timer.target
    all_points = points(config, Shape.of(target.config))
    records = run_dir.records()
    done = {key(r) for r in records}
    todo = [p for p in all_points if key(p) not in done]
    bar = tqdm(total=len(todo), desc="sweep", unit="shape", file=sys.stderr, dynamic_ncols=True, disable=not todo)
    for point, times in (executor or InProcess()).map(work, todo, exclusive(config.device, config.threads), timer):
        check_machine(records, times["machine"], run_dir.path)
        records.append({**point, **times})
        run_dir.append(records[-1])
        bar.update()
        bar.set_postfix_str(
            f"{point['family']} {shape_of(point).describe()} b={point['batch']}: {median(times['ms']):.2f} ms"
        )
    bar.close()
    summary = summarize(run_dir.records(), Shape.of(target.config), config)
    run_dir.write_json("sweep.json", summary)
    from ..report.plots import plot_sweep

    for path in plot_sweep(summary, run_dir.path):
        print(f"plot: {path}")
    print(format_sweep(summary))
    return run_dir.path


def summarize(records: list[dict], target: Shape, config: SweepConfig) -> dict:
    memory = memory_budget(config.memory)
    bpv = runtime(config.backend).bytes_per_value(options_of(config))
    rows = []
    for r in records:
        shape = shape_of(r)
        rows.append(
            {
                "family": r["family"],
                "batch": r["batch"],
                "shape": shape.__dict__,
                "label": shape.describe(),
                "params": shape.params(),
                "step_ms": median(r["ms"]),
                "c": median(r["ms"]) / median(r["ref_ms"]),
                "kv_bytes_per_seq": shape.kv_bytes(config.context, 1, bpv),
                "max_batch": max_batch(memory, target, shape, config.context, bpv),
            }
        )
    fits = {}
    for b in config.batches:
        pts = [(Shape(**row["shape"]), row["step_ms"]) for row in rows if row["batch"] == b]
        if len(pts) >= 4:
            model = cost.StepModel.fit(pts, bpv)
            errs = [abs(model.predict_ms(s) - ms) / ms for s, ms in pts]
            fits[str(b)] = {
                **model.as_dict(),
                "median_abs_error": float(np.median(errs)),
                "max_abs_error": float(max(errs)),
            }
    return {
        "definitions": DEFINITIONS,
        "target": target.__dict__,
        "context": config.context,
        "memory": memory,
        "dtype": config.dtype,
        "bytes_per_value": bpv,
        "machine": next((r["machine"] for r in records if r.get("machine")), None),
        "budget": parse_count(config.budget),
        "rows": rows,
        "fits": fits,
        "depth_lines": _depth_lines(rows),
        "findings": _findings(rows, fits, target),
    }


def _depth_lines(rows: list[dict]) -> dict:
    """Linear fit ms = a + b·layers per (family, batch, vocab) for the depth families: is latency linear in depth?"""
    out = {}
    for family in ("equal_budget", "truncation"):
        groups: dict[tuple, list] = {}
        for r in rows:
            if r["family"] == family:
                groups.setdefault((r["batch"], r["shape"]["vocab"]), []).append((r["shape"]["layers"], r["step_ms"]))
        for (b, v), pts in groups.items():
            if len(pts) >= 3:
                x, y = np.array(pts, float).T
                slope, icpt = np.polyfit(x, y, 1)
                r2 = 1 - ((y - (icpt + slope * x)) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
                out[f"{family}/b{b}/V{v}"] = {"fixed_ms": float(icpt), "per_layer_ms": float(slope), "r2": float(r2)}
    return out


def _findings(rows: list[dict], fits: dict, target: Shape) -> list[str]:
    """Plain statements the batch-1 measurements support, each with its numbers."""
    out = []
    b1 = [r for r in rows if r["batch"] == min(r["batch"] for r in rows)] if rows else []
    trunc = sorted(
        (r["shape"]["layers"], r["step_ms"])
        for r in b1
        if r["family"] == "truncation" and r["shape"]["vocab"] == target.vocab
    )
    if len(trunc) >= 3:
        x, y = np.array(trunc, float).T
        slope, icpt = np.polyfit(x, y, 1)
        r2 = 1 - ((y - (icpt + slope * x)) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
        out.append(
            f"Full-width depth: step ≈ {icpt:.2f} + {slope:.2f}·layers ms (R² {r2:.3f}): "
            f"{'linear' if r2 > 0.97 else 'not linear'} in depth."
        )
    width = sorted(
        (r["shape"]["hidden"], r["step_ms"])
        for r in b1
        if r["family"] == "width" and r["shape"]["vocab"] == target.vocab
    )
    if len(width) >= 2:
        (w0, t0), (w1, t1) = width[0], width[-1]
        out.append(
            f"Width at fixed depth: {w0}→{w1} changes the step {t0:.2f}→{t1:.2f} ms "
            f"(×{t1 / t0:.2f} for ×{w1 / w0:.1f} width)."
        )
    eq = sorted(
        (r["shape"]["layers"], r["step_ms"])
        for r in b1
        if r["family"] == "equal_budget" and r["shape"]["vocab"] == target.vocab
    )
    if eq:
        best = min(eq, key=lambda p: p[1])
        out.append(
            f"Equal budget: fastest at {best[0]} layer(s) ({best[1]:.2f} ms); "
            + ", ".join(f"{k}L {ms:.2f}" for k, ms in eq)
            + " ms."
        )
    fit = fits.get(str(min((r["batch"] for r in rows), default=1)))
    if fit:
        model = cost.StepModel.from_dict(fit)
        for k in (1, 2, 4, 8):
            s = replace(target, layers=k)
            share = model.head_ms(s) / model.predict_ms(s)
            out.append(f"Fitted LM-head share of a full-width {k}-layer drafter: {100 * share:.0f} %.")
        crossover = model.head_ms(target) / max(model.layer_ms(target), 1e-9)
        out.append(f"The LM head ({target.vocab}×{target.hidden}) costs as much as {crossover:.1f} full-width layers.")
    return out


def format_sweep(summary: dict) -> str:
    lines = [f"{'family':<13}{'b':>3} {'shape':<34}{'non-emb':>10}{'ms':>8}{'c':>7}{'KV/seq MB':>11}{'max batch':>10}"]
    for r in summary["rows"]:
        lines.append(
            f"{r['family']:<13}{r['batch']:>3} {r['label']:<34}{r['params']['non_embedding'] / 1e6:>9.1f}M"
            f"{r['step_ms']:>8.2f}{r['c']:>7.3f}{r['kv_bytes_per_seq'] / 1e6:>11.1f}{r['max_batch']:>10}"
        )
    lines.append(
        f"max batch: target + drafter KV of the context beside both models' weights in "
        f"{summary['memory'] / 2**30:.1f} GiB"
    )
    for b, f in summary["fits"].items():
        lines.append(
            f"fit (batch {b}): {f['fixed_ms']:.2f} ms + layers·({f['layer_overhead_ms']:.3f} ms + "
            f"{f['ms_per_layer_mb']:.4f} ms/MB) + {f['ms_per_head_mb']:.4f} ms/MB of head; median error "
            f"{100 * f['median_abs_error']:.1f} %"
        )
    return "\n".join(lines + summary["findings"])
