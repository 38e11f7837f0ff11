"""`draftwise load-test`'s config: concurrent clients sending requests to servers it starts on 127.0.0.1 (draftwise's
own, `serve:ARGS`, and llama.cpp's, `llama-server[:ARGS]`), one block per (server, clients)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..errors import DraftwiseError
from .base import check_positive, like, opt
from .bench import LLAMA_SERVER, BenchConfig, llama_server_args

SERVE = "serve"  # serve:ARGS — `draftwise serve ARGS` as a local process


def server_args(spec: str) -> tuple[str, list[str]]:
    """A --server value as (kind, its arguments): ('serve', ARGS of serve:ARGS) or ('llama-server', ARGS of
    llama-server[:ARGS]), the arguments shlex-split; anything else is refused in one line."""
    if spec == SERVE or spec.startswith(SERVE + ":"):
        try:
            return SERVE, shlex.split(spec.partition(":")[2])
        except ValueError as e:
            raise DraftwiseError(f"server {spec!r}: cannot split its serve arguments ({e})") from None
    args = llama_server_args(spec)
    if args is None:
        raise DraftwiseError(
            f"unknown server {spec!r}: give serve:ARGS (draftwise serve's options) or {LLAMA_SERVER}[:ARGS] "
            "(llama-server's options)"
        )
    return LLAMA_SERVER, args


@dataclass(frozen=True)
class LoadConfig:
    """`draftwise load-test`: each server started on 127.0.0.1 once per client count; every client sends its requests
    one after another, all clients at once, each streamed through `/v1/completions`."""

    servers: tuple[str, ...] = opt(
        ("serve:", LLAMA_SERVER),
        "a server to load: serve:ARGS (draftwise serve's options, shell-quoted, taken whole; --target and --threads "
        "default to this command's) or llama-server[:ARGS] (llama-server's own options, on the target's GGUF, with "
        "-np set to the clients unless ARGS set it); repeatable",
        flag="--server",
        repeat=True,
    )
    clients: tuple[int, ...] = opt((1, 4, 8), "concurrent clients: a comma list, one block per value and server")
    requests: int = opt(16, "requests each client sends, one after another")
    target: str = like(
        BenchConfig,
        "target",
        help="'default', a local HF model directory or a .gguf file: the tokenizer that encodes the prompts, the "
        "target serve: servers get unless their ARGS name one, and (its GGUF) what llama-server runs",
    )
    suite: str = like(BenchConfig, "suite")
    split: str = like(BenchConfig, "split")
    prompts: str | None = like(BenchConfig, "prompts")
    limit: int | None = like(BenchConfig, "limit", default=16)
    max_new_tokens: int = like(BenchConfig, "max_new_tokens", default=96)
    temperature: float = like(BenchConfig, "temperature", help="0 = greedy")
    seed: int = like(BenchConfig, "seed")
    threads: int | None = opt(
        None,
        "each server's threads: draftwise serve's --threads unless its ARGS give them, llama-server's -t and -tb "
        "(default: torch's choice)",
    )
    timeout: float = opt(600.0, "seconds a request may take, waits after a 503 included, before it counts as failed")
    llama_server: str | None = like(BenchConfig, "llama_server")

    def __post_init__(self):
        for name in ("servers", "clients"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.servers or not self.clients:
            raise DraftwiseError("a load test needs at least one --server and one --clients value")
        for spec in self.servers:
            server_args(spec)
        for name, values in (("server", self.servers), ("clients", self.clients)):
            twice = [v for i, v in enumerate(values) if v in values[:i]]
            if twice:
                raise DraftwiseError(f"{name} {twice[0]!r} is given twice")
        check_positive("clients", self.clients)
        for name in ("requests", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise DraftwiseError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.limit is not None and self.limit < 1:
            raise DraftwiseError(f"limit must be >= 1, got {self.limit}")
        if self.temperature < 0 or self.timeout <= 0:
            raise DraftwiseError(f"need temperature >= 0 and timeout > 0, got {self.temperature}, {self.timeout}")
        if self.threads is not None and self.threads < 1:
            raise DraftwiseError(f"threads must be >= 1, got {self.threads}")


__all__ = ["LoadConfig", "SERVE", "server_args"]
