"""The server's decoding through its API: greedy answers are draftwise's AR decoding token for token (a model drafter
and an n-gram one), sampled ones follow the target's distribution (chi-square), seeds reproduce, concurrent
requests are each answered as alone, a full queue answers 503, and a client that leaves ends its generation."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest
import torch
from serving import ar, assert_error, serving

import draftwise.serve.batch as batch_module
import draftwise.serve.engine as engine_module
from draftwise.config import ServeConfig
from draftwise.errors import DraftwiseError
from draftwise.sd.sampling import SamplingParams, probs
from draftwise.serve.app import POLL_S
from sd.chisquare import chisquare_pvalue

PROMPTS = [[1, 5, 9], [1, 20, 21, 22, 23, 24, 25], [1], [4, 5, 6, 4, 5, 6, 4, 5], [30, 31, 32, 30, 31, 32]]


@pytest.fixture(scope="module")
def server(tiny_dir, tiny_drafter_dir):
    with serving(ServeConfig(target=tiny_dir, drafter=tiny_drafter_dir, gamma=3, threads=1)) as s:
        yield s


@pytest.fixture(scope="module")
def ngram(tiny_dir):
    with serving(ServeConfig(target=tiny_dir, drafter="ngram", gamma=3, threads=1)) as s:
        yield s


@pytest.fixture(scope="module")
def serial(tiny_dir, tiny_drafter_dir):
    """One request at a time (`--max-batch 1`), as the engines other than the lean one serve."""
    with serving(ServeConfig(target=tiny_dir, drafter=tiny_drafter_dir, gamma=3, threads=1, max_batch=1)) as s:
        yield s


def complete(server, prompt, **kw) -> dict:
    body = {"model": server.served.name, "prompt": prompt, "return_token_ids": True, **kw}
    status, _, out = server.post("/v1/completions", body)
    assert status == 200, out
    return out


@pytest.mark.parametrize("which", ["server", "ngram", "serial"])
def test_greedy_answers_are_the_targets_ar_decoding(which, request):
    server = request.getfixturevalue(which)
    assert server.served.engine.drafter is not None
    drafted = 0
    for prompt in PROMPTS:
        out = complete(server, prompt, max_tokens=40, temperature=0)
        assert out["choices"][0]["token_ids"] == ar(server.served, prompt, 40)
        drafted += out["draftwise"]["drafted"]
    assert drafted > 0  # the drafter proposed: SD, not plain decoding, answered


def exact_first_two(served, prompt, params):
    """The target's exact distributions of the first generated token after `prompt`, and of the second when the
    first is not an EOS (which ends the generation there)."""
    lm, eos = served.engine.target.lm, list(served.engine.target.eos_ids)
    V = lm.vocab_size
    with torch.inference_mode():
        lm.reset(V, len(prompt) + 1)
        p = probs(lm.forward(torch.tensor([prompt + [a] for a in range(V)]), 0), params)  # [V, n+1, V]
    p1 = p[0, len(prompt) - 1]
    go_on = p1.clone()
    go_on[eos] = 0
    return p1, (go_on[:, None] * p[:, len(prompt)]).sum(0) / go_on.sum()


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampled_answers_follow_the_targets_distribution(server, temperature, top_p):
    """Each request its own seed; token 1 is drafted and verified (γ = 3, 3 tokens asked: 2 drafted in round 1),
    token 2 too, so both marginals go through the acceptance test, recovered tokens included."""
    prompt, runs = [1, 5, 9], 500
    V = server.served.vocab
    c1, c2, rounds = torch.zeros(V), torch.zeros(V), []
    for seed in range(runs):
        out = complete(server, prompt, max_tokens=3, temperature=temperature, top_p=top_p, seed=seed)
        t = out["choices"][0]["token_ids"]
        c1[t[0]] += 1
        if len(t) > 1:  # not ended by an EOS
            c2[t[1]] += 1
        rounds.append(out["draftwise"])
    assert any(r["accepted"] < r["drafted"] for r in rounds) and any(r["accepted"] > 0 for r in rounds)
    p1, p2 = exact_first_two(server.served, prompt, SamplingParams(temperature, top_p))
    assert chisquare_pvalue(c1, p1) > 1e-3
    assert chisquare_pvalue(c2, p2) > 1e-3


def test_a_seed_makes_sampled_answers_reproducible(server):
    c = server.client()

    def ask(seed, stream=False):
        kw = dict(model=server.served.name, prompt=[1, 7], max_tokens=20, temperature=1.0, seed=seed)
        if stream:
            return "".join(k.choices[0].text for k in c.completions.create(stream=True, **kw))
        return c.completions.create(**kw).choices[0].text

    first = ask(3)
    assert ask(3) == first and ask(3, stream=True) == first
    assert len({ask(s) for s in range(4)}) > 1  # other seeds, other samples
    assert ar(server.served, [1, 7], 20, SamplingParams(1.0), seed=3) != ar(server.served, [1, 7], 20)  # really sampled


def test_concurrent_requests_are_each_answered_as_alone(server):
    prompts = [[1, 5, 9], [1, 20, 21], [1], [4, 5, 6], [30, 31, 32], [1, 2, 3, 4]]
    want = [ar(server.served, p, 25) for p in prompts]  # before the requests: the target is the worker's then
    start = threading.Barrier(len(prompts))

    def ask(prompt):
        c = server.client()
        start.wait()
        out = c.completions.create(
            model=server.served.name, prompt=prompt, max_tokens=25, temperature=0, extra_body={"return_token_ids": True}
        )
        return out.choices[0].token_ids

    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(ask, prompts))
    assert got == want


@pytest.mark.parametrize("chunked", [True, False])
def test_long_prompts_joining_a_busy_batch_are_each_answered_as_alone(tiny_dir, chunked, monkeypatch):
    """Prompts longer than a chunk join while others decode: prefilled a chunk in each round's pass (or whole, with
    --no-chunked-prefill), each request still gets AR's tokens."""
    chunks = []
    real = batch_module.Batch.advance

    def spy(self, n, seconds):
        whole = real(self, n, seconds)
        chunks.append((n, whole))
        return whole

    monkeypatch.setattr(batch_module.Batch, "advance", spy)
    prompts = [[1] + [5 + (i * 7 + j * 3) % 50 for j in range(70 + 9 * i)] for i in range(4)]
    config = ServeConfig(target=tiny_dir, drafter="ngram", gamma=3, threads=1, chunked_prefill=chunked)
    with serving(config) as s:
        want = [ar(s.served, p, 30) for p in prompts]
        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(
                pool.map(lambda p: complete(s, p, max_tokens=30, temperature=0)["choices"][0]["token_ids"], prompts)
            )
    assert got == want
    partial = [n for n, whole in chunks if n and not whole]  # a chunk after which the prompt was not whole yet
    assert bool(partial) == chunked


@pytest.fixture
def gated(server, monkeypatch):
    """The engine's decoding rounds held until the returned event is set."""
    gate, round_ = threading.Event(), engine_module.round_

    def held(*args, **kw):
        assert gate.wait(20)
        return round_(*args, **kw)

    monkeypatch.setattr(engine_module, "round_", held)
    yield gate
    gate.set()


def wait_for(check, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.mark.parametrize("max_queue", [0, 1])
def test_a_full_queue_answers_503_with_retry_after(server, gated, monkeypatch, max_queue):
    engine = server.served.engine
    monkeypatch.setattr(engine, "max_queue", max_queue)
    assert engine.outstanding == 0  # the previous tests' requests no longer count once answered
    body = {"model": server.served.name, "prompt": [1, 5], "max_tokens": 4, "temperature": 0}
    room = engine.slots + max_queue  # a batch's rows (held), max_queue waiting
    with ThreadPoolExecutor(room) as pool:
        held = []
        for i in range(room):
            held.append(pool.submit(server.post, "/v1/completions", body))
            wait_for(lambda: engine.outstanding == i + 1)
        status, headers, out = server.post("/v1/completions", body)
        assert_error(status, out, 503, code="server_busy")
        assert out["error"]["type"] == "server_error" and int(headers["retry-after"]) >= 1
        gated.set()
        assert [f.result()[0] for f in held] == [200] * room
    assert engine.outstanding == 0
    assert complete(server, [1, 5], max_tokens=4, temperature=0)["usage"]["completion_tokens"] == 4


@pytest.fixture
def slowed(monkeypatch):
    """Each decoding round takes 20 ms more; the tokens each round emitted are recorded."""
    emitted, round_ = [], engine_module.round_

    def slow(*args, **kw):
        time.sleep(0.02)
        out = round_(*args, **kw)
        emitted.extend(new for _, new in out)
        return out

    monkeypatch.setattr(engine_module, "round_", slow)
    return emitted


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_leaves_cancels_its_generation(server, slowed, stream):
    cancelled = server.metric("draftwise_requests_cancelled_total")
    body = {"model": server.served.name, "prompt": [1], "max_tokens": 240, "temperature": 0, "stream": stream}
    url = f"{server.url}/v1/completions"
    if stream:
        with httpx.stream("POST", url, json=body, timeout=10) as r:  # leaves after the first event
            assert next(line for line in r.iter_lines() if line).startswith("data: {")
    else:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=body, timeout=0.5)
    wait_for(lambda: server.metric("draftwise_requests_cancelled_total") == cancelled + 1)
    assert sum(map(len, slowed)) < 200  # ended early (whole: 240 tokens, 4 s or more; cancelled: a few dozen)
    out = complete(server, [1, 5], max_tokens=6, temperature=0)  # and the server goes on serving
    assert out["choices"][0]["token_ids"] == ar(server.served, [1, 5], 6)


def test_a_client_that_leaves_while_queued_is_never_decoded(server, gated):
    engine, tokens = server.served.engine, server.metric("draftwise_generation_tokens_total")
    body = {"model": server.served.name, "prompt": [1, 5], "max_tokens": 7, "temperature": 0}
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(server.post, "/v1/completions", body)
        wait_for(lambda: engine.outstanding == 1)
        with pytest.raises(httpx.ReadTimeout):  # queued behind the held one, then gone
            httpx.post(f"{server.url}/v1/completions", json={**body, "max_tokens": 50}, timeout=0.6)
        time.sleep(4 * POLL_S)  # the server looks for its client every POLL_S
        gated.set()
        assert first.result()[0] == 200
    wait_for(lambda: engine.outstanding == 0)
    assert server.metric("draftwise_generation_tokens_total") == tokens + 7


def test_a_decoding_failure_answers_500_and_the_server_goes_on(server, monkeypatch):
    def broken(*args, **kw):
        raise RuntimeError("boom")

    monkeypatch.setattr(engine_module, "round_", broken)
    body = {"model": server.served.name, "prompt": [1, 5], "max_tokens": 5, "temperature": 0}
    status, _, out = server.post("/v1/completions", body)
    err = assert_error(status, out, 500)
    assert err["type"] == "server_error" and "boom" in err["message"]
    with httpx.stream("POST", f"{server.url}/v1/completions", json={**body, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line]
    assert events[-1] == "data: [DONE]" and "boom" in events[-2] and '"error"' in events[-2]
    monkeypatch.undo()
    assert complete(server, [1, 5], max_tokens=5, temperature=0)["choices"][0]["token_ids"] == ar(
        server.served, [1, 5], 5
    )


@pytest.mark.parametrize("max_batch", [8, 1])
def test_gamma_by_temperature_drafts_only_where_its_temperature_pays(tiny_dir, max_batch):
    """`--gamma-by-temperature 0:3,1:0` (the design's verdict: SD at T = 0, plain decoding at T = 1): T = 0 requests
    draft and stay the target's AR decoding; T = 1 requests draft nothing; in the batch and one at a time."""
    config = ServeConfig(
        target=tiny_dir, drafter="ngram", gamma_by_temperature="0:3,1:0", threads=1, max_batch=max_batch
    )
    with serving(config) as s:
        greedy = [complete(s, prompt, max_tokens=30, temperature=0) for prompt in PROMPTS[3:]]
        assert [g["choices"][0]["token_ids"] for g in greedy] == [ar(s.served, p, 30) for p in PROMPTS[3:]]
        assert sum(g["draftwise"]["drafted"] for g in greedy) > 0
        sampled = [complete(s, prompt, max_tokens=30, temperature=1.0, seed=i) for i, prompt in enumerate(PROMPTS)]
        assert sum(x["draftwise"]["drafted"] for x in sampled) == 0


def test_gamma_by_temperature_is_checked_in_one_line():
    with pytest.raises(DraftwiseError, match="expected T:γ pairs"):
        ServeConfig(target="default", gamma_by_temperature="0=3")
    with pytest.raises(DraftwiseError, match="must be >= 0"):
        ServeConfig(target="default", gamma_by_temperature="0:-1")
