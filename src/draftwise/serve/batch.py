"""A continuous batch: the requests the server decodes together, each in a row of one KV cache at its own position.

Between rounds, a waiting request joins (its prompt prefilled alone into the spare row, the last, in chunks between
rounds while others decode: `prefill`) and finished ones leave (the last row moves into the freed one, so rows 0..n-1
are the live ones and a pass covers only them). A round is the loop's
(`sd.loop.generate`), on every row at once: each row proposes its drafts (up to the γ the policy gives this batch
size), one target pass covers every row's pending token and drafts (padded to the longest block: a pad's keys land
past the row's tokens, where its next pass writes over them, as a rejected draft's do), and each row settles its own
verdict with its own generator. The lean engine computes each row as it would alone at batch 1 (`LeanLM.forward` with
per-row positions), so a greedy request gets AR's tokens whatever joins or leaves beside it, and a sampled one follows
the target as it would alone.

A model drafter (or a hybrid, a feature head) holds one cache of its own, so only a request alone in the batch drafts
with it (its session started from the sequence so far); with others beside it the round is plain decoding — what the
paper's batch finding says pays anyway. A lookup drafts for every row, from that row's own index.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..sd.drafters import Draft
from ..sd.loop import Generation, Round, settle
from ..sd.sampling import SamplingParams


@dataclass
class Seq:
    """One request in the batch: its sequence (prompt and emitted tokens), how much of it the cache holds, and its
    drafter session (None: not drafting now)."""

    job: object  # engine.Job
    tokens: list[int]
    generator: torch.Generator
    out: Generation
    length: int = 0
    session: object | None = None
    plans: object | None = None  # the round scheduler's session (`sd.schedule`), while drafting alone
    logprobs: list[dict] = field(default_factory=list)  # this round's, when the request asked for them
    started: float = field(default_factory=time.perf_counter)

    @property
    def params(self) -> SamplingParams:
        return self.job.params

    @property
    def room(self) -> int:
        return self.job.max_tokens - len(self.out.tokens)


class Batch:
    """Rows of one KV cache ([L, slots, KV, max_len + spare, hd], allocated untouched: only what rows write is paged
    in). A row holds up to `max_len` tokens; `spare`: the widest block a round may pad a row with past its end."""

    def __init__(self, lm, slots: int, max_len: int, spare: int = 0):
        s, layers = lm.shape, len(lm.layers)
        size = (layers, slots, s.num_kv_heads, max_len + spare, s.head_dim)
        self.lm, self.slots, self.max_len = lm, slots, max_len
        self.k, self.v = torch.empty(size, dtype=lm.dtype), torch.empty(size, dtype=lm.dtype)
        lm.rotations(max_len + spare)
        self.seqs: list[Seq] = []
        self.joining: Seq | None = None  # the request whose prompt is being prefilled, in row slots - 1

    @property
    def taken(self) -> int:
        """Rows in use: the live ones and the one being prefilled."""
        return len(self.seqs) + (self.joining is not None)

    def cache(self, rows: slice) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[:, rows], self.v[:, rows]

    def join(self, seq: Seq, chunk: int | None = None) -> bool:
        """Start the request's prefill (its prompt but the last token) in the spare row with its first `chunk` tokens
        (None: all of them); True once it is a live row (`prefill`). A row must be free."""
        assert self.joining is None and len(self.seqs) < self.slots
        self.joining, seq.length, seq.out.prefill_s = seq, 0, 0.0
        return self.prefill(chunk)

    def prefill(self, chunk: int | None) -> bool:
        """The joining request's next `chunk` prompt tokens (None: the rest) into its row, at their positions; once its
        prompt is in, it is the next live row (its keys and values moved there) and this returns True."""
        seq, start = self.joining, time.perf_counter()
        ids = self.chunk_ids(chunk)
        if ids:
            self.lm.forward(torch.tensor([ids]), seq.length, 0, cache=self.cache(slice(self.slots - 1, self.slots)))
        return self.advance(len(ids), time.perf_counter() - start)

    def chunk_ids(self, chunk: int | None) -> list[int]:
        """The joining request's next `chunk` prompt tokens (None: the rest), its prompt but the last token."""
        seq = self.joining
        end = len(seq.tokens) - 1 if chunk is None else min(len(seq.tokens) - 1, seq.length + chunk)
        return seq.tokens[seq.length : end]

    def advance(self, n: int, seconds: float) -> bool:
        """The joining request's cache holds `n` more prompt tokens; whole, it becomes the next live row (True)."""
        seq, row = self.joining, self.slots - 1
        seq.length += n
        seq.out.prefill_s += seconds
        if seq.length < len(seq.tokens) - 1:
            return False
        b, end = len(self.seqs), seq.length
        if b != row:
            self.k[:, b, :, :end] = self.k[:, row, :, :end]
            self.v[:, b, :, :end] = self.v[:, row, :, :end]
        self.seqs.append(seq)
        self.joining = None
        return True

    def leave(self, seq: Seq) -> None:
        """The row of `seq` is free; the last row moves into it (its cache rows copied)."""
        b, last = self.seqs.index(seq), len(self.seqs) - 1
        if b != last:
            n = self.seqs[last].length
            self.k[:, b, :, :n] = self.k[:, last, :, :n]
            self.v[:, b, :, :n] = self.v[:, last, :, :n]
            self.seqs[b] = self.seqs[last]
        self.seqs.pop()

    def verify(self, blocks: list[list[int]], chunk: list[int] | None = None) -> torch.Tensor:
        """One target pass: row b's block (its pending token and drafts) at its own position -> logits [n, T, V].
        `chunk`: the joining request's next prompt tokens, in the same pass (`LeanLM.forward_segments`: rows of
        different lengths at once, the weights read once for both)."""
        n, width = len(blocks), max(map(len, blocks))
        padded = [block + block[-1:] * (width - len(block)) for block in blocks]
        pos = [seq.length for seq in self.seqs]
        if not chunk:
            return self.lm.forward(torch.tensor(padded), pos, None, cache=self.cache(slice(0, n)))
        rows = [(ids, b, p, width) for b, (ids, p) in enumerate(zip(padded, pos))]
        logits = self.lm.forward_segments([*rows, (chunk, self.slots - 1, self.joining.length, 0)], (self.k, self.v))
        return torch.stack(logits[:n]).view(n, width, -1)


def propose(batch: Batch, gammas: list[int], stop_below: float) -> list[tuple[Draft, object]]:
    """Each row's drafts for this round, at most its own γ (empty where it has no session or nothing to propose),
    and the round scheduler's plan for them where the row has its session."""
    out = []
    for seq, gamma in zip(batch.seqs, gammas):
        g, draft, plan = min(gamma, seq.room - 1), Draft(), None
        if seq.session is not None and g > 0:
            draft = seq.session.propose({0: seq.tokens}, g, seq.params, seq.generator, stop_below)[0]
        if seq.plans is not None and draft.tokens and len(batch.seqs) == 1:  # its curve is batch 1's
            draft, plan = seq.plans.plan(draft)
        out.append((draft, plan))
    return out


def round_(
    batch: Batch, gamma: int | list[int], stop_below: float, eos: frozenset[int], chunk: int = 0
) -> list[tuple[Seq, list[int]]]:
    """One round over every row, each drafting at most its γ (`gamma`: one for all rows, or a list by row): (each row,
    the tokens it emitted), in row order. Every row's Round carries the batch's draft and verify time: each waited for
    the whole round. `chunk`: that many of the joining request's prompt tokens are prefilled in the round's pass
    (`Batch.verify`); a prompt whole after it joins the rows for the next round."""
    t_round = time.perf_counter()
    drafts = propose(batch, gamma if isinstance(gamma, list) else [gamma] * len(batch.seqs), stop_below)
    t_drafted = time.perf_counter()
    joining = batch.joining if chunk else None
    ids = batch.chunk_ids(chunk) if joining is not None else []
    logits = batch.verify([seq.tokens[seq.length :] + d.tokens for seq, (d, _) in zip(batch.seqs, drafts)], ids)
    settled = []
    for seq, (draft, plan), rows in zip(batch.seqs, drafts, logits):
        g = len(draft.tokens)
        verdict, new = settle(draft, rows[: g + 1], seq.params, seq.generator, seq.room, eos)
        decided = seq.plans.observe(plan, rows[: g + 1], seq.params, verdict.accepted, len(new)) if plan else None
        if seq.job.logprobs is not None:
            seq.logprobs = token_logprobs(rows[: len(new)], new, seq.job.logprobs)
        seq.tokens += new
        seq.out.tokens += new
        seq.length = len(seq.tokens) - 1  # the last token is fed next round
        if seq.session is not None:
            seq.session.keep(0, seq.length)
        settled.append((seq, new, (g, verdict.accepted, len(new), draft.source if g else "", decided)))
    t_end = time.perf_counter()
    for seq, _, (g, accepted, emitted, source, decided) in settled:
        seq.out.rounds.append(Round(g, accepted, emitted, t_drafted - t_round, t_end - t_drafted, source, decided))
    if joining is not None:
        batch.advance(len(ids), t_end - t_drafted)
    return [(seq, new) for seq, new, _ in settled]


def token_logprobs(rows: torch.Tensor, tokens: list[int], top: int) -> list[dict]:
    """OpenAI's logprobs of each emitted token: its log-probability under the target (the raw distribution, before
    temperature and top-p, as vLLM reports by default) and the `top` most likely tokens' at that position."""
    lp = torch.log_softmax(rows.float(), dim=-1)  # [n, V]
    out = []
    for row, token in zip(lp, tokens):
        best = row.topk(top) if top else None
        out.append(
            {
                "token": token,
                "logprob": float(row[token]),
                "top": [] if best is None else list(zip(best.indices.tolist(), best.values.tolist())),
            }
        )
    return out
