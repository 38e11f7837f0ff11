"""`draftwise load-test`: concurrent clients against local servers (draftwise serve, llama-server); see
`stages.load_test`."""

from __future__ import annotations

from ..config import LoadConfig
from .command import Command, out_arg, simple, subparser


def add(sub) -> dict[str, Command]:
    p = subparser(
        sub,
        "load-test",
        "concurrent clients x requests against servers started on 127.0.0.1 (draftwise serve, llama-server): "
        "requests lost or failed, time to first token, tokens/s per client and in aggregate",
        LoadConfig,
    )
    out_arg(p)
    return {"load-test": simple(LoadConfig, _run, p)}


def _run(config: LoadConfig, args) -> None:
    from ..stages import load_test

    load_test.run(config, args.out)
