"""The `draftwise` command: parses arguments into a stage config and dispatches; no logic of its own.

Every option is declared once, on its config field (`config.opt`); options.py derives each command's parser from
those fields. The commands live beside this module: `bench` (bench.py), the stages (stages.py), `design` and
`export-gguf` (design.py), `serve` (serve.py); each gives a `Command` (command.py, with what they share).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..errors import DraftwiseError
from . import bench, design, load_test, serve, stages
from .command import Command, close_executors, prove_matrix_route


def build() -> tuple[argparse.ArgumentParser, dict[str, Command]]:
    """The `draftwise` parser and its commands by name."""
    parser = argparse.ArgumentParser(prog="draftwise", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands: dict[str, Command] = {}
    for module in (bench, stages, design, serve, load_test):
        commands.update(module.add(sub))
    return parser, commands


def config_of(argv: list[str]):
    """The config a command line gives (what `main` would run), without running it."""
    parser, commands = build()
    args = parser.parse_args(argv)
    return commands[args.command].make(args)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # a command's clock (the design's budget counts from here)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser, commands = build()
    args = parser.parse_args(argv)
    args.started = started
    command = commands[args.command]
    try:
        config = command.make(args)
        prove_matrix_route()
        command.run(config, args)
    except DraftwiseError as e:
        print(f"draftwise: error: {e}", file=sys.stderr)
        return 2
    finally:  # finished, failed, Ctrl-C or SIGTERM (Ray's driver handler exits through here): no Ray left running
        close_executors()
    return 0
