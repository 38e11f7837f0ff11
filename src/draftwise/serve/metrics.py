"""`/metrics`: the server's counters in Prometheus text form, through `prometheus_client` (the library vLLM uses),
one registry per server (no process-global state).

The speculative-decoding figures follow vLLM's (`vllm:spec_decode_num_drafts`, `..._num_draft_tokens`,
`..._num_accepted_tokens`) under the `draftwise_` prefix, with TAR and α as gauges derived from them: TAR = tokens
emitted per target pass (round), α = accepted / drafted tokens (see `draftwise.metrics`).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..sd.loop import Generation

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def stats(gen: Generation) -> dict:
    """draftwise's own figures for one request: what the response's `draftwise` field carries (an extension OpenAI
    clients ignore) and what the counters add up."""
    return {
        "rounds": len(gen.rounds),
        "drafted": sum(r.drafted for r in gen.rounds),
        "accepted": sum(r.accepted for r in gen.rounds),
        "seconds": gen.seconds,
        "prefill_s": gen.prefill_s,
    }


class ServerMetrics:
    """What the server counts; `finished` takes each decoded request, `status` each answered one."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.totals = {"tokens": 0, "seconds": 0.0, "rounds": 0, "drafted": 0, "accepted": 0}  # the gauges' sources
        self.requests = Counter("draftwise_requests", "requests answered, by HTTP status", ["status"], registry=r)
        self.prompt_tokens = Counter("draftwise_prompt_tokens", "prompt tokens decoded", registry=r)
        self.generation_tokens = Counter("draftwise_generation_tokens", "tokens generated", registry=r)
        self.decode_seconds = Counter(
            "draftwise_decode_seconds", "seconds spent decoding (prefill included)", registry=r
        )
        self.rounds = Counter("draftwise_spec_decode_rounds", "target verify passes (rounds)", registry=r)
        self.drafts = Counter("draftwise_spec_decode_num_drafts", "rounds with at least one drafted token", registry=r)
        self.draft_tokens = Counter("draftwise_spec_decode_num_draft_tokens", "tokens drafted", registry=r)
        self.accepted_tokens = Counter("draftwise_spec_decode_num_accepted_tokens", "drafted tokens kept", registry=r)
        self.cancelled = Counter("draftwise_requests_cancelled", "generations ended by a client leaving", registry=r)
        self.tokens_per_s = Gauge("draftwise_generation_tokens_per_second", "tokens / decode seconds", registry=r)
        self.tar = Gauge("draftwise_spec_decode_tar", "tokens emitted per target pass", registry=r)
        self.alpha = Gauge("draftwise_spec_decode_alpha", "accepted / drafted tokens", registry=r)
        self.queue_depth = Gauge("draftwise_queue_depth", "requests waiting to be decoded", registry=r)
        self.running = Gauge("draftwise_requests_running", "requests being decoded", registry=r)
        self.batch_size = Gauge("draftwise_batch_size", "requests in the last round's batch", registry=r)
        self.gamma = Gauge("draftwise_spec_decode_gamma", "lookahead γ of the last round (0: plain)", registry=r)
        by = ["batch"]
        self.batch_drafted = Counter(
            "draftwise_spec_decode_draft_tokens_by_batch", "tokens drafted, by batch size", by, registry=r
        )
        self.batch_accepted = Counter(
            "draftwise_spec_decode_accepted_tokens_by_batch", "drafted tokens kept, by batch size", by, registry=r
        )
        self.batch_rounds = Counter("draftwise_rounds_by_batch", "rounds, by batch size", by, registry=r)
        self.ttft = Histogram(
            "draftwise_time_to_first_token_seconds",
            "arrival to the first generated token (queueing included)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.latency = Histogram(
            "draftwise_request_seconds", "arrival to the last generated token", buckets=LATENCY_BUCKETS, registry=r
        )

    def finished(self, gen: Generation) -> None:
        got = {"tokens": len(gen.tokens), **{k: v for k, v in stats(gen).items() if k in self.totals}}
        for k, v in got.items():
            self.totals[k] += v
        self.prompt_tokens.inc(gen.prompt_tokens)
        self.generation_tokens.inc(got["tokens"])
        self.decode_seconds.inc(got["seconds"])
        self.rounds.inc(got["rounds"])
        self.drafts.inc(sum(r.drafted > 0 for r in gen.rounds))
        self.draft_tokens.inc(got["drafted"])
        self.accepted_tokens.inc(got["accepted"])
        t = self.totals
        self.tokens_per_s.set(t["tokens"] / t["seconds"] if t["seconds"] else 0.0)
        self.tar.set(t["tokens"] / t["rounds"] if t["rounds"] else 0.0)
        self.alpha.set(t["accepted"] / t["drafted"] if t["drafted"] else 0.0)

    def round(self, n: int, gamma: int, drafted: int, accepted: int) -> None:
        """A round of the continuous batch: its size, its γ, what its rows drafted and kept."""
        self.batch_size.set(n)
        self.gamma.set(gamma)
        self.batch_rounds.labels(str(n)).inc()
        self.batch_drafted.labels(str(n)).inc(drafted)
        self.batch_accepted.labels(str(n)).inc(accepted)

    def text(self) -> bytes:
        return generate_latest(self.registry)
