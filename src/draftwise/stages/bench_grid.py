"""`draftwise bench` over a grid (drafters × γ × temperature × batch size): one run folder, one records.jsonl.

Every record is a `bench` record plus its point (drafter, gamma, temperature, batch_size, runtime; baselines have
drafter None and gamma 0; runtime is None but for the grid's `rows`: whole benches on other runtimes — another
target file, backend or precision — run on the same prompts, whose records carry the row's name). Items are (point,
unit, method), ordered unit by unit so that the points of one temperature and batch size are interleaved on the same
prompts (drift hits all alike); through the Ray executor each item is a task. A rerun skips the records that are
there. grid.json holds one bench summary per SD point, derived from the records.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm import tqdm

from .. import isolate, machine, specs, traffic
from ..config import BenchConfig, BenchGridConfig
from ..executors import Executor, InProcess, exclusive
from ..rundir import RunDir
from ..sd.families import REGISTRY
from . import bench, bench_methods

AXES = ("drafter", "gamma", "temperature", "batch_size", "runtime")


def point_of(config: BenchConfig, runtime: str | None = None) -> dict:
    return {
        "drafter": config.drafter,
        "gamma": config.gamma if config.drafter else 0,
        "temperature": config.temperature,
        "batch_size": config.batch_size,
        "runtime": runtime,
    }


def _same(record: dict, point: dict) -> bool:
    return all(record.get(a) == point[a] for a in AXES)  # records written before `runtime` existed: None


class GridRunner:
    """One process's view of the grid: models loaded once and shared by every point's `bench.Runner`."""

    def __init__(self, grid: BenchGridConfig, done: tuple = ()):
        if grid.bench.threads:
            torch.set_num_threads(grid.bench.threads)
        self.points, self.loaded, self.runners, self.done = specs.points(grid), {}, {}, done
        self.names = grid.runtimes()

    def point(self, index: int) -> dict:
        return point_of(self.points[index], self.names[index])

    def __call__(self, item: tuple[int, tuple[int, ...], str]) -> dict:
        index, unit, method = item
        isolate.crumb(runtime=self.names[index] or "")  # in an isolated child: the row a crash would cost
        if index not in self.runners:
            config = self.points[index]
            mine = [r for r in self.done if _same(r, self.point(index))]
            self.runners[index] = bench.Runner(config, *bench.load_models(config, self.loaded), mine)
        return {**self.point(index), **self.runners[index]((unit, method))}

    def close(self) -> None:
        for runner in self.runners.values():
            runner.close()


@dataclass(frozen=True)
class GridWork:
    grid: BenchGridConfig
    done: tuple = ()  # records already in the run folder (a learning suffix corpus is rebuilt from them)

    def __call__(self) -> GridRunner:
        return GridRunner(self.grid, self.done)


def _key(record: dict) -> tuple:
    return tuple(record.get(a) for a in AXES) + (record["method"], record["prompt_id"])


def by_request(config: BenchConfig | BenchGridConfig) -> BenchConfig | BenchGridConfig:
    """`config` where its bench asks for the lines of a --prompts file at their own temperatures (`own_temperatures`:
    the CLI's `--prompts` without `--temperature`): the file's temperatures become the temperature axis, each point
    decoding the lines at its own (one temperature: a single bench at it). A file whose lines set none decodes every
    line at `--temperature`, as it always did. Why: a user's traffic of code at T = 0 and chat at T = 1 measured all at
    T = 0 reports greedy speedups the chat requests never see."""
    grid = config if isinstance(config, BenchGridConfig) else None
    b = grid.bench if grid else config
    if not b.own_temperatures:
        return config
    prompts = bench.select_prompts(b)
    if not traffic.sets_temperatures(prompts):
        b = replace(b, own_temperatures=False)
        return replace(grid, bench=b) if grid else b
    temps = traffic.temperatures_of(prompts, (), own=True)
    print(
        f"[bench] each request of {b.prompts} at its own temperature: T = {', '.join(f'{t:g}' for t in temps)} "
        "(--temperature T decodes every one at T)",
        file=sys.stderr,
    )
    if grid is None and len(temps) == 1:
        return replace(b, temperature=temps[0])
    return replace(grid or BenchGridConfig(bench=b), temperatures=temps)


def run(grid: BenchGridConfig, out: str | Path, executor: Executor | None = None) -> Path:
    points = specs.points(grid)  # each checked against its drafter's kind before the run folder exists
    run_dir = RunDir(out, grid)
    work = GridWork(grid, tuple(run_dir.records()))
    runner = work()  # in-process, this runner (and the models loaded below) runs the items
    for config in points:  # every drafter loads and speaks the target's vocabulary, before any point runs
        bench.load_models(config, runner.loaded)
    target, _ = bench.load_models(points[0], runner.loaded)  # every point has the same target
    prompts, encoded = bench.encode_prompts(grid.bench, target)
    done = {_key(r) for r in run_dir.records()}
    items = []
    for index, config in enumerate(points):
        for order, unit in enumerate(bench.units(config, prompts, encoded)):
            for method in bench_methods.method_names(config):
                rec = {**runner.point(index), "method": method, "prompt_id": "+".join(prompts[i].id for i in unit)}
                if _key(rec) not in done:
                    items.append(((config.temperature, config.batch_size, order, index), (index, unit, method)))
    todo = [item for _, item in sorted(items, key=lambda x: x[0])]
    bar = tqdm(total=len(todo), desc="bench grid", unit="gen", file=sys.stderr, dynamic_ncols=True, disable=not todo)
    try:
        for _, rec in (executor or InProcess()).map(
            work, todo, exclusive(grid.bench.device, grid.bench.threads), runner
        ):
            run_dir.append(rec)
            bar.update()
            bar.set_postfix_str(
                f"{rec['method']} {label(rec['drafter'])} γ={rec['gamma']} B={rec['batch_size']}: "
                f"{rec['new_tokens'] / rec['seconds']:.1f} tok/s"
            )
    finally:  # servers and llama.cpp models the baselines started are stopped, finished or not
        runner.close()
        bar.close()
    here = machine.describe(grid.bench.threads)  # the bandwidth measured once per process (seconds)
    run_dir.write_json("machine.json", here)
    summary = summarize(run_dir.records(), points, grid.runtimes(), here)
    run_dir.write_json("grid.json", summary)
    print(format_grid(summary))
    print(f"run folder: {run_dir.path}")
    return run_dir.path


GENERIC = ("reduced", "checkpoint")  # folders every distillation writes: named with the run folder above them


def label(spec: str | None, width: int = 32) -> str:
    """A drafter spec short enough for a progress bar or a table: folders by their last part (two where the last is
    one every run has, so that two runs' `reduced/` heads are told apart)."""
    if not spec:
        return ""

    def short(part: str) -> str:
        head, colon, rest = part.partition(":")
        if not colon or head not in REGISTRY:  # a family head, else a path (model drafters)
            head, colon, rest = "", "", part
        first, comma, options = rest.partition(",")
        folders = first.rstrip("/").split("/")
        name = "/".join(folders[-2:]) if folders[-1] in GENERIC else folders[-1]
        return head + colon + name + comma + options

    text = "+".join(short(x) for x in spec.split("+"))
    return text if len(text) <= width else text[: width - 1] + "…"


def summarize(
    records: list[dict], points: list[BenchConfig], runtimes: list[str | None] | None = None, here: dict | None = None
) -> dict:
    """One `bench.summarize` per SD point, over its own records and its (temperature, batch size, runtime)'s
    baselines; `here`: the machine (`machine.describe`), for the plain methods' share of the bandwidth limit."""
    rows = []
    for config, runtime in zip(points, runtimes or [None] * len(points)):
        if not config.drafter:
            continue
        point = point_of(config, runtime)
        mine = [r for r in records if _same(r, point)]
        baselines = [
            r
            for r in records
            if r["drafter"] is None
            and r["temperature"] == config.temperature
            and r["batch_size"] == config.batch_size
            and r.get("runtime") == runtime
        ]
        if mine:
            rows.append(
                {**point, "synthetic_alpha": config.synthetic_alpha, **bench.summarize(mine + baselines, config, here)}
            )
    return {"definitions": rows[0]["definitions"] if rows else "", "points": rows, "machine": here}


def as_method(point: dict, method: str) -> dict:
    """A grid point's summary whose top-level SD figures are `method`'s (static SD: the point as it is; the
    scheduled method measured in the same point: its own)."""
    if method == "sd":
        return point
    m = point["methods"][method]
    return {
        **point,
        **{k: m.get(k) for k in ("tokens_per_s", "tar", "alpha", "speedup_vs_ar", "by_suite")},
        "methods": {**point["methods"], "sd": m},
    }


def format_grid(summary: dict) -> str:
    lines = [f"{'drafter':<40}{'γ':>3}{'T':>5}{'B':>4}{'SD tok/s':>10}{'AR tok/s':>10}{'vs AR':>7}{'TAR':>6}{'α':>7}"]
    for r in summary["points"]:
        ar = r["baselines"].get("ar", {}).get("tokens_per_s")
        rows = [(label(r["drafter"], 40), r)]
        if bench.SCHEDULED in r["methods"]:  # the same drafter and γ with the round scheduler
            rows.append(("  scheduled", r["methods"][bench.SCHEDULED]))
        for name, s in rows:
            lines.append(
                f"{name:<40}{r['gamma']:>3}{r['temperature']:>5g}{r['batch_size']:>4}"
                f"{s['tokens_per_s']:>10.2f}{ar if ar is not None else float('nan'):>10.2f}"
                f"{s['speedup_vs_ar'] or float('nan'):>7.2f}{s.get('tar') or float('nan'):>6.2f}"
                f"{s.get('alpha') or float('nan'):>7.3f}"
            )
    suites = sorted({s for r in summary["points"] for s in r.get("by_suite", {})})
    if len(suites) > 1:  # per task: TAR / SD over AR on that suite's prompts
        lines += [
            "",
            f"{'drafter (TAR / SD over AR per suite)':<40}{'γ':>3}{'T':>5}" + "".join(f"{s[:11]:>13}" for s in suites),
        ]
        for r in summary["points"]:
            cells = [r["by_suite"].get(s) for s in suites]
            lines.append(
                f"{label(r['drafter'], 40):<40}{r['gamma']:>3}{r['temperature']:>5g}"
                + "".join(
                    f"{c['tar']:>6.2f}/{c['speedup_vs_ar']:.2f}x" if c and c["speedup_vs_ar"] else f"{'-':>13}"
                    for c in cells
                )
            )
    return "\n".join(lines)
