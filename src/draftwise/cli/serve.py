"""`draftwise serve`: an OpenAI-compatible server decoding with a drafter (see `draftwise.serve`)."""

from __future__ import annotations

from ..config import ServeConfig
from . import options
from .command import Command, subparser


def add(sub) -> dict[str, Command]:
    p = subparser(
        sub,
        "serve",
        "an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions) decoding with a drafter",
        ServeConfig,
    )
    return {"serve": Command(ServeConfig, make, _run, p)}


def make(args) -> ServeConfig:
    given = options.values(ServeConfig, args)
    return ServeConfig(**given, given=tuple(given))  # what the command line gave wins over an export's serve.json


def _run(config: ServeConfig, args) -> None:
    from ..serve import run

    run(config)
