"""`draftwise bench`: speculative decoding with a drafter against its baselines, on the same prompts, in one process.

The methods (sd, ar, transformers' and llama.cpp's decoding; each a function `(prompt ids, seed) -> record`) are built
in `bench_methods`; this module runs them and sums them up (summary.json and the printed table, from the records).
Methods are interleaved prompt by prompt (machine drift hits all alike) after untimed warm-up runs. Each finished
(method, prompt) is appended to records.jsonl at once; a rerun on the same folder skips what is there.

A suffix drafter with learn=1 adds each finished SD output to its corpus; the prompt being decoded has its own earlier
output taken out first, warm-ups and baselines add nothing, and a resumed run re-adds the outputs of its records.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .. import data, machine, metrics, specs
from ..config import BenchConfig
from ..errors import DraftwiseError
from ..executors import Executor, InProcess, exclusive
from ..rundir import RunDir
from ..runtimes.base import Model
from ..runtimes.registry import describe, load
from ..traffic import temperature_of
from .bench_methods import SCHEDULED, method_names, methods, model_options, plain_bytes


def select_prompts(config: BenchConfig) -> list[data.Prompt]:
    if config.prompts:
        return data.spread(data.read_prompt_file(config.prompts), config.limit)
    return data.load_prompts(config.suite, config.split, config.limit)


def units(config: BenchConfig, prompts: list[data.Prompt], encoded: list[list[int]]) -> list[tuple[int, ...]]:
    """Work units: single prompts, or batches of B decoded together (similar lengths together: less padded prefill);
    with `own_temperatures`, of the prompts at this config's temperature only (`traffic.temperature_of`)."""
    B = config.batch_size
    mine = [i for i, p in enumerate(prompts) if not config.own_temperatures or temperature_of(p) == config.temperature]
    order = sorted(mine, key=lambda i: (len(encoded[i]), i)) if B > 1 else mine
    return [tuple(order[i : i + B]) for i in range(0, len(order), B)]


def encode_prompts(config: BenchConfig, target: Model) -> tuple[list[data.Prompt], list[list[int]]]:
    prompts = select_prompts(config)
    encoded = [target.encode(p.text) for p in prompts]
    empty = [p.id for p, ids in zip(prompts, encoded) if not ids]
    if empty:
        raise DraftwiseError(f"prompt {empty[0]} encodes to no tokens")
    return prompts, encoded


class Runner:
    """Runs one (unit, method) of a bench config and returns its record; warms each method up before its first."""

    def __init__(
        self,
        config: BenchConfig,
        target: Model,
        drafter: specs.Drafter | None,
        done: list[dict] = (),
        log_dir: str | Path | None = None,
    ):
        self.config, self.target, self.drafter = config, target, drafter
        self.prompts, self.encoded = encode_prompts(config, target)
        longest = max(map(len, self.encoded), default=0)
        self.fns = methods(config, target, drafter, longest, Path(log_dir) if log_dir else None)
        self.warm: set[str] = set()
        self.bytes: dict[str, int | None] = {}  # a plain method's weight bytes per step (`plain_bytes`), once each
        for rec in done:  # a resumed run: a learning corpus, a scheduler's calibration get back what requests added
            self.observe(rec)

    def observe(self, rec: dict) -> None:
        """A finished SD record's outputs join a learning suffix corpus (a no-op for every other drafter); a
        scheduled one's observations join its scheduler's calibration."""
        scheduler = getattr(self.fns.get(rec["method"]), "scheduler", None)
        if scheduler is not None:
            scheduler.commit(rec["rounds"])
        if rec["method"] != "sd":
            return
        lookup = self.drafter.lookup if self.drafter else None
        if getattr(lookup, "learn", False):
            for prompt_id, tokens in zip(
                rec["prompt_id"].split("+"), rec["tokens"] if rec["batch"] > 1 else [rec["tokens"]]
            ):
                lookup.observe(prompt_id, tokens)

    def input(self, unit: tuple[int, ...]):
        return self.encoded[unit[0]] if self.config.batch_size == 1 else [self.encoded[i] for i in unit]

    def answer(self, unit: tuple[int, ...]) -> dict:
        """A request's own answer length (a prompt file's `max_tokens`), where it has one and decodes alone."""
        own = self.prompts[unit[0]].extra.get("max_tokens") if len(unit) == 1 else None
        return {"max_new_tokens": own} if own else {}

    def __call__(self, item: tuple[tuple[int, ...], str]) -> dict:
        unit, name = item
        fn, c = self.fns[name], self.config
        if name not in self.warm:  # kernels compiled, caches allocated, weights paged in
            for _ in range(c.warmup):
                fn(self.input(unit), c.seed, max_new_tokens=min(16, c.max_new_tokens))
            self.warm.add(name)
        prompt = self.prompts[unit[0]]
        lookup = self.drafter.lookup if self.drafter and name == "sd" else None
        for i in unit if getattr(lookup, "learn", False) else ():
            lookup.forget(self.prompts[i].id)  # never decode a prompt with its own earlier output in the corpus
        rec = {
            "method": name,
            "prompt_id": "+".join(self.prompts[i].id for i in unit),
            "suite": prompt.suite,
            "category": prompt.category,
            "prompt_tokens": sum(len(self.encoded[i]) for i in unit),
            "batch": len(unit),
            **fn(self.input(unit), c.seed + unit[0], **self.answer(unit)),
        }
        if name not in self.bytes:
            self.bytes[name] = plain_bytes(name, self.target)
        if self.bytes[name] is not None:  # plain decoding: the share of the bandwidth limit it reached (`machine`)
            rec["bytes_per_step"] = self.bytes[name]
        self.observe(rec)
        return rec

    def close(self) -> None:
        """Stop the servers and free the llama.cpp models that baselines started (the rest has nothing to free)."""
        for fn in self.fns.values():
            getattr(fn, "close", lambda: None)()


def load_models(config: BenchConfig, loaded: dict | None = None) -> tuple[Model, specs.Drafter | None]:
    """Target and drafter of `config`; `loaded` (spec -> model or drafter) lets several configs share one process's."""
    loaded = {} if loaded is None else loaded
    options = model_options(config)
    key = (config.target, options)
    if key not in loaded:
        loaded[key] = load(config.target, options)
    target = loaded[key]
    if config.drafter and (config.drafter, key) not in loaded:
        loaded[(config.drafter, key)] = specs.load(config.drafter, target, options)
    return target, loaded[(config.drafter, key)] if config.drafter else None


@dataclass(frozen=True)
class BenchWork:
    """The executor's recipe: load the models (once per process), then run (unit, method) items."""

    config: BenchConfig

    done: tuple = ()  # records already in the run folder (a learning suffix corpus is rebuilt from them)
    log_dir: str | None = None  # the run folder: llama-server baselines write their logs there

    def __call__(self) -> Runner:
        if self.config.threads:
            torch.set_num_threads(self.config.threads)
        return Runner(self.config, *load_models(self.config), self.done, self.log_dir)


def run(config: BenchConfig, out: str | Path, executor: Executor | None = None) -> Path:
    specs.check(config)  # what the drafter's kind cannot run, refused before the run folder exists
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = RunDir(out, config)
    work = BenchWork(config, tuple(run_dir.records()), str(run_dir.path))
    runner = work()  # the models here too (prompts, the summary); in-process, this Runner does the runs
    target, drafter, prompts, encoded = runner.target, runner.drafter, runner.prompts, runner.encoded
    names = method_names(config)
    unit_id = lambda u: "+".join(prompts[i].id for i in u)  # noqa: E731
    done = {(r["method"], r["prompt_id"]) for r in run_dir.records()}
    todo = [(u, name) for u in units(config, prompts, encoded) for name in names if (name, unit_id(u)) not in done]
    bar = tqdm(total=len(todo), desc="bench", unit="gen", file=sys.stderr, dynamic_ncols=True, disable=not todo)
    try:
        for _, rec in (executor or InProcess()).map(work, todo, exclusive(config.device, config.threads), runner):
            run_dir.append(rec)
            bar.update()
            bar.set_postfix_str(f"{rec['method']} {rec['new_tokens'] / rec['seconds']:.1f} tok/s")
    finally:  # a crashed or interrupted bench leaves no llama-server behind
        runner.close()
        bar.close()
    here = machine.describe(config.threads)  # the bandwidth measured once per process (seconds)
    run_dir.write_json("machine.json", here)
    summary = summarize(run_dir.records(), config, here)
    summary["target"] = describe(target)
    summary["drafter"] = drafter.describe() if drafter else None
    run_dir.write_json("summary.json", summary)
    print(format_table(summary))
    print(f"run folder: {run_dir.path}")
    return run_dir.path


def summarize(records: list[dict], config: BenchConfig, here: dict | None = None) -> dict:
    """summary.json, derived from the raw records alone (see `metrics` for the definitions); `here`: the machine
    (`machine.describe`), for each plain method's share of its bandwidth limit."""
    by_method: dict[str, list[dict]] = {}
    for r in records:
        by_method.setdefault(r["method"], []).append(r)
    per = {name: metrics.summarize_method(recs) for name, recs in by_method.items()}
    ar_speed = per.get("ar", {}).get("tokens_per_s")
    if SCHEDULED in per:  # its figures per task, as the point's (static SD's) below
        per[SCHEDULED]["by_suite"] = metrics.per_suite(by_method[SCHEDULED], by_method.get("ar", []))
    for name, s in per.items():
        s["speedup_vs_ar"] = s["tokens_per_s"] / ar_speed if ar_speed else None
        greedy_pair = config.temperature == 0 and name != "ar" and "ar" in by_method and config.synthetic_alpha is None
        s["identical_to_ar"] = metrics.identical_fraction(by_method[name], by_method["ar"]) if greedy_pair else None
        if greedy_pair and s["identical_to_ar"] < 1:  # where the outputs part, not only how often
            s["divergence"] = metrics.divergence(by_method[name], by_method["ar"])
        s["bandwidth_share"] = machine.share(s.get("decode_tokens_per_s"), s.get("bytes_per_step"), here)
    head = per.get("sd") or per.get("ar") or next(iter(per.values()), {})
    ar_step = per.get("ar", {}).get("verify_ms", {}).get(0)
    verify = per.get("sd", {}).get("verify_ms", {}).get(config.gamma)
    return {
        "definitions": metrics.__doc__.strip(),
        "method": "sd" if "sd" in per else "ar",
        "gamma": config.gamma if "sd" in per else 0,
        "tokens_per_s": head.get("tokens_per_s"),
        "tar": head.get("tar"),
        "alpha": head.get("alpha"),
        "acceptance_per_position": head.get("acceptance_per_position"),
        "speedup_vs_ar": head.get("speedup_vs_ar"),
        "greedy_identical_to_ar": per["sd"]["identical_to_ar"] if "sd" in per else None,
        "ar_step_ms": ar_step,
        "verify_ms": verify,
        "verify_over_ar_step": verify / ar_step if verify and ar_step else None,
        "draft_step_ms": per.get("sd", {}).get("draft_step_ms"),
        "baselines": {
            name: {
                "tokens_per_s": s["tokens_per_s"],
                "identical_to_ar": s["identical_to_ar"],
                **({k: s[k] for k in ("drafted", "accepted", "alpha")} if "drafted" in s else {}),
                **({"wall_tokens_per_s": s["wall_tokens_per_s"]} if "wall_tokens_per_s" in s else {}),
            }
            for name, s in per.items()
            if name != "sd"
        },
        "methods": per,
        "by_suite": metrics.per_suite(by_method.get("sd", []), by_method.get("ar", [])),
        "machine": here,
    }


def schedule_line(sched: dict, min_positions: int = 100) -> str:
    """The scheduler's k* distribution, share of proposed tokens verified, and its calibration in one line."""
    big = [c for c in sched["calibration"] if c["positions"] >= min_positions]
    worst = max(big, key=lambda c: abs(c["gap"])) if big else None
    return (
        f"rounds by k* {sched['k']}, {100 * (sched['verified_fraction'] or 0):.0f} % of proposed tokens verified, "
        f"{sched['paused_rounds']} paused; calibration (predicted − observed acceptance) in bins of ≥ "
        f"{min_positions} positions: "
        + (f"worst {worst['gap']:+.3f} in {worst['bin']} ({len(big)} bins)" if worst else "no bin that large")
    )


def format_table(summary: dict) -> str:
    def fmt(v, spec, scale=1.0, unit=""):
        return "-" if v is None else format(v * scale, spec) + unit

    w = max([17] + [len(name) + 2 for name in summary["methods"]])  # llama-server:ARGS names can be long
    lines = [f"{'method':<{w}}{'tokens/s':>9}{'vs AR':>8}{'TAR':>7}{'alpha':>7}{'same as AR':>12}"]
    notes = []
    if summary.get("verify_over_ar_step"):
        notes.append(
            f"verify pass over γ+1={summary['gamma'] + 1} tokens: {summary['verify_ms']:.1f} ms = "
            f"{summary['verify_over_ar_step']:.2f}x one AR step ({summary['ar_step_ms']:.1f} ms); "
            f"draft step {summary['draft_step_ms']:.1f} ms"
        )
    for name, s in summary["methods"].items():
        lines.append(
            f"{name:<{w}}{s['tokens_per_s']:>9.2f}{fmt(s['speedup_vs_ar'], '.2f', unit='x'):>8}"
            f"{fmt(s.get('tar'), '.2f'):>7}"
            f"{fmt(s.get('alpha'), '.3f'):>7}{fmt(s['identical_to_ar'], '.0f', 100, '%'):>12}"
        )
    for name, s in summary["methods"].items():
        if "drafted" in s and (s["drafted"] or name != "llama-server"):  # engines that report totals only
            notes.append(
                f"{name}: drafted {s['drafted']}, accepted {s['accepted']}"
                + (f" ({s['alpha']:.1%})" if s["alpha"] is not None else "")
            )
    for name, s in summary["methods"].items():
        if s.get("bandwidth_share") is not None:
            notes.append(f"{name}: " + bandwidth_line(s, summary["machine"]))
    for name, s in summary["methods"].items():
        if s.get("schedule"):
            notes.append(f"{name}: " + schedule_line(s["schedule"]))
    for name, s in summary["methods"].items():
        if s.get("divergence"):
            d = s["divergence"]
            notes.append(
                f"{name} differs from AR on {d['prompts_differing']} prompt(s), first after "
                f"{d['first_min']}–{d['first_max']} identical tokens (median {d['first_median']})"
            )
    if len(summary.get("by_suite", {})) > 1:
        notes.append(
            "SD per suite (TAR, SD / AR): "
            + ", ".join(
                f"{suite} {fmt(v['tar'], '.2f')} {fmt(v['speedup_vs_ar'], '.2f', unit='x')}"
                for suite, v in summary["by_suite"].items()
            )
        )
    if summary.get("machine"):
        notes.append("machine: " + machine.line(summary["machine"]))
    return "\n".join(lines + notes)


def bandwidth_line(s: dict, here: dict) -> str:
    """A plain method's decode speed against this machine's bandwidth limit, in words."""
    return (
        f"decode {s['decode_tokens_per_s']:.1f} tokens/s × {s['bytes_per_step'] / 1e6:.0f} MB of weights a step = "
        f"{100 * s['bandwidth_share']:.0f} % of the measured read bandwidth "
        f"({here['bandwidth']['read_gb_per_s']:g} GB/s; limit {machine.limit(s['bytes_per_step'], here):.0f} tokens/s)"
    )
