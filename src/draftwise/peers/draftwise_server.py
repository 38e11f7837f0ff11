"""draftwise's own server (`draftwise serve ARGS`) as a local process a benchmark starts, asks and stops, like
llama-server: what measures a deploy command through the API applications call.

`complete()` streams `/v1/completions` with a token-id prompt (server-sent events, as a chat client reads them) and
`return_token_ids`, through the client the load test uses too (`process.stream_completion`): the new tokens, the
client's wall time (request sent to the last event), its time to the first token, and the server's own figures for the
request (rounds, drafted, accepted, decode seconds).
"""

from __future__ import annotations

import json
import shlex
import sys
from collections.abc import Sequence

from ..errors import DraftwiseError
from .process import HOST, LocalServer, StreamResult, stream_completion

RESERVED = ("--host", "--port")  # where it listens is the benchmark's to choose


def serve_args(args: str | Sequence[str]) -> list[str]:
    """`draftwise serve` arguments (a shell-quoted string or a list), refused when they say where to listen."""
    try:
        parts = shlex.split(args) if isinstance(args, str) else list(args)
    except ValueError as e:
        raise DraftwiseError(f"cannot split the serve arguments {args!r}: {e}") from None
    for a in parts:
        if a.split("=", 1)[0] in RESERVED:
            raise DraftwiseError(f"serve option {a.split('=', 1)[0]} is the benchmark's to set ({HOST}, a free port)")
    return parts


class DraftwiseServer(LocalServer):
    """`python -m draftwise serve ARGS` on 127.0.0.1 and a free port."""

    name = "draftwise-serve"

    def __init__(self, args: str | Sequence[str], **server):
        server.setdefault("start_timeout", 600.0)  # it loads (a first run converts the target) and warms up first
        super().__init__(**server)
        self.args = serve_args(args)
        self.model: str | None = None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "draftwise", "serve", *self.args, "--host", HOST, "--port", str(self.port)]

    def served_name(self) -> str:
        if self.model is None:
            with self._http.open(self.url + "/v1/models", timeout=10) as r:
                self.model = json.loads(r.read())["data"][0]["id"]
        return self.model

    def complete(
        self, ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0
    ) -> StreamResult:
        """Up to `max_new_tokens` new tokens after the prompt `ids`, streamed (`process.stream_completion`): the
        ids as they arrive, the client's wall and first-token seconds, and the server's own figures
        (`extra["draftwise"]`)."""
        if self.proc is None:
            self.start()
        body = {
            "model": self.served_name(),
            "prompt": [int(i) for i in ids],
            "max_tokens": max_new_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed & 0xFFFFFFFF,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        return stream_completion(self, body)
