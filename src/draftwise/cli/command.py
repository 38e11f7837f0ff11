"""What every command shares: the `Command` each module gives, its parser made from its config's fields, and what
is not a stage's setting — where its run folder goes, where its work runs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NamedTuple

from . import options


class Command(NamedTuple):
    """A subcommand: its config class, how its arguments become that config, and how the config runs."""

    config: type
    make: Callable[[argparse.Namespace], Any]  # args -> config
    run: Callable[[Any, argparse.Namespace], None]  # (config, args) -> None
    parser: argparse.ArgumentParser


def subparser(sub, name: str, help: str, config: type, axes: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """A subcommand's parser with an argument per user field of `config`."""
    p = sub.add_parser(name, help=help, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    options.add(p, config, axes)
    return p


def simple(config: type, run, parser: argparse.ArgumentParser) -> Command:
    """A command whose config is its given options as they are."""
    return Command(config, lambda args: config(**options.values(config, args)), run, parser)


def out_arg(p, help: str = "run folder; rerun the same command to resume after a kill", required: bool = True) -> None:
    p.add_argument("--out", required=required, help=help, **({"default": argparse.SUPPRESS} if required else {}))


def executor_args(p) -> None:
    p.add_argument(
        "--executor",
        default="inprocess",
        choices=["inprocess", "ray"],
        help="where the points run: here, one after another, or as Ray tasks (pip install 'draftwise[ray]')",
    )
    p.add_argument("--ray-address", help="an existing Ray cluster (default with --executor ray: start a local one)")


def prove_matrix_route() -> None:
    """The lean int8/q4 kernel's route, proven and timed on this machine (once; `runtimes/lean/ladder.py`) before a
    command describes the machine in its run folder: a machine's first run names its paths too."""
    from ..runtimes.lean import kernels

    kernels.route()


_OPEN: list = []  # the executors this command made; `main` closes them however the command ends


def executor(args):
    from ..executors import make

    made = make(args.executor, args.ray_address)
    _OPEN.append(made)
    return made


def run_stage(run, config, args, executor_made=None) -> None:
    """`run(config, out[, executor])`; in a child process (`isolate.run`) when the config runs llama.cpp inside the
    process — its engine or llama-cpp-python's baselines — so that a fault in native code ends the command with one
    line instead of a core dump (what finished is kept in the run folder: rerun to resume)."""
    from .. import isolate

    if executor_made is None and runs_llama_cpp(config):
        isolate.run(run, config, args.out, label=f"llama.cpp ({getattr(config, 'target', '')})")
    elif executor_made is None:
        run(config, args.out)
    else:
        run(config, args.out, executor_made)


def runs_llama_cpp(config) -> bool:
    """Whether a stage config runs llama.cpp in its own process (the llama.cpp backend, a llama.cpp runtime of
    `quality`, a llama-cpp-python baseline; llama-server runs in a process of its own)."""
    bench = getattr(config, "bench", config)
    runtimes = getattr(config, "runtimes", ())  # quality's runtimes (a grid's `runtimes()` is its rows' names)
    runtimes = runtimes if isinstance(runtimes, tuple | list) else ()
    return (
        "llama.cpp" in (getattr(config, "backend", None), getattr(bench, "backend", None))
        or any(str(r).startswith("llama.cpp") for r in runtimes)
        or any(str(b).startswith("llama-cpp") for b in getattr(bench, "baselines", ()) or ())
    )


def close_executors() -> None:
    while _OPEN:
        _OPEN.pop().close()
