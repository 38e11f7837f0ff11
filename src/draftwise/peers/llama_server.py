"""llama.cpp's own server (`llama-server`) as a peer to benchmark against, driven with token ids.

`LlamaServer` starts the binary on 127.0.0.1 with one GGUF, one slot and its prompt cache off (a `LocalServer`:
free port, log file, /health, stopped on `close()` however the caller ends).

`complete()` asks `/completion` for a continuation of a token-id prompt and returns the new tokens, the client's wall
time and the server's own `timings`. What the request pins down, and why:

  * `prompt` is the id list as it is: llama-server adds no BOS to a token-id prompt (checked: `tokens_evaluated` must
    equal len(ids));
  * `cache_prompt: false` (and `--cache-ram 0` at start): every request pays its own prefill, as draftwise's methods
    do (checked: `timings.cache_n` must be 0);
  * `samplers: ["temperature", "top_p"]`: the chain is temperature, then top-p, then the draw — the order
    `sd.sampling.probs` uses — with no top-k, min-p, typical, XTC, DRY or repetition penalty (llama.cpp's default
    chain has top-k 40 and min-p 0.05, which would cut the target's distribution). At temperature 0 llama.cpp's
    temperature sampler keeps the first largest logit only, so the draw is the argmax (greedy), as draftwise's is.

The server stops at its vocabulary's end-of-generation tokens (which may be more than the tokenizer's EOS) and
returns the EOS token it stopped at among the tokens.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import DraftwiseError
from .process import HOST, LocalServer

MISSING = "no llama-server: give --llama-server PATH or run scripts/setup.sh"
# options draftwise sets itself (the model, where it listens); a user's copy would point the client elsewhere
RESERVED = ("-m", "--model", "--host", "--port")
SAMPLERS = ["temperature", "top_p"]  # see the module docstring
# what every request to it pins down (the module docstring): no prompt cache, and the target's distribution as it is
PLAIN = {
    "cache_prompt": False,
    "samplers": SAMPLERS,
    "top_k": 0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "mirostat": 0,
    "n_probs": 0,
    "ignore_eos": False,
}


def find_binary(explicit: str | os.PathLike | None = None) -> Path:
    """The llama-server to run: `explicit`, else the one on PATH, else the one beside this Python (scripts/setup.sh
    links it into .venv/bin)."""
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise DraftwiseError(
                f"no llama-server at {explicit} (not an executable file): give --llama-server PATH "
                "or run scripts/setup.sh"
            )
        return path
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    raise DraftwiseError(MISSING)


def check_args(args: Sequence[str]) -> list[str]:
    """A user's extra server arguments, refused when they name what draftwise sets itself."""
    args = list(args)
    for a in args:
        if a.split("=", 1)[0] in RESERVED:
            raise DraftwiseError(
                f"llama-server option {a.split('=', 1)[0]} is draftwise's to set (the target's GGUF, "
                f"{HOST} and a free port); leave it out"
            )
    return args


@dataclass(frozen=True)
class Completion:
    """One `/completion` answer: the new tokens, the client's wall time and the server's own `timings` (prompt_n,
    prompt_ms, predicted_n, predicted_ms, and draft_n / draft_n_accepted when it drafted)."""

    tokens: list[int]
    wall_s: float
    timings: dict
    stop_type: str

    @property
    def seconds(self) -> float:
        """The engine's time for the request, prefill included (no HTTP or JSON)."""
        return (self.timings["prompt_ms"] + self.timings["predicted_ms"]) / 1e3

    @property
    def drafted(self) -> int:
        return int(self.timings.get("draft_n", 0))  # the server leaves both out when it drafted nothing

    @property
    def accepted(self) -> int:
        return int(self.timings.get("draft_n_accepted", 0))


class LlamaServer(LocalServer):
    """One llama-server process serving `gguf` (see the module docstring). Use as a context manager, or call
    `start()` and `close()`."""

    name = "llama-server"

    def __init__(
        self,
        gguf: str | os.PathLike,
        *,
        threads: int,
        n_ctx: int,
        args: Sequence[str] = (),
        binary: str | os.PathLike | None = None,
        **server,
    ):
        super().__init__(**server)
        self.gguf, self.threads, self.n_ctx = Path(gguf), threads, n_ctx
        self.args, self.binary = check_args(args), binary

    def start(self) -> LlamaServer:
        find_binary(self.binary)  # a missing binary is reported before anything is made
        return super().start()

    def command(self) -> list[str]:
        """The server's command line: one slot (requests run one at a time, as bench's methods do), prompt cache off,
        the run's threads for prefill and decoding alike, no layers offloaded (the draftwise llama.cpp engine runs
        on the CPU too; a GPU build would offload by default), no web UI (--no-webui: older builds know no --no-ui).
        The user's arguments come last, so they override any of these."""
        t = str(self.threads)
        return [
            str(find_binary(self.binary)),
            "-m",
            str(self.gguf),
            "--host",
            HOST,
            "--port",
            str(self.port),
            "-t",
            t,
            "-tb",
            t,
            "-c",
            str(self.n_ctx),
            "-np",
            "1",
            "--cache-ram",
            "0",
            "--no-webui",
            "-ngl",
            "0",
            *self.args,
        ]

    def complete(
        self, ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0
    ) -> Completion:
        """Up to `max_new_tokens` new tokens after the prompt `ids` (see the module docstring for the sampling)."""
        ids = [int(i) for i in ids]
        body = {
            "prompt": ids,
            "n_predict": max_new_tokens,
            "return_tokens": True,
            "stream": False,
            **PLAIN,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed & 0xFFFFFFFF,
        }
        start = time.perf_counter()
        out = self.post("/completion", body)
        wall = time.perf_counter() - start
        timings = out.get("timings", {})
        if out.get("tokens_evaluated") != len(ids):
            raise DraftwiseError(
                f"llama-server evaluated {out.get('tokens_evaluated')} prompt tokens for {len(ids)} ids "
                "(it added or dropped tokens, e.g. a BOS): its figures would not be comparable"
            )
        if timings.get("cache_n", 0):
            raise DraftwiseError(
                f"llama-server reused {timings['cache_n']} cached prompt tokens: its prompt cache must "
                "be off for a fair prefill"
            )
        return Completion([int(t) for t in out["tokens"]], wall, timings, out.get("stop_type", ""))


__all__ = ["LlamaServer", "Completion", "find_binary", "check_args", "MISSING", "HOST"]
