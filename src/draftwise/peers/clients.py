"""The client side of `draftwise load-test`: one block — a server started on 127.0.0.1, a warm-up request, then N
client threads, each sending its requests one after another, all at once — and the records it gives.

Every request is streamed through the OpenAI-compatible `/v1/completions` (`peers.process.stream_completion`)
with a token-id prompt, so every server sees the same ids. What each request pins down:

  * both: `max_tokens`, `temperature`, `seed`, `stream_options.include_usage` (the token count of llama-server's
    stream, which carries text only);
  * draftwise serve: `return_token_ids` (the ids themselves, counted as they arrive);
  * llama-server: `cache_prompt: false` (each request pays its own prefill, as draftwise's do) and the sampler chain
    of `peers.llama_server.PLAIN` with top-k, min-p, typical, penalties, DRY, XTC and mirostat off, so both
    servers decode plain greedy at temperature 0; its usage's prompt_tokens must equal the ids sent (no BOS added).

A 503 (a full queue) is retried after its Retry-After and counted; any other failure ends the request as failed,
recorded with its error. Threads are enough: a client waits on sockets.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..config.load_test import SERVE, LoadConfig, server_args
from ..errors import DraftwiseError
from .draftwise_server import DraftwiseServer, serve_args
from .llama_server import PLAIN, LlamaServer, check_args, find_binary
from .process import LocalServer, Refused, stream_completion

WARMUP_TOKENS = 16  # the untimed request each block sends first (at most max_new_tokens)
JOIN_S = 30.0  # how long a crashed block waits for its client threads once the server is stopped


def check(config: LoadConfig) -> None:
    """Refuse, before anything starts, server arguments that name what the load test sets, and a missing binary."""
    for spec in config.servers:
        kind, args = server_args(spec)
        if kind == SERVE:
            serve_args(args)
        else:
            check_args(args)
            find_binary(config.llama_server)


def _given(args: list[str], *flags: str) -> bool:
    return any(a.split("=", 1)[0] in flags for a in args)


def make_server(spec: str, clients: int, config: LoadConfig, gguf: Path | None, n_ctx: int, log: Path) -> LocalServer:
    """The server of block (spec, clients), not started: draftwise serve with the load test's target and threads
    where its ARGS give none; llama-server on `gguf` with `clients` slots (-np; ARGS come last, so theirs win) and
    a context of `n_ctx` per slot."""
    kind, args = server_args(spec)
    threads = config.threads or torch.get_num_threads()
    if kind == SERVE:
        if not _given(args, "--target", "--export"):
            args = ["--target", config.target, *args]
        if not _given(args, "--threads"):
            args = [*args, "--threads", str(threads)]
        return DraftwiseServer(args, log=log, request_timeout=config.timeout)
    slots = next((int(b) for a, b in zip(args, args[1:]) if a in ("-np", "--parallel") and b.isdigit()), clients)
    return LlamaServer(
        gguf,
        threads=threads,
        n_ctx=n_ctx * slots,
        args=["-np", str(clients), *args],
        binary=config.llama_server,
        log=log,
        request_timeout=config.timeout,
    )


def log_name(spec: str, clients: int) -> str:
    """A server's log file for a block: its spec made a file name; cut to 80 characters, then told apart from any
    other spec by a hash of it (two servers differing past the cut, e.g. by a trailing option)."""
    name = re.sub(r"[^A-Za-z0-9._=-]+", "_", spec).strip("_")
    if len(name) > 80:
        name = name[:71] + "-" + hashlib.sha1(spec.encode()).hexdigest()[:8]
    return f"{name}-c{clients}.log"


def model_id(server: LocalServer) -> str:
    """The model name the server answers to (draftwise serve refuses any other; llama-server takes any)."""
    try:
        with server._http.open(server.url + "/v1/models", timeout=30) as r:
            return json.loads(r.read())["data"][0]["id"]
    except (OSError, ValueError, KeyError, IndexError) as e:  # urllib's errors are OSErrors
        raise DraftwiseError(f"{server.name} did not name its model at {server.url}/v1/models: {e}") from None


def body(kind: str, model: str, ids: list[int], max_tokens: int, temperature: float, seed: int) -> dict:
    """One request's body (see the module docstring)."""
    out = {
        "model": model,
        "prompt": [int(i) for i in ids],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed & 0xFFFFFFFF,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if kind == SERVE:
        return {**out, "return_token_ids": True}
    return {**out, **PLAIN, "top_p": 1.0}


def send(server: LocalServer, kind: str, request: dict, timeout: float, stop: threading.Event) -> dict:
    """One request, retried after each 503's Retry-After until `timeout` seconds have passed since the first send:
    {ok, error, retries, new_tokens, ttft_s, wall_s, t0, t1 (perf_counter seconds), finish_reason, drafted,
    accepted}."""
    t0, retries = time.perf_counter(), 0
    out = dict(ok=False, error=None, new_tokens=0, ttft_s=None, finish_reason=None, drafted=None, accepted=None)
    while True:
        sent = time.perf_counter()
        try:
            got = stream_completion(server, request, max(timeout - (sent - t0), 1e-3))
        except Refused as e:
            wait = e.retry_after if e.retry_after is not None else 1.0
            if e.status == 503 and time.perf_counter() + wait - t0 < timeout and not stop.is_set():
                retries += 1
                stop.wait(wait)
                continue
            out["error"] = str(e)
            break
        except DraftwiseError as e:
            out["error"] = str(e)
            break
        out.update(finish_reason=got.finish_reason, error=_wrong(kind, got, request))
        if got.new_tokens is not None and out["error"] is None:  # no event with text: an EOS first, say
            first = got.first_token_s if got.first_token_s is not None else got.wall_s
            out.update(ok=True, new_tokens=got.new_tokens, ttft_s=sent - t0 + first, **_drafts(got.extra))
        elif out["error"] is None:
            out["error"] = f"the answer carried no tokens ({got.events} events, usage {got.usage})"
        break
    t1 = time.perf_counter()
    return {**out, "retries": retries, "wall_s": t1 - t0, "t0": t0, "t1": t1}


def _drafts(extra: dict) -> dict:
    """The server's own drafted / accepted counts for the request (draftwise's `draftwise` stats, llama-server's
    timings: it leaves them out when it drafted nothing), None where it reports none."""
    if "draftwise" in extra:
        return {k: extra["draftwise"].get(k) for k in ("drafted", "accepted")}
    timings = extra.get("timings", {})
    return {"drafted": timings.get("draft_n", 0), "accepted": timings.get("draft_n_accepted", 0)} if timings else {}


def _wrong(kind: str, got, request: dict) -> str | None:
    """What makes an answer not comparable: llama-server evaluating other prompt tokens than the ids sent (a BOS
    added), or reusing cached ones; ids and usage that disagree."""
    prompt = got.usage.get("prompt_tokens")
    if prompt is not None and prompt != len(request["prompt"]):
        return f"the server evaluated {prompt} prompt tokens for {len(request['prompt'])} ids"
    cached = got.extra.get("timings", {}).get("cache_n", 0)
    if kind != SERVE and cached:
        return f"llama-server reused {cached} cached prompt tokens (its prompt cache must be off)"
    used = got.usage.get("completion_tokens")
    if got.token_ids and used is not None and used != len(got.token_ids):
        return f"{len(got.token_ids)} token ids streamed but usage says {used}"
    return None


@dataclass(frozen=True)
class Block:
    """One (server, clients) block's inputs: the prompts (id, token ids, new tokens asked, temperature) every server
    gets alike."""

    spec: str
    clients: int
    attempt: int
    config: LoadConfig
    prompts: list[tuple[str, list[int], int, float]]

    def prompt_of(self, client: int, request: int) -> int:
        return (client * self.config.requests + request) % len(self.prompts)


def run_block(block: Block, server: LocalServer, append: Callable[[dict], None], tick: Callable[[], None]) -> dict:
    """Start `server`, warm it up, run the block's clients and `append` each request's record as it is answered;
    returns the block's record (appended by the caller once every request's is in). The server is stopped and the
    clients told to stop however the block ends."""
    c, kind = block.config, server_args(block.spec)[0]
    stop, go, answers = threading.Event(), threading.Event(), queue.Queue()
    threads: list[threading.Thread] = []
    try:
        started = time.perf_counter()
        server.start()
        ready = time.perf_counter()
        model = model_id(server)
        first = block.prompts[0]
        warm = body(kind, model, first[1], min(WARMUP_TOKENS, first[2]), first[3], c.seed)
        warm = send(server, kind, warm, c.timeout, stop)
        if not warm["ok"]:
            raise DraftwiseError(f"{block.spec}: the warm-up request failed: {warm['error']}")
        for k in range(block.clients):
            threads.append(threading.Thread(target=_client, args=(block, server, kind, k, model, go, stop, answers)))
            threads[-1].start()
        block_start, load_before = time.perf_counter(), os.getloadavg()[0]
        go.set()
        for _ in range(block.clients * c.requests):
            item = _next(answers, threads)
            if isinstance(item, BaseException):
                raise item
            t0, t1 = item.pop("t0"), item.pop("t1")
            append({**item, "start_s": t0 - block_start, "end_s": t1 - block_start})
            tick()
        return {
            "kind": "block",
            "server": block.spec,
            "clients": block.clients,
            "attempt": block.attempt,
            "command": server.command(),
            "server_start_s": ready - started,
            "warmup_s": warm["wall_s"],
            "wall_s": time.perf_counter() - block_start,
            "load_avg": [load_before, os.getloadavg()[0]],  # the machine's 1-minute load: others' work shows here
        }
    finally:
        stop.set()
        go.set()  # clients that never started return at once
        server.close()
        for t in threads:
            t.join(JOIN_S)


def _next(answers: queue.Queue, threads: list[threading.Thread]):
    """The next answered request (or a client's crash), waiting in short steps so Ctrl-C gets through."""
    while True:
        try:
            return answers.get(timeout=0.5)
        except queue.Empty:
            if not any(t.is_alive() for t in threads):
                raise DraftwiseError("every client stopped before its requests were answered") from None


def _client(block: Block, server, kind: str, k: int, model: str, go, stop, answers: queue.Queue) -> None:
    """Client `k`: its requests one after another, each answer (a record) put on `answers`; a crash put there too."""
    c = block.config
    try:
        go.wait()
        for j in range(c.requests):
            if stop.is_set():
                return
            i = block.prompt_of(k, j)
            prompt_id, ids, max_tokens, temperature = block.prompts[i]
            got = send(server, kind, body(kind, model, ids, max_tokens, temperature, c.seed + i), c.timeout, stop)
            answers.put(
                {
                    "kind": "request",
                    "server": block.spec,
                    "clients": block.clients,
                    "attempt": block.attempt,
                    "client": k,
                    "request": j,
                    "prompt_id": prompt_id,
                    "prompt_tokens": len(ids),
                    "max_tokens": max_tokens,
                    "temperature": temperature,
                    **got,
                }
            )
    except BaseException as e:  # noqa: BLE001 — handed to the main thread, which raises it
        answers.put(e)
