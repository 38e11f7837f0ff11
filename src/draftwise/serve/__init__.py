"""`draftwise serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn, the stack vLLM, SGLang and
llama-cpp-python's server use) decoding with one drafter on one engine — the deployment of a design's verdict.

  app.py       the routes: /v1/completions, /v1/chat/completions (SSE streaming), /v1/models, /health, /metrics
  protocol.py  OpenAI's request and response objects, and its error object
  engine.py    the loop that decodes queued requests: a continuous batch on the lean engine, else one at a time
  batch.py     the continuous batch: rows of one KV cache, each at its own position, and a round over them
  policy.py    γ per batch size, priced from the verify curve measured at start-up
  text.py      tokens to text as they arrive, with stop strings
  metrics.py   the Prometheus counters

The server binds 127.0.0.1 unless told otherwise, loads and warms the models before it listens, decodes on the main
thread with uvicorn beside it, and drains on SIGTERM: uvicorn stops taking connections and waits for the open requests
(queued ones included), then the engine stops.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading

import torch
import uvicorn

from .. import specs
from ..config import ServeConfig
from ..config.serve import from_export
from ..stages.bench import load_models
from ..stages.bench_methods import round_scheduler
from .app import Served, create_app
from .engine import Engine
from .metrics import ServerMetrics

WARMUP_TOKENS = 8


def build(config: ServeConfig) -> Served:
    """`config` (its export already read: `config.serve.from_export`): the models loaded and warmed, behind an engine
    (not started) and the routes' state."""
    bench = config.bench()
    specs.check(bench)
    if config.threads:
        torch.set_num_threads(config.threads)
    target, drafter = load_models(bench)
    scheduler = round_scheduler(bench, target) if drafter and config.schedule else None
    metrics = ServerMetrics()
    context = min(config.max_len, int(getattr(target.config, "max_position_embeddings", 0) or config.max_len))
    engine = Engine(
        target,
        drafter,
        config.gamma,
        config.draft_stop,
        scheduler,
        config.max_queue,
        metrics,
        config.max_batch,
        context,
        config.gammas_at(),
        config.chunked_prefill,
    )
    with torch.inference_mode():
        engine.warm(target.encode("Hello") or [0], WARMUP_TOKENS)
    return Served(engine, metrics, config.model_name, config.api_key, config.max_body_bytes, context)


def listen(host: str, port: int) -> socket.socket:
    # proto named: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP (0 would leave Nagle on, and
    # every response or event after the first on a kept-alive connection would wait ~40 ms for a delayed ACK)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def run(config: ServeConfig) -> None:
    """Serve until SIGTERM or Ctrl-C: uvicorn on a thread, the engine on this (the main) thread, where its kernels
    run at full speed (`engine`). A signal makes uvicorn stop taking connections and drain the open requests (queued
    ones included, which the engine goes on decoding); then the engine stops and the process exits 0."""
    logging.basicConfig(level=logging.INFO, format="draftwise serve: %(message)s", stream=sys.stderr)
    config = from_export(config)
    served = build(config)
    sock = listen(config.host, config.port)
    host, port = sock.getsockname()[:2]
    gammas = config.gamma_by_temperature and f"γ by temperature {config.gamma_by_temperature}"
    what = (
        f"drafter {config.drafter}, {gammas or f'γ {config.gamma}'}" if served.engine.drafter else "plain decoding (AR)"
    )
    print(f"draftwise serve: {served.name!r} ({what}) on http://{host}:{port}", flush=True)
    app = create_app(served)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=None))

    def drain(sig, frame):  # a second signal stops at once, as uvicorn's own handler does
        server.force_exit, server.should_exit = server.should_exit, True

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, drain)
    http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="draftwise-http")
    http.start()
    threading.Thread(target=lambda: (http.join(), served.engine.stop()), daemon=True).start()
    served.engine.work()
    http.join()
