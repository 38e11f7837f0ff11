"""`draftwise profile`: where a speculative-decoding round spends its time on this machine.

Times, with warm-up and repeats (medians reported, GPU work synchronised), at a KV cache already holding `context`
positions: the target's AR step; its verify pass over γ+1 tokens for each γ; one serial step of each drafter, and
of the full-width k-layer truncations of the target (`depths`), which give step time against depth; and the LM head
alone. A lookup drafter (ngram, suffix) has no step: its point is one round's proposal (index the newest token,
propose up to the largest γ, roll the token back) over `context` tokens of real text (packaged eval prompts). Every
point other than the AR step itself is timed interleaved with the target's AR step at the same batch (`ref_ms`), so
the ratios (verify / AR step, c) are measured side by side and survive machine drift. Each timing point is appended
to records.jsonl as it finishes; a rerun skips finished points. profile.json and the plots are derived from the
records.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .. import data, specs
from ..config import ProfileConfig
from ..errors import DraftwiseError
from ..executors import Executor, InProcess, exclusive
from ..rundir import RunDir
from ..runtimes.base import Model, ModelOptions
from ..runtimes.registry import fill_cache, load, load_drafter, runtime, stamp
from ..sd.families import drafter_kind
from ..shapes import Shape
from ..timing import check_machine, measure_interleaved, median

DEFINITIONS = """\
ar_step_ms: the target's forward over 1 new token (batch b, `context` positions cached), median of repeats.
verify_ms[γ]: the target's forward over γ+1 new tokens, returning all γ+1 logits.
verify_over_ar_step[γ] = median verify / median AR step, both timed interleaved in the same point.
step_ms (drafter): one serial drafter forward over 1 token (a feature drafter: one step of its head, which reads the
target's feature and no cache); catch_up_ms (a model drafter, batch 1): its forward over 2 tokens returning 1 logit,
a round's first step after a round that accepted every draft (the last draft and the bonus token fed together); for a
lookup drafter, one round's whole proposal (up to
the largest γ) at `context` tokens. head_ms: final norm + LM head over 1 token per sequence.
head_share = head_ms / step_ms. c = median drafter step / median AR step, timed interleaved.
cycle[γ]: a round's time split, draft_share = γ·t_q / (γ·t_q + verify_ms[γ]), target_share = 1 − draft_share.
depth_fit: least squares step_ms = fixed_ms + per_layer_ms · layers over the full-width truncations and the target."""


def depth_spec(k: int) -> str:
    return "layers:" + ",".join(str(i) for i in range(k))


def points(config: ProfileConfig, n_layers: int) -> list[dict]:
    """Every timing point of a run, in the order they are taken (a point is also its record's key). llama.cpp runs a
    whole forward or nothing, so its runs have no LM-head points."""
    drafters = [depth_spec(k) for k in config.depths if k < n_layers] + list(config.drafters)
    heads = runtime(config.backend).lm_heads
    out = []
    for b in config.batches:
        out.append({"kind": "step", "model": "target", "batch": b, "tokens": 1})
        out += [{"kind": "verify", "model": "target", "batch": b, "tokens": g + 1, "gamma": g} for g in config.gammas]
        out += [{"kind": "head", "model": "target", "batch": b, "tokens": 1}] if heads else []
        out += [
            {"kind": "propose" if drafter_kind(d) == "lookup" else "step", "model": d, "batch": b, "tokens": 1}
            for d in drafters
        ]
        out += [
            {"kind": "head", "model": d, "batch": b, "tokens": 1}
            for d in config.drafters
            if drafter_kind(d) == "model" and heads
        ]
        out += [  # a round's catch-up step, which the SD loop pays after every fully accepted round
            {"kind": "step", "model": d, "batch": b, "tokens": 2}
            for d in config.drafters
            if drafter_kind(d) == "model" and b == 1
        ]
    return out


def key(point: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in point.items() if k not in ("ms", "ref_ms", "median_ms", "machine")))


@dataclass(frozen=True)
class ProfileWork:
    """The executor's recipe: load the target and every drafter (once per process), then time points with them."""

    config: ProfileConfig

    def __call__(self) -> Timer:
        c = self.config
        if c.threads:
            torch.set_num_threads(c.threads)
        models = load_models(c)
        return Timer(models, c, stamp(models["target"], _options(c)))


def _options(config: ProfileConfig) -> ModelOptions:
    return ModelOptions(config.dtype, config.device, config.backend, config.compile, gguf_quant=config.gguf_quant)


def load_models(config: ProfileConfig) -> dict[str, Model]:
    options = _options(config)
    target = load(config.target, options)
    models = {"target": target}
    for spec in dict.fromkeys(
        p["model"] for p in points(config, target.config.num_hidden_layers) if p["model"] != "target"
    ):
        if drafter_kind(spec) == "model":
            models[spec] = load_drafter(spec, target, options)
        elif drafter_kind(spec) in ("lookup", "feature"):
            models[spec] = specs.load(spec, target, options)
        else:
            raise DraftwiseError(
                f"profile times model, feature and lookup drafters; profile a hybrid's parts instead ({spec})"
            )
    return models


def real_text(target: Model, n: int) -> list[int]:
    """n tokens of real text: packaged eval prompts (long articles first), encoded and joined, repeated if short."""
    ids: list[int] = []
    for p in data.load_prompts("cnn_dm,xsum,arena,spec_bench", "eval"):
        ids += target.encode(p.text)
        if len(ids) >= n:
            break
    if not ids:
        raise DraftwiseError("no packaged prompt encodes to any token")
    return (ids * (n // len(ids) + 1))[:n]


class Timer:
    """Times one point: a forward at position `context` (the cache is filled once per model and batch) or the head."""

    def __init__(self, models: dict[str, Model], config: ProfileConfig, machine: dict):
        self.models, self.config, self.machine = models, config, machine
        self.gen = torch.Generator().manual_seed(config.seed)

    def __call__(self, point: dict) -> dict:
        fn = self.call(point)
        if point["kind"] == "step" and point["model"] == "target":
            (ms,) = measure_interleaved([fn], self.device, self.config.warmup, self.config.repeats)
            return {"ms": ms, "machine": self.machine}
        ref = self.call({"kind": "step", "model": "target", "batch": point["batch"], "tokens": 1})
        ms, ref_ms = measure_interleaved([fn, ref], self.device, self.config.warmup, self.config.repeats)
        return {"ms": ms, "ref_ms": ref_ms, "machine": self.machine}

    @property
    def device(self):
        return self.models["target"].lm.device

    def call(self, point: dict):
        """A zero-argument function that runs the point once."""
        if point["kind"] == "propose":
            return self.propose(self.models[point["model"]].loop_drafter, max(self.config.gammas))
        if point["model"] != "target" and drafter_kind(point["model"]) == "feature":
            return self.feature_step(self.models[point["model"]].loop_drafter.head, point["batch"])
        lm = self.models[point["model"]].lm
        b, t, ctx = point["batch"], point["tokens"], self.config.context
        dev = lm.device
        if point["kind"] == "head":
            x = torch.randn(b, 1, lm.config.hidden_size, generator=self.gen).to(dev, lm.dtype)
            return lambda: lm.logits(x)
        fill_cache(lm, b, ctx, max(self.config.gammas) + 1, self.gen)
        ids = torch.randint(0, lm.vocab_size, (b, t), generator=self.gen).to(dev)
        n = t if point["model"] == "target" else 1  # a verify pass returns every position's logits, a draft step one
        return lambda: lm.forward(ids, ctx, n)  # a lean cache is preallocated: garbage in it costs what real keys do

    def feature_step(self, head, batch: int):
        """One draft step of a feature head (`runtimes.lean.feature_head`): a feature and a token per row in, the next
        feature and the drafted token out; it reads no cache, so `context` does not change it."""
        dev = head.d2t.device
        features = torch.randn(batch, head.config.hidden, generator=self.gen).to(dev)
        tokens = torch.randint(0, head.config.vocab_size, (batch,), generator=self.gen).to(dev)

        def step():
            with torch.no_grad():
                logits, _ = head(features, tokens)
                return head.d2t[logits.argmax(-1)]

        return step

    def propose(self, lookup, gamma: int):
        """One round of a lookup drafter at `context` tokens: the newest token indexed, a proposal, the token rolled
        back (so every repeat sees the same index)."""
        text = real_text(self.models["target"], self.config.context + 1)
        session = lookup.start([text[:-1]])
        seq = text

        def round_():
            session.propose({0: seq}, gamma)
            session.keep(0, len(seq) - 1)

        return round_


def run(config: ProfileConfig, out: str | Path, executor: Executor | None = None) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = RunDir(out, config)
    work = ProfileWork(config)
    timer = work()  # the models here too: the summary needs their shapes; in-process, this Timer does the timing
    models = timer.models
    records = run_dir.records()
    done = {key(r) for r in records}
    todo = [p for p in points(config, models["target"].config.num_hidden_layers) if key(p) not in done]
    bar = tqdm(total=len(todo), desc="profile", unit="point", file=sys.stderr, dynamic_ncols=True, disable=not todo)
    for point, times in (executor or InProcess()).map(work, todo, exclusive(config.device, config.threads), timer):
        check_machine(records, times["machine"], run_dir.path)
        records.append({**point, "median_ms": median(times["ms"]), **times})
        run_dir.append(records[-1])
        bar.update()
        bar.set_postfix_str(
            f"{point['kind']} {point['model'][:24]} b={point['batch']} t={point['tokens']}: "
            f"{median(times['ms']):.2f} ms"
        )
    bar.close()
    summary = summarize(
        run_dir.records(), {spec: m.config for spec, m in models.items() if hasattr(m, "config")}, config
    )
    run_dir.write_json("profile.json", summary)
    from ..report.plots import plot_profile

    for path in plot_profile(summary, run_dir.path):
        print(f"plot: {path}")
    print(format_profile(summary))
    return run_dir.path


def summarize(records: list[dict], configs: dict, config: ProfileConfig) -> dict:
    """profile.json from the raw records (medians, ratios, shares and the depth fit are all derived here)."""
    target_shape = Shape.of(configs["target"])
    out = {
        "definitions": DEFINITIONS,
        "context": config.context,
        "machine": next((r["machine"] for r in records if r.get("machine")), None),
        "target": {"spec": config.target, "shape": target_shape.__dict__, "params": target_shape.params()},
        "batches": {},
    }
    for b in config.batches:
        recs = [r for r in records if r["batch"] == b]
        get = {(r["kind"], r["model"], r["tokens"]): r["median_ms"] for r in recs}
        rel = {
            (r["kind"], r["model"], r["tokens"]): r["median_ms"] / median(r["ref_ms"]) for r in recs if "ref_ms" in r
        }
        ar = get.get(("step", "target", 1))
        if ar is None:
            continue
        verify = {r["gamma"]: r["median_ms"] for r in recs if r["kind"] == "verify"}
        ratio = {r["gamma"]: rel[("verify", "target", r["tokens"])] for r in recs if r["kind"] == "verify"}
        entry = {
            "ar_step_ms": ar,
            "verify_ms": verify,
            "verify_over_ar_step": ratio,
            "head_ms": get.get(("head", "target", 1)),
            "drafters": {},
        }
        for spec in dict.fromkeys(r["model"] for r in recs if r["kind"] == "propose"):
            step = get[("propose", spec, 1)]
            entry["drafters"][spec] = {
                "kind": "lookup",
                "layers": None,
                "shape": None,
                "params": None,
                "step_ms": step,
                "head_ms": None,
                "head_share": None,
                "c": rel[("propose", spec, 1)],
                "cycle": None,
            }
        for spec in dict.fromkeys(r["model"] for r in recs if r["kind"] == "step" and r["model"] != "target"):
            step = get[("step", spec, 1)]
            catch_up = get.get(("step", spec, 2))
            head = get.get(("head", spec, 1)) or (entry["head_ms"] if spec.startswith("layers:") else None)
            shape = Shape.of(configs[spec]) if spec in configs else None
            entry["drafters"][spec] = {
                "kind": drafter_kind(spec),  # model, or feature (a feature head's step)
                "layers": shape.layers if shape else None,
                "shape": shape.__dict__ if shape else None,
                "params": shape.params() if shape else None,
                "step_ms": step,
                "catch_up_ms": catch_up,
                "head_ms": head,
                "head_share": head / step if head else None,
                "c": rel[("step", spec, 1)],
                "cycle": {
                    g: {"draft_share": g * step / (g * step + v), "target_share": v / (g * step + v)}
                    for g, v in verify.items()
                },
            }
        entry["depth_fit"] = _depth_fit(entry, target_shape.layers)
        out["batches"][str(b)] = entry
    return out


def _depth_fit(entry: dict, target_layers: int) -> dict | None:
    """step = fixed + per_layer · layers over full-width truncations (layers:0..k-1) and the target itself."""
    pts = [(d["layers"], d["step_ms"]) for spec, d in entry["drafters"].items() if spec == depth_spec(d["layers"] or 0)]
    pts.append((target_layers, entry["ar_step_ms"]))
    if len(pts) < 3:
        return None
    x, y = np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)
    slope, fixed = np.polyfit(x, y, 1)
    pred = fixed + slope * x
    r2 = 1 - ((y - pred) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-12)
    return {
        "fixed_ms": float(fixed),
        "per_layer_ms": float(slope),
        "r2": float(r2),
        "points": pts,
        "fixed_without_head_ms": float(fixed - entry["head_ms"]) if entry.get("head_ms") else None,
    }


def format_profile(summary: dict) -> str:
    lines = []
    for b, e in summary["batches"].items():
        head = f", LM head {e['head_ms']:.2f} ms" if e.get("head_ms") else ""
        lines.append(f"batch {b}: AR step {e['ar_step_ms']:.2f} ms{head}")
        lines.append(
            "  verify/AR-step by γ: " + ", ".join(f"{g}: {r:.2f}" for g, r in e["verify_over_ar_step"].items())
        )
        fit = e.get("depth_fit")
        if fit:
            lines.append(
                f"  depth fit: {fit['fixed_ms']:.2f} ms + {fit['per_layer_ms']:.3f} ms/layer (R² {fit['r2']:.3f})"
            )
        for spec, d in e["drafters"].items():
            if d.get("kind") == "lookup":
                lines.append(
                    f"  {spec[:40]:<40} {d['step_ms']:7.3f} ms per proposal ({100 * d['c']:.2f} % of an AR step)"
                )
                continue
            share = f", head {100 * d['head_share']:.0f} %" if d.get("head_share") else ""
            lines.append(f"  {spec[:40]:<40} {d['step_ms']:7.2f} ms (c = {d['c']:.3f}{share})")
    return "\n".join(lines)
