"""The server's decoding: the models, and the loop that decodes queued requests — a continuous batch on the lean
engine (`batch`), one request at a time on the others.

Where it runs: `work()` is the loop, and `draftwise serve` runs it on the process's main thread, with uvicorn's event
loop on a thread beside it. Measured here: the engine's OpenMP kernels decode at about half speed when called from any
thread but the main one (lean int8, 96 tokens: ~60 tokens/s on a worker thread against ~125 on the main thread, with an
idle asyncio loop beside it or not), while torch's own ops are not affected. `start()` runs the same loop on a thread,
for embedding the server where the main thread is taken (the tests do).

The continuous batch: a request joins the running batch at the next round (its prompt prefilled, then it decodes with
the rest) and leaves when done, so no request waits for another to finish before its first token; each round drafts
as far as the policy prices for the batch's size (`policy.Lookahead`: γ at batch 1, less or none as rows are added).
Past `max_batch` running and `max_queue` waiting requests, `submit` raises `Busy` and the server answers 503 with
Retry-After.

A `Job` crosses threads: the HTTP side makes it and reads its events from an asyncio queue; the engine decodes it and
posts events into that queue through the event loop (`call_soon_threadsafe`). Cancelling (a client that left) sets a
flag the engine reads after each round: the request leaves the batch there.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from ..runtimes.lean.forward import LeanLM
from ..sd.loop import Generation, generate
from ..sd.sampling import SamplingParams
from .batch import Batch, Seq, round_
from .policy import Chunks, Lookahead, Tops, verify_curve
from .text import TextStream

log = logging.getLogger("draftwise.serve")


class Busy(Exception):
    """The queue is full; `retry_after` is a guess in seconds at when it will have room."""

    def __init__(self, retry_after: int):
        super().__init__(f"the server is busy (queue full): retry after {retry_after} s")
        self.retry_after = retry_after


@dataclass(frozen=True)
class Delta:
    """Text (and its tokens, with their log-probabilities when asked: `batch.token_logprobs`) final after a round."""

    text: str
    tokens: list[int]
    logprobs: list[dict] | None = None


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
    logprobs: int | None = None  # None: none asked; k: each token's log-probability and the k most likely's
    request_id: str = ""

    def post(self, event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, event)

    def cancel(self) -> None:
        self.cancelled.set()


class Engine:
    """The models and the loop that decodes `Job`s: `work()` on the calling thread (or `start()` on a new one),
    `submit(job)` from any thread, `stop()` once no more jobs will come. `max_batch` rows of up to `max_len` tokens
    each decode together on the lean engine (1: one request at a time, as on the other engines)."""

    def __init__(
        self,
        target,
        drafter,
        gamma,
        draft_stop,
        scheduler,
        max_queue,
        metrics,
        max_batch: int = 1,
        max_len: int = 0,
        gamma_by_temperature: dict[float, int] | None = None,
        chunked_prefill: bool = True,
    ):
        # a request's γ by its temperature (`policy.Tops`); `gamma`: the most any request drafts (the rows' room)
        self.tops = Tops(gamma, gamma_by_temperature)
        self.target, self.drafter, self.gamma, self.draft_stop = target, drafter, self.tops.most, draft_stop
        self.scheduler, self.max_queue, self.metrics = scheduler, max_queue, metrics
        # a feature head drafts from the target's hidden states of its own sequence's passes: one request at a time;
        # the batch's cache and ids live on the CPU (a lean model on a GPU decodes one request at a time)
        lean_cpu = isinstance(target.lm, LeanLM) and target.lm.device.type == "cpu"
        batched = lean_cpu and max_batch > 1 and getattr(drafter, "kind", None) != "feature"
        self.batch = Batch(target.lm, max_batch, max_len, self.gamma + 1) if batched else None
        self.lookahead: Lookahead | None = None  # priced by `warm`
        self.chunks = Chunks() if chunked_prefill else None  # how much of a joining prompt each round waits for
        self.jobs: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.recent_s = 1.0  # the last request's decode seconds: what Retry-After is guessed from
        self.outstanding = 0  # queued + being decoded

    @property
    def slots(self) -> int:
        return self.batch.slots if self.batch else 1

    def warm(self, prompt: list[int], tokens: int) -> None:
        """Kernels compiled, caches allocated, weights paged in (the first request is no slower); the batch's verify
        curve measured and the lookahead policy priced from it."""
        self.generate(prompt, SamplingParams(0.0), tokens, seed=0)
        if self.batch is not None:
            sizes = sorted({min(self.batch.slots, 2**i) for i in range(self.batch.slots.bit_length() + 1)})
            lookup = self.drafter is not None and self.drafter.kind == "lookup"  # a model drafts alone: no curve
            model = self.drafter is not None and not lookup
            curve = verify_curve(self.batch, sizes, self.gamma if lookup else 0)
            self.lookahead = Lookahead(self.tops if self.drafter else 0, curve, model)

    def start(self) -> None:
        """`work()` on a thread of its own (about half speed: see the module docstring)."""
        self.thread = threading.Thread(target=self.work, name="draftwise-decode", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> None:
        with self.lock:
            if self.outstanding >= self.slots + self.max_queue:  # the batch full, max_queue waiting
                raise Busy(max(1, round((self.outstanding - self.slots + 1) * self.recent_s / self.slots)))
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
        if self.batch is not None:
            return self._continuous()
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
            self._end(job, end)

    def _end(self, job: Job, end) -> None:
        """The job no longer counts; then its last event (its client's next request finds room)."""
        with self.lock:
            self.outstanding -= 1
        self.metrics.running.set(self.batch.taken if self.batch else 0)
        if end is not None:
            job.post(end)

    def generate(self, ids: list[int], params: SamplingParams, max_tokens: int, seed: int, stream=None) -> Generation:
        """One request's decoding alone, as the engine serves it (`sd.loop.generate` with its drafter, the γ of its
        temperature — none: plain decoding — and scheduler)."""
        gamma = self.tops(params.temperature) if self.drafter else 0
        return generate(
            self.target.lm,
            ids,
            params,
            max_tokens,
            torch.Generator(device=self.target.lm.device).manual_seed(seed),
            drafter=self.drafter.loop_drafter if gamma else None,
            gamma=gamma,
            eos=self.target.eos_ids,
            stop_below=self.draft_stop if self.drafter else 0.0,
            scheduler=self.scheduler,
            stream=stream,
        )

    def _decode(self, job: Job) -> Done:
        gen = self.generate(job.ids, job.params, job.max_tokens, job.seed, lambda new: self._emit(job, new))
        return self._finished(job, gen)

    def _emit(self, job: Job, new: list[int], logprobs: list[dict] | None = None) -> bool:
        """A round's tokens to the client; whether the request ends here (a stop string, a client that left)."""
        if job.first_token_s is None:
            job.first_token_s = time.perf_counter() - job.arrived
            self.metrics.ttft.observe(job.first_token_s)
        job.post(Delta(job.text.add(new), new, logprobs))
        return job.text.stopped or job.cancelled.is_set()

    def _finished(self, job: Job, gen: Generation) -> Done:
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
        stopped = job.text.stopped or (gen.tokens and gen.tokens[-1] in self.target.eos_ids)
        return Done("stop" if stopped else "length", gen)

    def _continuous(self) -> None:
        """The continuous batch (`batch`): admit between rounds, one round over every row, rows leave when done."""
        stopping = False
        while True:
            idle = not self.batch.seqs and self.batch.joining is None
            stopping = self._admit(wait=idle and not stopping) or stopping
            if self.batch.joining is not None and self.batch.joining.job.cancelled.is_set():
                self._end(self.batch.joining.job, None)  # a client that left during its prefill costs no more of it
                self.batch.joining = None
            chunk = self.chunks.tokens() if self.chunks and self.batch.joining is not None and self.batch.seqs else 0
            if self.batch.joining is not None and not chunk:
                self._prefill()  # nobody decodes (nobody waits), or chunks are off: the whole prompt now
            if not self.batch.seqs:
                if stopping and self.batch.joining is None:
                    return
                continue
            n = len(self.batch.seqs)
            gammas = [self.lookahead.gamma(n, s.params.temperature) if self.lookahead else 0 for s in self.batch.seqs]
            self._sessions(max(gammas))
            try:
                t_round = time.perf_counter()
                joining = self.batch.joining
                stop_below = self.draft_stop if self.drafter else 0.0
                emitted = round_(self.batch, gammas, stop_below, self.target.eos_ids, chunk)
                if self.chunks:
                    self.chunks.timed_round(time.perf_counter() - t_round, chunk)
                if joining is not None and self.batch.joining is None:
                    self.metrics.running.set(self.batch.taken)
            except Exception as e:  # a bug must not take the server down: the batch's requests get a 500
                log.exception("decoding failed")
                for seq in list(self.batch.seqs):
                    self.batch.leave(seq)
                    self._end(seq.job, Failed(f"decoding failed: {type(e).__name__}: {e}"))
                continue
            self._count(n, max(gammas), emitted)
            for seq, new in emitted:
                ended = self._emit(seq.job, new, seq.logprobs if seq.job.logprobs is not None else None)
                if ended or seq.room <= 0 or (new and new[-1] in self.target.eos_ids):
                    self.batch.leave(seq)
                    seq.out.seconds = time.perf_counter() - seq.started
                    self._end(seq.job, self._finished(seq.job, seq.out))

    def _admit(self, wait: bool) -> bool:
        """A queued job starts joining the batch when a row is free and none is joining (waiting for one when
        `wait`); True once `stop()`."""
        while self.batch.joining is None and len(self.batch.seqs) < self.batch.slots:
            try:
                job = self.jobs.get() if wait else self.jobs.get_nowait()
            except queue.Empty:
                return False
            wait = False
            self.metrics.queue_depth.set(self.jobs.qsize())
            if job is None:
                return True
            if job.cancelled.is_set():  # a client that left while queued costs nothing
                self._end(job, None)
                continue
            try:
                self.batch.join(self._seq(job), 0)  # its prefill: whole before a round, or in chunks within rounds
            except Exception as e:
                log.exception("joining failed")
                self._end(job, Failed(f"decoding failed: {type(e).__name__}: {e}"))
                continue
            self.metrics.running.set(self.batch.taken)
        return False

    def _prefill(self) -> None:
        """The joining request's whole prompt, before the round (with rows decoding and chunks on, its chunks ride in
        the rounds' passes instead: `policy.Chunks`, `batch.round_`)."""
        seq = self.batch.joining
        try:
            self.batch.prefill(None)
        except Exception as e:
            log.exception("prefill failed")
            self.batch.joining = None
            self._end(seq.job, Failed(f"decoding failed: {type(e).__name__}: {e}"))
            return
        self.metrics.running.set(self.batch.taken)

    def _seq(self, job: Job) -> Seq:
        gen = Generation([], prompt_tokens=len(job.ids))
        seq = Seq(job, list(job.ids), torch.Generator().manual_seed(job.seed), gen)
        if self.drafter is not None and self.drafter.kind == "lookup":  # an index of its own: it drafts in any batch
            seq.session = self._session(seq)
        if self.scheduler is not None and self.drafter is not None:
            seq.plans = self.scheduler.start()
        return seq

    def _session(self, seq: Seq):
        """The drafter's session over the request's sequence so far (its slots: a row's tokens and a round's)."""
        slots = self.batch.max_len + self.gamma + 1
        return self.drafter.loop_drafter.start([seq.tokens], slots, self.target.vocab_size)

    def _sessions(self, gamma: int) -> None:
        """A model drafter drafts for a request alone in the batch (its session started from the sequence so far),
        and for none once others join (`batch`)."""
        if self.drafter is None or self.drafter.kind == "lookup":
            return
        alone = gamma > 0 and len(self.batch.seqs) == 1
        for seq in self.batch.seqs:
            if not alone:
                seq.session = None
            elif seq.session is None:
                seq.session = self._session(seq)

    def _count(self, n: int, gamma: int, emitted) -> None:
        last = [(seq.params.temperature, seq.out.rounds[-1]) for seq, _ in emitted]
        if self.lookahead is not None:  # each temperature's acceptance apart (`policy`)
            for temperature, r in last:
                self.lookahead.observe(r.drafted, r.accepted, temperature)
        self.metrics.round(n, gamma, sum(r.drafted for _, r in last), sum(r.accepted for _, r in last))
