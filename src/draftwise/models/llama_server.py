"""llama.cpp's own server (`llama-server`) as a peer to benchmark against, driven with token ids.

`LlamaServer` starts the binary on 127.0.0.1 (a free port unless one is given) with one GGUF, one slot and its prompt
cache off, waits for `/health`, and stops it (terminate, wait, kill) on `close()` / leaving the `with` block; a
finaliser and, on Linux, a parent-death signal stop it too when the caller never closes it or dies. Everything the
server prints goes to a log file (without one given: a temporary file, removed on close unless an error names it).

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

import ctypes
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import DraftwiseError

HOST = "127.0.0.1"  # never anything else: the server is a local peer, not a service
MISSING = "no llama-server: give --llama-server PATH or run scripts/setup.sh"
# options draftwise sets itself (the model, where it listens); a user's copy would point the client elsewhere
RESERVED = ("-m", "--model", "--host", "--port")
SAMPLERS = ["temperature", "top_p"]  # see the module docstring


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


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _port_taken(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: a TIME_WAIT port is free
        try:
            s.bind((HOST, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def _die_with_parent():
    """A preexec_fn (Linux): the server gets SIGTERM when the thread that started it dies, so a bench killed with a
    signal (no `finally`, no finaliser) leaves no server behind. libc is resolved here, in the parent; the child only
    makes the call."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None  # the signal follows the starting *thread*: from a worker thread it would fire when that exits
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    PR_SET_PDEATHSIG, sig = 1, int(signal.SIGTERM)
    return lambda: prctl(PR_SET_PDEATHSIG, sig)


def _stop(proc: subprocess.Popen, log) -> None:
    """Terminate, wait, kill: the server never outlives its `LlamaServer`."""
    try:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        log.close()


class LlamaServer:
    """One llama-server process serving `gguf` (see the module docstring). Use as a context manager, or call
    `start()` and `close()`."""

    def __init__(
        self,
        gguf: str | os.PathLike,
        *,
        threads: int,
        n_ctx: int,
        args: Sequence[str] = (),
        binary: str | os.PathLike | None = None,
        log: str | os.PathLike | None = None,
        port: int | None = None,
        start_timeout: float = 120.0,
        request_timeout: float = 3600.0,
    ):
        self.gguf, self.threads, self.n_ctx = Path(gguf), threads, n_ctx
        self.args, self.binary = check_args(args), binary
        self.log_path = Path(log) if log else None
        self._own_log = self._keep_log = False  # a temporary log of our own goes on close, unless an error names it
        self.port, self.fixed_port = port, port is not None
        self.start_timeout, self.request_timeout = start_timeout, request_timeout
        self.proc: subprocess.Popen | None = None
        self._finalizer = None
        self._log_offset = 0  # where this launch's output starts in a log that several runs append to
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self, binary: Path) -> list[str]:
        """The server's command line: one slot (requests run one at a time, as bench's methods do), prompt cache off,
        the run's threads for prefill and decoding alike, no layers offloaded (the draftwise llama.cpp engine runs
        on the CPU too; a GPU build would offload by default), no web UI (--no-webui: older builds know no --no-ui).
        The user's arguments come last, so they override any of these."""
        t = str(self.threads)
        return [
            str(binary),
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

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> LlamaServer:
        if self.proc is not None and self.proc.poll() is None:
            return self
        binary = find_binary(self.binary)  # a missing binary is reported before anything is made
        if self.fixed_port and _port_taken(self.port):
            raise DraftwiseError(f"port {self.port} on {HOST} is already in use: llama-server cannot listen there")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="draftwise-llama-server-", suffix=".log")
            os.close(fd)
            self.log_path, self._own_log = Path(name), True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a free port can be taken by another process between our check and the server's bind
            if not self.fixed_port:
                self.port = _free_port()
            if self._launch(binary):
                return self
        raise DraftwiseError(f"llama-server found no free port on {HOST} in 3 tries (log: {self.log_path})")

    def _launch(self, binary: Path) -> bool:
        """Start the process and wait for /health; False when its port was taken meanwhile (try another)."""
        cmd = self.command(binary)
        log = open(self.log_path, "ab")
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        offset = self._log_offset = log.tell()
        try:
            self.proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent()
            )
        except OSError as e:
            log.close()
            raise DraftwiseError(f"cannot run llama-server {binary}: {e.strerror or e}") from e
        self._finalizer = weakref.finalize(self, _stop, self.proc, log)
        deadline = time.monotonic() + self.start_timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self._keep_log = True
                self.close()
                lines = self._log_lines(offset)
                if any("couldn't bind" in l or "address already in use" in l.lower() for l in lines):
                    if self.fixed_port:
                        raise DraftwiseError(
                            f"port {self.port} on {HOST} is already in use: llama-server cannot "
                            f"listen there (log: {self.log_path})"
                        )
                    self._keep_log = False
                    return False
                raise DraftwiseError(
                    f"llama-server exited with code {rc} at start: {_reason(lines)} (log: {self.log_path})"
                )
            if self._healthy():
                return True
            if time.monotonic() > deadline:
                self._keep_log = True
                self.close()
                raise DraftwiseError(
                    f"llama-server did not become ready within {self.start_timeout:g} s (log: {self.log_path})"
                )
            time.sleep(0.05)

    def _healthy(self) -> bool:
        try:
            with self._http.open(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):  # not listening yet, or 503 (an HTTPError) while the model loads
            return False

    def _log_lines(self, offset: int = 0) -> list[str]:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(offset)
                return [l.strip() for l in f.read().decode("utf-8", "replace").splitlines() if l.strip()]
        except OSError:
            return []

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()  # runs `_stop` once; later calls do nothing
        if self._own_log and not self._keep_log and self.log_path:
            self.log_path.unlink(missing_ok=True)

    def complete(
        self, ids: Sequence[int], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0
    ) -> Completion:
        """Up to `max_new_tokens` new tokens after the prompt `ids` (see the module docstring for the sampling)."""
        if self.proc is None:
            self.start()
        ids = [int(i) for i in ids]
        body = {
            "prompt": ids,
            "n_predict": max_new_tokens,
            "return_tokens": True,
            "cache_prompt": False,
            "stream": False,
            "samplers": SAMPLERS,
            "temperature": temperature,
            "top_p": top_p,
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
            "seed": seed & 0xFFFFFFFF,
        }
        request = urllib.request.Request(
            self.url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        start = time.perf_counter()
        try:
            with self._http.open(request, timeout=self.request_timeout) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise DraftwiseError(f"llama-server refused the request: {_error_message(e)}") from None
        except (urllib.error.URLError, OSError) as e:
            rc = self.proc.poll()
            if rc is not None:
                self._keep_log = True
                raise DraftwiseError(
                    f"llama-server exited with code {rc} during a request: "
                    f"{_reason(self._log_lines(self._log_offset))} "
                    f"(log: {self.log_path})"
                ) from None
            raise DraftwiseError(f"llama-server did not answer at {self.url}: {getattr(e, 'reason', e)}") from None
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


def _reason(lines: list[str]) -> str:
    """Why a server stopped: its first error line (llama.cpp marks them ' E '; later ones say "exiting due to ..."),
    else its last line."""
    errors = [l for l in lines if " E " in f" {l} " or "error" in l.lower()]
    return (errors[:1] or lines[-1:] or ["no output"])[0]


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read())
        return str(body.get("error", {}).get("message") or body)
    except (ValueError, AttributeError):
        return f"HTTP {e.code} {e.reason}"


__all__ = ["LlamaServer", "Completion", "find_binary", "check_args", "MISSING", "HOST"]
