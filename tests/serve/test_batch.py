"""The continuous batch: requests that join and leave at different rounds each get AR's greedy tokens (the lean
engine at fp32 and at int8), their log-probabilities are AR's, γ shrinks with the batch as the measured curve prices
it, and a burst past the queue loses no request (503s counted)."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from serving import ar, serving

from draftwise.config import ServeConfig
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load
from draftwise.sd.drafters import Context
from draftwise.sd.lookup import NgramDrafter
from draftwise.sd.loop import Generation, generate
from draftwise.sd.sampling import SamplingParams
from draftwise.serve.batch import Batch, Seq, round_
from draftwise.serve.engine import Job
from draftwise.serve.policy import Chunks, Lookahead, Tops, expected_tokens, verify_curve
from draftwise.serve.text import TextStream

PROMPTS = [[1, 5, 9], [1, 20, 21, 22, 23, 24, 25], [1], [4, 5, 6, 4, 5, 6, 4, 5], [30, 31, 32, 30, 31, 32], [7, 8]]


def job(ids, max_tokens, logprobs=None):
    loop = asyncio.new_event_loop()
    return Job(ids, SamplingParams(0.0), max_tokens, 0, TextStream(None), loop, logprobs=logprobs)


def seq_of(ids, max_tokens, drafter=None, logprobs=None):
    seq = Seq(job(ids, max_tokens, logprobs), list(ids), torch.Generator(), Generation([], prompt_tokens=len(ids)))
    seq.session = drafter.start([seq.tokens], 256, 64) if drafter else None
    return seq


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("gamma", [0, 3])
def test_rows_that_join_and_leave_at_different_rounds_get_ars_tokens(tiny_dir, dtype, gamma):
    lm = load(tiny_dir, ModelOptions(dtype=dtype)).lm
    lengths = [30, 5, 17, 40, 9, 23]
    want = [generate(lm, p, SamplingParams(0.0), n, torch.Generator()).tokens for p, n in zip(PROMPTS, lengths)]
    batch, waiting, done = Batch(lm, 4, 256), list(zip(PROMPTS, lengths)), []
    rounds = 0
    while waiting or batch.seqs:
        if waiting and len(batch.seqs) < batch.slots and rounds % 3 == 0:  # one joins every third round
            batch.join(seq_of(*waiting.pop(0), NgramDrafter(1, 3) if gamma else None))
        for seq, _ in round_(batch, gamma, 0.0, frozenset()):
            if seq.room <= 0:
                batch.leave(seq)
                done.append(seq)
        rounds += 1
    got = {tuple(s.job.ids): s.out.tokens for s in done}
    assert [got[tuple(p)] for p in PROMPTS] == want
    assert sum(r.accepted for s in done for r in s.out.rounds) > 0 or not gamma  # drafted tokens were accepted


@pytest.mark.parametrize("dtype", ["fp32", "q8:int8"])
@pytest.mark.parametrize("within", [True, False])
def test_prompts_prefilled_in_chunks_beside_decoding_rows_get_ars_tokens(tiny_dir, dtype, within):
    """A joining prompt prefilled a few tokens a round while the others decode (in the spare row, moved to its live
    row when whole) — in the rows' own pass (`within`: `round_`'s chunk, one pass of rows of different lengths) or
    between rounds — gives each request AR's greedy tokens, and the decoding rows keep emitting meanwhile."""
    lm = load(tiny_dir, ModelOptions(dtype=dtype.split(":")[-1])).lm
    prompts = [PROMPTS[1] * 3, PROMPTS[3] * 4, PROMPTS[0], PROMPTS[4] * 2]  # 21, 32, 3 and 12 tokens
    lengths = [25, 12, 30, 9]
    want = [generate(lm, p, SamplingParams(0.0), n, torch.Generator()).tokens for p, n in zip(prompts, lengths)]
    batch, waiting, done, stalls = Batch(lm, 3, 256), list(zip(prompts, lengths)), [], 0
    while waiting or batch.seqs or batch.joining:
        if batch.joining is None and waiting and len(batch.seqs) < batch.slots:
            batch.join(seq_of(*waiting.pop(0), NgramDrafter(1, 3)), 0)
        before = batch.joining.length if batch.joining is not None else None
        if batch.joining is not None and (not within or not batch.seqs):
            batch.prefill(5 if batch.seqs else None)  # 5 tokens a round beside decoding rows, all of it alone
        chunk = 5 if within and batch.joining is not None else 0
        for seq, _ in round_(batch, 2, 0.0, frozenset(), chunk) if batch.seqs else []:
            if seq.room <= 0:
                batch.leave(seq)
                done.append(seq)
        stalls += before is not None and batch.joining is not None and batch.joining.length - before == 5
    got = {tuple(s.job.ids): s.out.tokens for s in done}
    assert [got[tuple(p)] for p in prompts] == want
    assert stalls >= 3  # prompts did join in chunks, rounds running beside them


def test_rows_of_different_lengths_in_one_pass_are_each_rows_own_bits(tiny_dir):
    """`forward_segments` (a decoding row's block and a joining prompt's chunk in one pass) gives each segment the
    logits and cache its own pass gives; a whole prompt and the same prompt in chunks leave the same cache."""
    lm = load(tiny_dir, ModelOptions(dtype="int8")).lm
    ids = torch.randint(0, lm.vocab_size, (107,), generator=torch.Generator().manual_seed(0)).tolist()
    first, second = ids[:37], ids[37:]  # the second past the 64 rows of a short pass
    alone, fused = Batch(lm, 2, 256), Batch(lm, 2, 256)
    for batch in (alone, fused):
        lm.forward(torch.tensor([first[:30]]), 0, 0, cache=batch.cache(slice(0, 1)))
    want = lm.forward(torch.tensor([first[30:34]]), 30, None, cache=alone.cache(slice(0, 1)))[0]
    lm.forward(torch.tensor([second]), 0, 0, cache=alone.cache(slice(1, 2)))
    lm.forward(torch.tensor([second[:10]]), 0, 0, cache=fused.cache(slice(1, 2)))
    got = lm.forward_segments([(first[30:34], 0, 30, 4), (second[10:], 1, 10, 0)], (fused.k, fused.v))
    assert torch.equal(got[0], want) and got[1].shape[0] == 0
    for row, n in ((0, 34), (1, 70)):  # what each row's passes wrote (a batch's cache starts unwritten)
        assert torch.equal(alone.k[:, row, :, :n], fused.k[:, row, :, :n])
        assert torch.equal(alone.v[:, row, :, :n], fused.v[:, row, :, :n])


def test_a_chunk_is_what_a_round_takes_at_the_measured_prefill_cost():
    chunks = Chunks()
    assert chunks.tokens() == Chunks.FIRST  # nothing measured yet
    chunks.timed_round(0.05, chunk=32)  # no round without a chunk timed yet: nothing to compare with
    assert chunks.tokens() == Chunks.FIRST
    chunks.timed_round(0.05)
    chunks.timed_round(0.082, chunk=32)  # 32 ms more: 1 ms a prompt token
    assert chunks.tokens() == 50  # a 50 ms round buys 50 tokens
    chunks.timed_round(0.55, chunk=50)  # slower than thought: smaller chunks
    assert Chunks.LEAST <= chunks.tokens() < 50
    for _ in range(20):
        chunks.timed_round(10.0, chunk=10)
    assert chunks.tokens() == Chunks.LEAST  # never below the least chunk
    fresh = Chunks()
    fresh.timed_round(0.05)
    fresh.timed_round(0.04, chunk=10)  # looked free (noise): costed at a tenth of a round, not nothing
    assert fresh.tokens() == 100


def test_log_probabilities_are_ars(tiny_dir):
    lm = load(tiny_dir, ModelOptions(dtype="int8")).lm
    prompt, n = PROMPTS[3], 12
    tokens = generate(lm, prompt, SamplingParams(0.0), n, torch.Generator()).tokens
    ctx = Context(lm, lm.vocab_size)
    lm.reset(1, 64)
    ctx.feed(prompt[:-1], 0)
    want, seq = [], prompt[-1:] + tokens
    for t in seq[:-1]:
        want.append(torch.log_softmax(ctx.feed([t], 1)[0].float(), -1))  # AR: one token a pass
    batch = Batch(lm, 2, 64)
    row = seq_of(prompt, n, NgramDrafter(1, 3), logprobs=3)
    batch.join(row)
    batch.join(seq_of(PROMPTS[0], n))  # a neighbour
    got = []
    while row.room > 0:
        round_(batch, 3, 0.0, frozenset())
        got += row.logprobs
    assert [g["token"] for g in got] == tokens
    for g, w in zip(got, want):
        assert g["logprob"] == float(w[g["token"]])
        assert [t for t, _ in g["top"]] == w.topk(3).indices.tolist()


def test_gamma_shrinks_as_the_measured_verify_curve_grows(tiny_dir):
    flat = {1: [1.0, 1.0, 1.0, 1.0], 8: [1.0, 1.05, 1.1, 1.15]}
    steep = {1: [1.0, 1.0, 1.0, 1.0], 8: [1.0, 2.0, 3.0, 4.0]}
    assert Lookahead(3, flat, False).gamma(1) == 3 and Lookahead(3, flat, False).gamma(8) == 3
    assert Lookahead(3, steep, False).gamma(8) == 0  # a draft costs a whole step at 8 rows
    assert Lookahead(3, flat, True).gamma(8) == 0 and Lookahead(3, flat, True).gamma(1) == 3  # a model drafts alone
    policy = Lookahead(3, {1: [1.0] * 4, 8: [1.0, 1.3, 1.6, 1.9]}, False)
    policy.observe(1000, 990)  # acceptance near 1: speculation pays at 8 rows too
    assert policy.gamma(8) == 3 and policy.gamma(4) == 3
    policy.observe(10000, 0)  # never accepted: plain decoding
    assert policy.gamma(8) == 0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    lm = load(tiny_dir, ModelOptions(dtype="int8")).lm
    curve = verify_curve(Batch(lm, 4, 256), [1, 2, 4], 2)
    assert set(curve) == {1, 2, 4} and all(len(c) == 3 and min(c) > 0 for c in curve.values())


@pytest.fixture(scope="module")
def server(tiny_dir):
    with serving(ServeConfig(target=tiny_dir, drafter="ngram", gamma=3, threads=1, max_batch=4, max_queue=2)) as s:
        yield s


def test_logprobs_through_the_api_are_ars(server):
    prompt = PROMPTS[3]
    out = server.client().completions.create(
        model=server.served.name, prompt=prompt, max_tokens=8, temperature=0, logprobs=2
    )
    lp = out.choices[0].logprobs
    lm = server.served.engine.target.lm
    tokens = ar(server.served, prompt, 8)
    with torch.inference_mode():
        lm.reset(1, 64)
        rows = torch.log_softmax(lm.forward(torch.tensor([prompt + tokens]), 0)[0, len(prompt) - 1 : -1].float(), -1)
    assert lp.tokens == [server.served.decode(t) for t in tokens]
    assert lp.token_logprobs == pytest.approx([float(r[t]) for r, t in zip(rows, tokens)], abs=1e-5)
    assert all(len(top) == 2 for top in lp.top_logprobs)
    chat = server.client().chat.completions.create(
        model=server.served.name,
        messages=[{"role": "user", "content": "w1 w2"}],
        max_tokens=5,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 5 and all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)


def test_a_burst_past_the_queue_loses_no_request(server):
    """4 rows and 2 waiting: of 12 requests at once, each is answered — AR's tokens or a 503 — and /metrics counts
    the 503s; the batch ran at more than one row."""
    busy = server.metric("draftwise_requests_total", 'status="503"')
    start = threading.Barrier(12)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(12)]
    want = [ar(server.served, p, 30) for p in prompts]

    def ask(prompt):
        start.wait()
        body = {"model": server.served.name, "prompt": prompt, "max_tokens": 30, "temperature": 0}
        return server.post("/v1/completions", {**body, "return_token_ids": True})

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(ask, prompts))
    ok = [(a, w) for a, w in zip(answers, want) if a[0] == 200]
    assert all(a[2]["choices"][0]["token_ids"] == w for a, w in ok)
    assert {a[0] for a in answers} <= {200, 503} and len(ok) >= 6
    assert server.metric("draftwise_requests_total", 'status="503"') - busy == 12 - len(ok)
    assert any(server.metric("draftwise_rounds_by_batch_total", f'batch="{n}"') > 0 for n in (2, 3, 4))


def test_gamma_is_priced_per_request_temperature():
    """Acceptance is counted per temperature: a lookup that pays at T = 0 and never at T = 1 drafts only for T = 0
    rows of the same batch; the batch-1 γ per temperature comes from `Tops` (the design's per-temperature verdicts)."""
    curve = {1: [1.0] * 4, 8: [1.0, 1.3, 1.6, 1.9]}
    policy = Lookahead(3, curve, False)
    policy.observe(1000, 990, temperature=0.0)
    policy.observe(1000, 0, temperature=1.0)
    assert policy.alpha(0.0) > 0.95 and policy.alpha(1.0) < 0.05 and policy.alpha(0.7) == pytest.approx(0.5)
    assert policy.gamma(8, 0.0) == 3 and policy.gamma(8, 1.0) == 0
    tops = Tops(4, {0.0: 3, 1.0: 0})
    assert (tops(0.0), tops(0.2), tops(0.5), tops(0.9), tops(1.5), tops.most) == (3, 3, 3, 0, 0, 3)
    assert Tops(4)(1.0) == 4 and Tops(4).most == 4
    by_temp = Lookahead(tops, curve, False)
    assert by_temp.tops.most == 3 and by_temp.gamma(1, 0.0) == 3
    assert by_temp.gamma(1, 1.0) == 0 and by_temp.gamma(8, 1.0) == 0
