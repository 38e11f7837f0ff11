"""The `draftwise` command: parses arguments into a stage config and dispatches; no logic of its own.

The subcommands' parsers live beside this module: `bench` (bench.py), the stages (stages.py), `design` and
`export-gguf` (design.py); the helpers they share are here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from ..config import PRECISIONS
from ..errors import DraftwiseError


def executor_args(p) -> None:
    p.add_argument("--executor", default="inprocess", choices=["inprocess", "ray"],
                   help="where the points run: here, one after another, or as Ray tasks (pip install 'draftwise[ray]')")
    p.add_argument("--ray-address", help="an existing Ray cluster (default with --executor ray: start a local one)")


_OPEN: list = []  # the executors this command made; `main` closes them however the command ends


def executor(args):
    from ..executors import make

    made = make(args.executor, args.ray_address)
    _OPEN.append(made)
    return made


def ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


DTYPE_HELP = ("precision: fp32, bf16, fp16, or int8 — the lean engine with int8 weights (blocks of 32) and int16 "
              "activations per token, a lossy choice whose cost `draftwise quality` measures")


def dtype_arg(p) -> None:
    p.add_argument("--dtype", default="fp32", choices=PRECISIONS, help=DTYPE_HELP)


def model_args(p) -> None:
    dtype_arg(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    engine_args(p)
    p.add_argument("--threads", type=int, help="torch (and llama.cpp) threads (default: torch's choice)")


BACKENDS = ["auto", "lean", "transformers", "llama.cpp"]


def engine_args(p, backends=BACKENDS, default: str = "auto") -> None:
    """--backend and the precision draftwise writes GGUF files at when it runs llama.cpp."""
    p.add_argument("--backend", default=default, choices=backends,
                   help="the engine: lean (draftwise's), transformers, or llama.cpp (a GGUF at its own quantization; "
                        "'default' runs the Q4_1 file it ships as)")
    p.add_argument("--gguf-quant", default="f32", choices=["f32", "f16", "q8_0"],
                   help="llama.cpp: the precision of GGUF files draftwise writes (drafters, HF-dir targets)")


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()  # a command's clock (the design's budget counts from here)
    from . import bench, design, stages

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = argparse.ArgumentParser(prog="draftwise", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for module in (bench, stages, design):
        commands.update(module.add(sub))
    args = parser.parse_args(argv)
    args.started = started
    try:
        commands[args.command](args)
    except DraftwiseError as e:
        print(f"draftwise: error: {e}", file=sys.stderr)
        return 2
    finally:  # finished, failed, Ctrl-C or SIGTERM (Ray's driver handler exits through here): no Ray left running
        while _OPEN:
            _OPEN.pop().close()
    return 0


