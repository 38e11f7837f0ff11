"""The HTTP side of `draftwise serve` through the `openai` client and raw requests: completions and chats, whole and
streamed, stop strings, the OpenAI error object for every bad input, auth, the body limit, /v1/models and /metrics."""

import json

import httpx2 as httpx
import pytest
from serving import ar, assert_error, serving

from draftwise.config import ServeConfig

CONTEXT = 256  # the tiny config's max_position_embeddings
PROMPT = "w1 w2 w3"


@pytest.fixture(scope="module")
def server(tiny_dir, tiny_drafter_dir):
    with serving(ServeConfig(target=tiny_dir, drafter=tiny_drafter_dir, gamma=3, threads=1)) as s:
        yield s


@pytest.fixture(scope="module")
def guarded(tiny_dir):
    """A second server: n-gram drafter, an API key, a 512-byte body limit and a served name of its own."""
    limits = dict(api_key="sesame", max_body_bytes=512, served_model_name="tiny")
    config = ServeConfig(target=tiny_dir, drafter="ngram", gamma=3, threads=1, **limits)
    with serving(config) as s:
        yield s


def greedy(server, **kw) -> dict:
    """A whole greedy /v1/completions answer (token ids included) as JSON."""
    body = {"model": server.served.name, "prompt": PROMPT, "max_tokens": 12, "temperature": 0, "return_token_ids": True}
    status, _, out = server.post("/v1/completions", {**body, **kw})
    assert status == 200, out
    return out


def test_a_text_completion_is_the_targets_greedy_decoding(server):
    c = server.client()
    out = c.completions.create(
        model=server.served.name, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"return_token_ids": True}
    )
    ids = server.served.tokenizer(PROMPT)["input_ids"]
    want = ar(server.served, ids, 12)
    assert out.object == "text_completion" and out.model == server.served.name and out.id.startswith("cmpl-")
    (ch,) = out.choices
    assert ch.token_ids == want and ch.finish_reason == "length"
    assert ch.text == server.served.tokenizer.decode(want, skip_special_tokens=True) and ch.text
    u = out.usage
    assert (u.prompt_tokens, u.completion_tokens, u.total_tokens) == (len(ids), 12, len(ids) + 12)
    assert out.model_extra["draftwise"]["rounds"] >= 1


def test_a_completion_of_token_ids(server):
    ids = [1, 30, 31, 32, 33]
    out = server.client().completions.create(
        model=server.served.name, prompt=ids, max_tokens=10, temperature=0, extra_body={"return_token_ids": True}
    )
    assert out.choices[0].token_ids == ar(server.served, ids, 10)
    assert out.usage.prompt_tokens == len(ids)


def test_a_chat_completion_goes_through_the_chat_template(server):
    messages = [{"role": "system", "content": "w7"}, {"role": "user", "content": "w1 w2"}]
    out = server.client().chat.completions.create(
        model=server.served.name, messages=messages, max_tokens=10, temperature=0, extra_body={"return_token_ids": True}
    )
    ids = server.served.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
    want = ar(server.served, list(ids), 10)
    (ch,) = out.choices
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert ch.message.role == "assistant" and ch.model_extra["token_ids"] == want
    assert ch.message.content == server.served.tokenizer.decode(want, skip_special_tokens=True)
    assert out.usage.prompt_tokens == len(ids) and ch.finish_reason == "length"


def test_chat_content_parts_are_the_text_parts_in_order(server):
    def ask(content):
        body = {"model": server.served.name, "messages": [{"role": "user", "content": content}], "temperature": 0}
        status, _, out = server.post("/v1/chat/completions", {**body, "max_tokens": 8, "return_token_ids": True})
        assert status == 200, out
        return out["usage"]["prompt_tokens"], out["choices"][0]["token_ids"]

    parts = [
        {"type": "text", "text": "w1 "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"type": "text", "text": "w2"},
    ]
    assert ask(parts) == ask("w1 w2") != ask("w2 w1")


def test_completions_default_to_16_tokens(server):
    status, _, out = server.post("/v1/completions", {"model": server.served.name, "prompt": [1, 5], "temperature": 0})
    assert status == 200 and out["usage"]["completion_tokens"] == 16


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("include_usage", [False, True])
def test_streamed_chunks_concatenate_to_the_whole_answer(server, chat, include_usage):
    c, name = server.client(), server.served.name
    kw = dict(model=name, max_tokens=14, temperature=0, extra_body={"return_token_ids": True})
    ask = (
        (lambda **k: c.chat.completions.create(messages=[{"role": "user", "content": PROMPT}], **kw, **k))
        if chat
        else (lambda **k: c.completions.create(prompt=PROMPT, **kw, **k))
    )
    whole = ask()
    opts = {"stream_options": {"include_usage": True}} if include_usage else {}
    chunks = list(ask(stream=True, **opts))
    with_choices = [k for k in chunks if k.choices]
    text = "".join((k.choices[0].delta.content or "") if chat else k.choices[0].text for k in with_choices)
    ids = [t for k in with_choices for t in k.choices[0].model_extra["token_ids"]]
    ch = whole.choices[0]
    assert text == (ch.message.content if chat else ch.text) and text
    assert ids == ch.model_extra["token_ids"]
    assert len(with_choices) > 2  # really streamed, round by round
    assert [k.choices[0].finish_reason for k in with_choices] == [None] * (len(with_choices) - 1) + ["length"]
    assert {k.object for k in chunks} == {"chat.completion.chunk" if chat else "text_completion"}
    assert len({k.id for k in chunks}) == 1
    if include_usage:
        assert not chunks[-1].choices and chunks[-1].usage == whole.usage
        assert all(k.usage is None for k in chunks[:-1])
    else:
        assert all(k.usage is None for k in chunks)


def test_the_event_stream_is_sse_and_ends_with_done(server):
    body = {"model": server.served.name, "prompt": PROMPT, "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    assert all(e.startswith("data: ") for e in events[:-1])
    chunks = [json.loads(e[len("data: ") :]) for e in events[:-2]]
    assert "".join(k["choices"][0]["text"] for k in chunks) == greedy(server, max_tokens=8)["choices"][0]["text"]


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_cut_the_text_before_the_earliest(server, stream):
    full = greedy(server, max_tokens=30)["choices"][0]["text"]
    words = full.split(" ")
    assert len(words) > 20
    late, early = " " + words[15], words[6][-1:] + " " + words[7]  # the second spans a token boundary
    cut = min(full.find(late), full.find(early))
    assert 0 < cut < len(full)
    c = server.client()
    kw = dict(model=server.served.name, prompt=PROMPT, max_tokens=30, temperature=0, stop=[late, early])
    if stream:
        chunks = list(c.completions.create(stream=True, **kw))
        text, finish = "".join(k.choices[0].text for k in chunks), chunks[-1].choices[0].finish_reason
    else:
        out = c.completions.create(**kw)
        text, finish = out.choices[0].text, out.choices[0].finish_reason
    assert text == full[:cut] and finish == "stop"


def test_max_tokens_ends_with_length_and_eos_with_stop(server, monkeypatch):
    out = greedy(server, max_tokens=9)
    assert out["choices"][0]["finish_reason"] == "length" and len(out["choices"][0]["token_ids"]) == 9
    tokens = greedy(server, max_tokens=30)["choices"][0]["token_ids"]
    eos = tokens[10]  # make a token the greedy decoding reaches the target's EOS
    monkeypatch.setattr(server.served.engine.target.config, "eos_token_id", eos)
    (ch,) = greedy(server, max_tokens=30)["choices"]
    assert ch["finish_reason"] == "stop" and ch["token_ids"] == tokens[: tokens.index(eos) + 1]


def test_models_lists_the_served_name(server, guarded):
    assert [m.id for m in server.client().models.list().data] == [server.served.name]
    assert [m.id for m in guarded.client(api_key="sesame").models.list().data] == ["tiny"]


def test_metrics_count_tokens_requests_and_drafts(server):
    names = ["generation_tokens_total", "prompt_tokens_total", "spec_decode_num_draft_tokens_total"]
    names += ["spec_decode_rounds_total", "time_to_first_token_seconds_count"]
    ok, bad = (f'draftwise_requests_total{{status="{s}"}}' for s in (200, 400))

    def counts():
        text = httpx.get(f"{server.url}/metrics").text
        samples = dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))
        return {k: float(samples.get(k, 0)) for k in [f"draftwise_{n}" for n in names] + [ok, bad]}

    before = counts()
    out = greedy(server, max_tokens=11)
    server.post("/v1/completions", {"model": server.served.name, "prompt": PROMPT, "max_tokens": 0})
    r = httpx.get(f"{server.url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    assert "# TYPE draftwise_generation_tokens_total counter" in r.text
    grew = {k: v - before[k] for k, v in counts().items()}
    assert grew["draftwise_generation_tokens_total"] == 11 and grew["draftwise_prompt_tokens_total"] == 3
    assert grew["draftwise_spec_decode_rounds_total"] == out["draftwise"]["rounds"]
    assert grew["draftwise_spec_decode_num_draft_tokens_total"] == out["draftwise"]["drafted"] > 0
    assert grew["draftwise_time_to_first_token_seconds_count"] == 1
    assert grew[ok] == 1 and grew[bad] == 1


def bad_inputs():
    """(path, body, status, param): bodies the server must refuse with OpenAI's error object."""
    m = {"model": "MODEL"}
    c, chat = "/v1/completions", "/v1/chat/completions"
    ids = {**m, "prompt": [1, 2]}
    hi = {**m, "messages": [{"role": "user", "content": "w1"}]}
    return [
        (c, b'{"model": "MODEL", "prompt": ', 400, None),
        (c, b"\xff\xfe", 400, None),
        (c, b"[1, 2]", 400, None),
        (c, {"prompt": "w1"}, 400, "model"),
        (c, m, 400, "prompt"),
        (chat, m, 400, "messages"),
        (chat, {**m, "messages": []}, 400, "messages"),
        (chat, {**m, "messages": [{"content": "w1"}]}, 400, "messages.0.role"),
        (c, {**ids, "max_tokens": 0}, 400, "max_tokens"),
        (c, {**ids, "max_tokens": -5}, 400, "max_tokens"),
        (c, {**ids, "max_tokens": "many"}, 400, "max_tokens"),
        (c, {**ids, "max_tokens": CONTEXT - 1}, 400, "max_tokens"),  # 2 + 255 > 256
        (c, {**ids, "max_tokens": 10**6}, 400, "max_tokens"),
        (chat, {**hi, "max_completion_tokens": 10**4}, 400, "max_tokens"),
        (chat, {**hi, "max_completion_tokens": 0}, 400, "max_tokens"),
        (c, {**m, "prompt": [1] * CONTEXT, "max_tokens": 1}, 400, "prompt"),
        (c, {**m, "prompt": [1] * (CONTEXT + 50)}, 400, "prompt"),
        (c, {**m, "prompt": "w1 " * (CONTEXT + 1)}, 400, "prompt"),
        (chat, {**m, "messages": [{"role": "user", "content": "w1 " * CONTEXT}]}, 400, "prompt"),
        (c, {**ids, "n": 2}, 400, "n"),
        (c, {**ids, "logprobs": 21}, 400, "logprobs"),
        (c, {**ids, "echo": True}, 400, "echo"),
        (c, {**ids, "best_of": 3}, 400, "best_of"),
        (c, {**ids, "suffix": "w2"}, 400, "suffix"),
        (chat, {**hi, "top_logprobs": 2}, 400, "top_logprobs"),  # without logprobs: true
        (chat, {**hi, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
        (c, {**m, "prompt": [1, 64]}, 400, "prompt"),  # the vocabulary is 64
        (c, {**m, "prompt": [-1, 5]}, 400, "prompt"),
        (c, {**m, "prompt": []}, 400, "prompt"),
        (c, {**m, "prompt": ""}, 400, "prompt"),
        (c, {**m, "prompt": ["w1", "w2"]}, 400, "prompt"),
        (c, {**m, "prompt": [[1, 2], [3]]}, 400, "prompt"),
        (c, {**ids, "temperature": 2.5}, 400, "temperature"),
        (c, {**ids, "temperature": -1}, 400, "temperature"),
        (c, {**ids, "top_p": 0}, 400, "top_p"),
        (c, {**ids, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        (c, {**ids, "stream_options": {"include_usage": "perhaps"}}, 400, "stream_options.include_usage"),
        (c, {**ids, "model": "gpt-4"}, 404, "model"),
        (chat, {"model": "gpt-4", "messages": [{"role": "user", "content": "w1"}]}, 404, "model"),
    ]


@pytest.mark.parametrize("path, body, status, param", bad_inputs())
def test_every_bad_input_gets_an_openai_error(server, path, body, status, param):
    if isinstance(body, dict):
        body = {k: (server.served.name if v == "MODEL" else v) for k, v in body.items()}
    got, headers, out = server.post(path, body)
    err = assert_error(got, out, status, param)
    assert headers["content-type"] == "application/json"
    assert err["type"] == "invalid_request_error"
    if status == 404:
        assert err["code"] == "model_not_found"


def test_max_tokens_may_fill_the_context_exactly(server):
    body = {"model": server.served.name, "prompt": [1] * (CONTEXT - 5), "temperature": 0}
    status, _, out = server.post("/v1/completions", {**body, "max_tokens": 5})
    assert status == 200 and out["usage"]["total_tokens"] == CONTEXT  # (greedy: no EOS on this prompt)
    status, _, out = server.post("/v1/completions", {**body, "max_tokens": 6})
    assert_error(status, out, 400, "max_tokens")


def test_unknown_routes_and_methods_get_the_error_object(server):
    r = httpx.get(f"{server.url}/v1/nothing")
    assert_error(r.status_code, r.json(), 404)
    r = httpx.get(f"{server.url}/v1/completions")
    assert_error(r.status_code, r.json(), 405)


def test_the_openai_client_sees_the_errors_it_expects(server):
    import openai

    c = server.client()
    with pytest.raises(openai.NotFoundError) as e:
        c.completions.create(model="nope", prompt="w1")
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=server.served.name, prompt="w1", n=2)
    assert e.value.body["param"] == "n"


def test_an_api_key_guards_the_api_and_metrics_but_not_health(guarded):
    url = guarded.url
    assert httpx.get(f"{url}/health").json() == {"status": "ok"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sesame"}):
        for path in ("/v1/models", "/metrics"):
            r = httpx.get(url + path, headers=headers)
            assert_error(r.status_code, r.json(), 401, code="invalid_api_key")
        r = httpx.post(f"{url}/v1/completions", json={"model": "tiny", "prompt": "w1"}, headers=headers)
        assert_error(r.status_code, r.json(), 401, code="invalid_api_key")
    import openai

    with pytest.raises(openai.AuthenticationError):
        guarded.client(api_key="wrong").completions.create(model="tiny", prompt="w1")
    out = guarded.client(api_key="sesame").completions.create(model="tiny", prompt="w1", max_tokens=3, temperature=0)
    assert out.usage.completion_tokens == 3
    r = httpx.get(f"{url}/metrics", headers={"Authorization": "Bearer sesame"})
    assert r.status_code == 200 and "draftwise_generation_tokens_total" in r.text


def test_a_body_over_the_limit_gets_413(guarded):
    small = {"model": "tiny", "prompt": "w1 w2", "max_tokens": 2}
    status, _, out = guarded.post("/v1/completions", small)
    assert status == 200 and len(json.dumps(small)) < 512
    big = {**small, "prompt": "w1 " * 300}
    status, _, out = guarded.post("/v1/completions", big)
    assert_error(status, out, 413, code="body_too_large")

    def chunks():  # no Content-Length: the limit is found while reading
        data = json.dumps(big).encode()
        yield from (data[i : i + 100] for i in range(0, len(data), 100))

    r = httpx.post(f"{guarded.url}/v1/completions", content=chunks(), headers=guarded.auth())
    assert "content-length" not in r.request.headers
    assert_error(r.status_code, r.json(), 413, code="body_too_large")


def test_a_model_name_other_than_the_served_one_is_404(guarded, tiny_dir):
    status, _, out = guarded.post("/v1/completions", {"model": tiny_dir, "prompt": "w1"})
    assert_error(status, out, 404, "model", "model_not_found")
