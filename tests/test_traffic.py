"""The traffic's arithmetic: request times from measured phases, crossovers, and which requests a traffic holds."""

from types import SimpleNamespace

import pytest

from draftwise import traffic

A = traffic.Figures(ttft_s=0.2, tpot_s=1 / 80, tokens_per_s=0.0, request_s=0.0, requests=1)
B = traffic.Figures(ttft_s=0.5, tpot_s=1 / 100, tokens_per_s=0.0, request_s=0.0, requests=1)


def test_the_crossover_is_where_request_times_meet():
    at = traffic.crossover(A, B)  # 0.2 + L/80 = 0.5 + L/100 → L = 0.3 / (1/80 − 1/100) = 120
    assert at == pytest.approx(120.0)
    assert A.at(at) == pytest.approx(B.at(at)) and A.at(at - 1) < B.at(at - 1) and A.at(at + 1) > B.at(at + 1)
    assert traffic.crossover(B, A) == pytest.approx(120.0)
    assert traffic.crossover_sentence(A, "B", B) == "beyond ~120 new tokens B is faster"
    assert traffic.crossover_sentence(B, "A", A) == "below ~120 new tokens A is faster"


def test_no_crossover_when_one_is_faster_in_both_phases():
    fast = traffic.Figures(0.1, 1 / 100, 0.0, 0.0, 1)
    assert traffic.crossover(B, fast) is None and traffic.crossover(fast, B) is None
    assert traffic.crossover(A, A) is None
    assert traffic.crossover_sentence(B, "fast", fast) == "fast is faster at every answer length"
    assert traffic.crossover_sentence(fast, "B", B) == "B is slower at every answer length"


def _rec(method, prompt, t, prefill, seconds, tokens):
    return {
        "method": method,
        "prompt_id": prompt,
        "temperature": t,
        "prefill_s": prefill,
        "seconds": seconds,
        "new_tokens": tokens,
    }


def test_request_times_at_the_answer_length_the_target_gave():
    """Two options on one request, answering 100 and 60 tokens (sampling): each priced at their mean, 80 tokens, by
    its own TTFT and time per token; repeated passes pool; batched records and unnamed options are left out."""
    records = [
        _rec("a", "p", 1.0, 0.2, 1.2, 100),  # decode 1.0 s / 100 tokens
        _rec("b", "p", 1.0, 0.5, 1.1, 60),  # decode 0.6 s / 60 tokens
        _rec("b", "p", 1.0, 0.5, 1.1, 60),  # a repeat: pooled
        {**_rec("a", "q", 1.0, 0.2, 1.2, 100), "batch": 2},
        _rec("x", "p", 1.0, 0.1, 0.2, 100),
    ]
    by = traffic.phases(records, lambda r: None if r["method"] == "x" else r["method"])
    pooled = by["b"][(1.0, "p")]
    assert set(by) == {"a", "b"} and (pooled.ttft_s, pooled.decode_s, pooled.tokens) == pytest.approx((1.0, 1.2, 120))
    assert traffic.answers(by) == {(1.0, "p"): pytest.approx(110.0)}  # (100 + 120) / 2: the pooled count
    times = traffic.request_times(by)
    assert times["a"][(1.0, "p")] == pytest.approx((110.0, 0.2 + 110 * 0.01))
    assert times["b"][(1.0, "p")] == pytest.approx((110.0, 1.0 + 110 * 0.01))
    fig = traffic.figures(by["a"], times["a"])
    assert (
        fig.ttft_s == 0.2
        and fig.decode_tokens_per_s == pytest.approx(100)
        and fig.tokens_per_s == pytest.approx(100 / 1.2)
    )
    assert traffic.request_times(by, lambda at: at[0] == 0.0) == {"a": {}, "b": {}}


def test_the_traffic_holds_each_line_at_its_own_temperature():
    prompts = [SimpleNamespace(id="u/1", extra={"temperature": 0.0}), SimpleNamespace(id="u/2", extra={})]
    own = traffic.requests_of(prompts, (0.0, 0.5), own=True)
    assert own == {(0.0, "u/1"), (traffic.OPENAI_TEMPERATURE, "u/2")}
    assert traffic.temperatures_of(prompts, (0.0, 0.5), own=True) == (0.0, 1.0)
    suites = traffic.requests_of(prompts, (0.0, 1.0), own=False)
    assert suites == {(t, p) for t in (0.0, 1.0) for p in ("u/1", "u/2")}
