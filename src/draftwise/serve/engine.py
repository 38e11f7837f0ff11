"""The server's decoding: the models, and a loop that decodes queued requests one at a time.

Where it runs: `work()` is the loop, and `draftwise serve` runs it on the process's main thread, with uvicorn's event
loop on a thread beside it. Measured here: the engine's OpenMP kernels decode at about half speed when called from any
thread but the main one (lean int8, 96 tokens: ~60 tokens/s on a worker thread against ~125 on the main thread, with an
idle asyncio loop beside it or not), while torch's own ops are not affected. `start()` runs the same loop on a thread,
for embedding the server where the main thread is taken (the tests do).

Why one request at a time: SD at batch 1 is what serves one client fastest here, and the batched engine's SD is
no faster in aggregate (lean int8: 160 tokens/s at batch 4 against 167 at batch 1). Batched plain decoding would give
concurrent clients more in aggregate (194 at batch 4 against 129): switching to it when several requests wait is not
built (see docs/serve.md). The queue is bounded: past `max_queue` waiting requests `submit` raises `Busy` and the
server answers 503 with Retry-After.

A `Job` crosses threads: the HTTP side makes it and reads its events from an asyncio queue; the engine decodes it and
posts events into that queue through the event loop (`call_soon_threadsafe`). Cancelling (a client that left) sets a
flag the engine reads after each round: the generation ends there and the engine takes the next job.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from ..sd.loop import Generation, generate
from ..sd.sampling import SamplingParams
from .text import TextStream

log = logging.getLogger("draftwise.serve")


class Busy(Exception):
    """The queue is full; `retry_after` is a guess in seconds at when it will have room."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy (queue full): retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Delta:
    """Text (and its tokens) that became final in a round."""

    text: str
    tokens: list[int]


@dataclass(frozen=True)
class Done:
    """The generation ended: why ('stop': EOS or a stop string; 'length': max_tokens), and its record."""

    finish_reason: str
    generation: Generation


@dataclass(frozen=True)
class Failed:
    message: str


@dataclass
class Job:
    """One request's decoding: its prompt ids and settings, and the events the worker sends back."""

    ids: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int
    text: TextStream
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    arrived: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)
    first_token_s: float | None = None

    def post(self, event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def cancel(self) -> None:
        self.cancelled.set()


class Engine:
    """The models and the loop that decodes `Job`s: `work()` on the calling thread (or `start()` on a new one),
    `submit(job)` from any thread, `stop()` once no more jobs will come."""

    def __init__(self, target, drafter, gamma: int, draft_stop: float, scheduler, max_queue: int, metrics):
        self.target, self.drafter, self.gamma, self.draft_stop = target, drafter, gamma, draft_stop
        self.scheduler, self.max_queue, self.metrics = scheduler, max_queue, metrics
        self.jobs: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.recent_s = 1.0  # the last request's decode seconds: what Retry-After is guessed from
        self.outstanding = 0  # queued + being decoded

    def start(self) -> None:
        """`work()` on a thread of its own (about half speed: see the module docstring)."""
        self.thread = threading.Thread(target=self.work, name="draftwise-decode", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.lock:
            if self.outstanding > self.max_queue:  # one being decoded, max_queue waiting
                raise Busy(max(1, round(self.outstanding * self.recent_s)))
            self.outstanding += 1
            self.jobs.put(job)
            self.metrics.queue_depth.set(self.jobs.qsize())

    def stop(self) -> None:
        """`work()` returns after the jobs already queued (the server has stopped taking new ones)."""
        self.jobs.put(None)
        if self.thread is not None:
            self.thread.join()

    def work(self) -> None:
        """Decode queued jobs until `stop()`."""
        torch.set_grad_enabled(False)  # a thread's autograd mode is its own
        while (job := self.jobs.get()) is not None:
            self.metrics.queue_depth.set(self.jobs.qsize())
            self.metrics.running.set(1)
            end = None
            try:
                if not job.cancelled.is_set():  # a client that left while queued costs nothing
                    end = self._decode(job)
            except Exception as e:  # a bug must not take the server down: the request gets a 500, the log the trace
                log.exception("decoding failed")
                end = Failed(f"decoding failed: {type(e).__name__}: {e}")
            finally:
                self.metrics.running.set(0)
                with self.lock:
                    self.outstanding -= 1
            if end is not None:  # posted once it no longer counts: its client's next request finds room
                job.post(end)

    def generate(self, ids: list[int], params: SamplingParams, max_tokens: int, seed: int, stream=None) -> Generation:
        """One request's decoding, as the engine serves it (`sd.loop.generate` with its drafter, γ and scheduler)."""
        return generate(
            self.target.lm,
            ids,
            params,
            max_tokens,
            torch.Generator(device=self.target.lm.device).manual_seed(seed),
            drafter=self.drafter.loop_drafter if self.drafter else None,
            gamma=self.gamma,
            eos=self.target.eos_ids,
            stop_below=self.draft_stop if self.drafter else 0.0,
            scheduler=self.scheduler,
            stream=stream,
        )

    def _decode(self, job: Job) -> Done:
        eos = self.target.eos_ids

        def stream(new: list[int]) -> bool:
            if job.first_token_s is None:
                job.first_token_s = time.perf_counter() - job.arrived
                self.metrics.ttft.observe(job.first_token_s)
            job.post(Delta(job.text.add(new), new))
            return job.text.stopped or job.cancelled.is_set()

        gen = self.generate(job.ids, job.params, job.max_tokens, job.seed, stream)
        if self.scheduler is not None:  # the scheduler's calibration learns from what it served
            self.scheduler.commit([r.record() for r in gen.rounds])
        lookup = self.drafter.lookup if self.drafter else None
        if getattr(lookup, "learn", False):  # suffix learn=1: what it served joins its corpus, as vLLM's suffix tree
            lookup.observe(str(hash(tuple(job.ids))), gen.tokens)
        self.recent_s = gen.seconds
        self.metrics.finished(gen)
        self.metrics.latency.observe(time.perf_counter() - job.arrived)
        if job.cancelled.is_set():
            self.metrics.cancelled.inc()
        rest = job.text.finish()
        if rest:
            job.post(Delta(rest, []))
        stopped = job.text.stopped or (gen.tokens and gen.tokens[-1] in eos)
        return Done("stop" if stopped else "length", gen)
