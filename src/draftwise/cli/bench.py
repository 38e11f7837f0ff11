"""`draftwise bench`: one config, or a grid over drafters × γ × temperatures × batch sizes."""

from __future__ import annotations

from dataclasses import replace

from ..config import BenchConfig, BenchGridConfig, split_baselines
from ..errors import DraftwiseError
from . import options
from .command import Command, executor, executor_args, out_arg, run_stage, subparser

AXES = ("drafter", "gamma", "temperature", "batch_size")  # a comma list (a repeated --drafter): a grid's axis


def add(sub) -> dict[str, Command]:
    p = subparser(
        sub, "bench", "speculative decoding with a drafter vs baselines, same prompts, same process", BenchConfig, AXES
    )
    executor_args(p)
    out_arg(p, "run folder (rerun on the same folder to resume)")
    return {"bench": Command(BenchConfig, make, _run, p)}


def baselines(values: list[str] | None) -> tuple[str, ...]:
    """--baseline values (None: not given) as BenchConfig.baselines (config.split_baselines on each)."""
    return tuple(b for value in (["ar"] if values is None else values) for b in split_baselines(value))


def make(args) -> BenchConfig | BenchGridConfig:
    """One BenchConfig, or a grid when an axis has more than one value or a drafter has its own γ (SPEC@γ)."""
    given = options.values(BenchConfig, args)
    axes = {name: given.pop(name) for name in AXES if name in given}
    first = {name: values[0] for name, values in axes.items() if values}
    if "drafter" in first:
        first["drafter"] = _own_gamma(first["drafter"])[0]
    by_line = bool(given.get("prompts")) and "temperature" not in axes  # the file's own (`bench_grid.by_request`)
    config = BenchConfig(**given, **first, own_temperatures=by_line)
    drafters = axes.get("drafter", ())
    own = [_own_gamma(d) for d in drafters]  # SPEC@γ: that drafter at its own γ

    def axis(name: str) -> tuple:
        return axes.get(name) or (getattr(config, name),)

    if any(g for _, g in own):
        if not all(g for _, g in own):
            raise DraftwiseError("give every --drafter its own γ (SPEC@γ), or none")
        return BenchGridConfig(
            bench=replace(config, drafter=own[0][0], gamma=own[0][1]),
            drafters=tuple(d for d, _ in own),
            drafter_gammas=tuple(g for _, g in own),
            temperatures=axis("temperature"),
            batch_sizes=axis("batch_size"),
        )
    if all(len(values) <= 1 for values in axes.values()):
        return config
    return BenchGridConfig(
        bench=config,
        drafters=drafters,
        gammas=axis("gamma"),
        temperatures=axis("temperature"),
        batch_sizes=axis("batch_size"),
    )


def _run(config: BenchConfig | BenchGridConfig, args) -> None:
    from ..stages import bench, bench_grid

    config = bench_grid.by_request(config)
    stage = bench_grid if isinstance(config, BenchGridConfig) else bench
    run_stage(stage.run, config, args, executor(args) if args.executor != "inprocess" else None)


def _own_gamma(spec: str) -> tuple[str, int | None]:
    head, at, tail = spec.rpartition("@")
    return (head, int(tail)) if at and tail.isdigit() else (spec, None)
