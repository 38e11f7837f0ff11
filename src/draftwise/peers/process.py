"""A server process a benchmark starts on 127.0.0.1 and stops again: llama.cpp's llama-server (`llama_server`) or
draftwise's own (`served.DraftwiseServer`), each a `LocalServer` that gives its command line.

`start()` runs the command on a free port (unless one is given), sends everything it prints to a log file (without
one given: a temporary file, removed on close unless an error names it), and waits for `GET /health` to answer 200.
`close()` (or leaving the `with` block) stops it: SIGTERM, wait, kill. A finaliser and, on Linux, a parent-death
signal stop it too when the caller never closes it or dies. `post(path, body)` sends one JSON request and turns
every failure into a one-line `DraftwiseError` that names the log. `stream_completion(server, body)` streams one
OpenAI `/v1/completions` request from either server (the load test's client), an error answer raised as `Refused`
with its status and Retry-After.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
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
from dataclasses import dataclass
from pathlib import Path

from ..errors import DraftwiseError
from ..isolate import NativeCrash, stop

HOST = "127.0.0.1"  # never anything else: the server is a local peer, not a service


class LocalServer:
    """One server process on HOST; subclasses give `name` and `command()`."""

    name = "server"

    def __init__(
        self,
        *,
        log: str | os.PathLike | None = None,
        port: int | None = None,
        start_timeout: float = 120.0,
        request_timeout: float = 3600.0,
    ):
        self.log_path = Path(log) if log else None
        self._own_log = self._keep_log = False  # a temporary log of our own goes on close, unless an error names it
        self.port, self.fixed_port = port, port is not None
        self.start_timeout, self.request_timeout = start_timeout, request_timeout
        self.proc: subprocess.Popen | None = None
        self._finalizer = None
        self._log_offset = 0  # where this launch's output starts in a log that several runs append to
        self._http = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy

    def command(self) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self):
        if self.proc is not None and self.proc.poll() is None:
            return self
        if self.fixed_port and _port_taken(self.port):
            raise DraftwiseError(f"port {self.port} on {HOST} is already in use: {self.name} cannot listen there")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix=f"draftwise-{self.name}-", suffix=".log")
            os.close(fd)
            self.log_path, self._own_log = Path(name), True
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a free port can be taken by another process between our check and the server's bind
            if not self.fixed_port:
                self.port = _free_port()
            if self._launch():
                return self
        raise DraftwiseError(f"{self.name} found no free port on {HOST} in 3 tries (log: {self.log_path})")

    def _launch(self) -> bool:
        """Start the process and wait for /health; False when its port was taken meanwhile (try another)."""
        cmd = self.command()
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
            raise DraftwiseError(f"cannot run {self.name} {cmd[0]}: {e.strerror or e}") from e
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
                            f"port {self.port} on {HOST} is already in use: {self.name} cannot "
                            f"listen there (log: {self.log_path})"
                        )
                    self._keep_log = False
                    return False
                if rc < 0:  # a native crash: the design drops what it was measuring, not the run (`isolate`)
                    raise NativeCrash(
                        self.name, signal.Signals(-rc).name, None, f"its start (log: {self.log_path})", self.name
                    )
                raise DraftwiseError(
                    f"{self.name} exited with code {rc} at start: {_reason(lines)} (log: {self.log_path})"
                )
            if self._healthy():
                return True
            if time.monotonic() > deadline:
                self._keep_log = True
                self.close()
                raise DraftwiseError(
                    f"{self.name} did not become ready within {self.start_timeout:g} s (log: {self.log_path})"
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

    def open(self, path: str, body: dict, headers: dict | None = None):
        """POST `body` as JSON to `path`: the open response (the caller reads it, whole or streamed)."""
        if self.proc is None:
            self.start()
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
        )
        try:
            return self._http.open(request, timeout=self.request_timeout)
        except urllib.error.HTTPError as e:
            raise DraftwiseError(f"{self.name} refused the request: {_error_message(e)}") from None
        except (urllib.error.URLError, OSError) as e:
            raise self.failure(e) from None

    def failure(self, e: Exception) -> DraftwiseError:
        """The one-line error of a request that got no answer: the server died (its log's reason) or did not reply."""
        rc = self.proc.poll() if self.proc else None
        if rc is not None and rc < 0:
            self._keep_log = True
            return NativeCrash(
                self.name, signal.Signals(-rc).name, None, f"a request (log: {self.log_path})", self.name
            )
        if rc is not None:
            self._keep_log = True
            return DraftwiseError(
                f"{self.name} exited with code {rc} during a request: {_reason(self._log_lines(self._log_offset))} "
                f"(log: {self.log_path})"
            )
        return DraftwiseError(f"{self.name} did not answer at {self.url}: {getattr(e, 'reason', e)}")

    def post(self, path: str, body: dict) -> dict:
        with self.open(path, body) as r:
            return json.loads(r.read())


class Refused(DraftwiseError):
    """An HTTP error answer: its status, its message and, when the server gave one, Retry-After in seconds (a 503
    from a full queue)."""

    def __init__(self, name: str, status: int, message: str, retry_after: float | None):
        super().__init__(f"{name} answered {status}: {message}")
        self.status, self.retry_after = status, retry_after


@dataclass(frozen=True)
class StreamResult:
    """One streamed `/v1/completions` answer as the client saw it. `token_ids`: the ids the events carried (draftwise
    serve with `return_token_ids`; llama-server's OpenAI stream carries text only); `usage`: the final event's
    (completion_tokens, prompt_tokens), `{}` when none; `extra`: the final event's other fields (llama-server's
    `timings`, draftwise's `draftwise`); `first_token_s`: request sent to the first event with text or ids."""

    token_ids: list[int]
    usage: dict
    extra: dict
    first_token_s: float | None
    wall_s: float
    finish_reason: str
    events: int

    @property
    def new_tokens(self) -> int | None:
        """The new tokens' count: the ids received, else the server's usage, else None."""
        if self.token_ids:
            return len(self.token_ids)
        return self.usage.get("completion_tokens")


def stream_completion(server: LocalServer, body: dict, timeout: float | None = None) -> StreamResult:
    """POST `body` to `server`'s OpenAI-compatible `/v1/completions` with `stream: true` and read its server-sent
    events to `data: [DONE]`; works for draftwise serve and llama-server alike. An HTTP error answer raises `Refused`
    (status, Retry-After); an error event, a connection that breaks or an answer not complete within `timeout`
    seconds (default: the server's request timeout) raises a one-line `DraftwiseError`."""
    timeout = timeout or server.request_timeout
    request = urllib.request.Request(
        server.url + "/v1/completions",
        json.dumps({**body, "stream": True}).encode(),
        {"Content-Type": "application/json"},
    )
    ids, usage, extra, first, finish, events = [], {}, {}, None, "", 0
    start = time.perf_counter()
    try:
        with server._http.open(request, timeout=timeout) as r:
            for line in r:
                if time.perf_counter() - start > timeout:
                    raise DraftwiseError(f"{server.name} gave no complete answer within {timeout:g} s")
                if not line.startswith(b"data: "):
                    continue
                if line.strip() == b"data: [DONE]":
                    break
                try:
                    event, events = json.loads(line[6:]), events + 1
                except ValueError:
                    raise DraftwiseError(f"{server.name} sent an event that is not JSON: {line[:80]!r}") from None
                if "error" in event:
                    raise DraftwiseError(f"{server.name} failed the request: {event['error'].get('message')}")
                for c in event.get("choices") or []:
                    if first is None and (c.get("token_ids") or c.get("text")):
                        first = time.perf_counter() - start
                    ids += c.get("token_ids") or []
                    finish = c.get("finish_reason") or finish
                usage = event.get("usage") or usage
                extra.update({k: v for k, v in event.items() if k in ("timings", "draftwise")})
            else:
                raise server.failure(EOFError("the stream ended before data: [DONE]"))
    except urllib.error.HTTPError as e:
        retry = e.headers.get("Retry-After") if e.headers else None
        raise Refused(server.name, e.code, _error_message(e), float(retry) if _number(retry) else None) from None
    except (urllib.error.URLError, OSError) as e:
        raise server.failure(e) from None
    return StreamResult(ids, usage, extra, first, time.perf_counter() - start, finish, events)


def _number(text: str | None) -> bool:
    try:
        return text is not None and float(text) >= 0
    except ValueError:
        return False


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
        stop(proc)
    finally:
        log.close()


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
