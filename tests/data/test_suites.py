"""Tests for draftwise.data: packaged suites, the text-hashed train/eval split, and user prompt files."""

import json
import pickle
from dataclasses import replace

import pytest

from draftwise.data import (
    EVAL_FRACTION,
    SPLITS,
    SUITES,
    Prompt,
    load_prompts,
    load_suite,
    read_prompt_file,
    split_of,
    spread,
)
from draftwise.errors import DraftwiseError

EXPECTED_COUNTS = {
    "spec_bench": 480,
    "mmlu": 285,
    "hellaswag": 500,
    "arena": 500,
    "cnn_dm": 100,
    "xsum": 100,
    "alpaca": 80,
    "gsm8k": 80,
    "humaneval": 80,
}
SPEC_BENCH_CATEGORIES = {
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
    "translation",
    "summarization",
    "qa",
    "math_reasoning",
    "rag",
}


def norm(text):
    return " ".join(text.split())


def test_suite_names_and_order():
    assert SUITES == tuple(EXPECTED_COUNTS)
    assert SPLITS == ("train", "eval")


@pytest.mark.parametrize("name", SUITES)
def test_suite_loads_with_expected_count(name):
    prompts = load_suite(name)
    assert len(prompts) == EXPECTED_COUNTS[name]
    assert len({p.id for p in prompts}) == len(prompts)
    for p in prompts:
        assert p.suite == name and p.id.startswith(f"{name}/")
        assert p.text.strip() and p.category
    train, evals = load_suite(name, "train"), load_suite(name, "eval")
    assert len(train) + len(evals) == len(prompts)
    assert all(split_of(p.text) == "eval" for p in evals)


def test_load_suite_returns_fresh_lists():
    a = load_suite("alpaca")
    a.clear()
    assert len(load_suite("alpaca")) == 80


def test_spec_bench_first_turn_and_categories():
    prompts = load_suite("spec_bench")
    assert {p.category for p in prompts} == SPEC_BENCH_CATEGORIES
    first = next(p for p in prompts if p.id == "spec_bench/81")
    assert first.category == "writing"
    assert "Rewrite your previous response" not in first.text  # the second turn is dropped


def test_mmlu_prompt_and_extra():
    p = load_suite("mmlu")[0]
    assert p.text.startswith("The following is a multiple choice question about abstract algebra.\n\n")
    assert p.text.endswith("Answer with the letter of the correct option.")
    assert len(p.extra["choices"]) == 4 and p.extra["answer"] in range(4)
    assert f"\nA. {p.extra['choices'][0]}\n" in p.text
    assert len({q.category for q in load_suite("mmlu")}) == 57


def test_summarisation_templates():
    assert load_suite("cnn_dm")[0].text.startswith("Summarize the following news article in a few sentences.\n\n")
    assert load_suite("xsum")[0].text.startswith("Summarize the following article in one sentence.\n\n")


def test_prompt_is_frozen_hashable_and_picklable():
    p = load_suite("mmlu")[0]
    assert {p: 1}[p] == 1
    assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(AttributeError):
        p.text = "x"
    with pytest.raises(TypeError):
        p.extra["answer"] = 0
    q = Prompt("user/1", "user", "user", "hi", {"a": [1, 2]})
    assert q.extra["a"] == (1, 2) and hash(q) == hash(Prompt("user/1", "user", "user", "hi"))
    assert p.split == split_of(p.text)


def test_train_and_eval_disjoint_across_all_suites():
    train = {norm(p.text) for p in load_prompts("all", "train")}
    evals = {norm(p.text) for p in load_prompts("all", "eval")}
    assert train and evals and not (train & evals)
    # the 3 GSM8K problems shared by spec_bench and gsm8k are the reason this matters
    gsm = {norm(p.text) for p in load_suite("gsm8k")}
    assert len(gsm & {norm(p.text) for p in load_suite("spec_bench")}) == 3


def test_split_of_deterministic_whitespace_insensitive_and_fraction():
    texts = [p.text for p in load_prompts("all", "all")]
    assert len(texts) == sum(EXPECTED_COUNTS.values())
    splits = [split_of(t) for t in texts]
    assert splits == [split_of(t) for t in texts]
    assert set(splits) == set(SPLITS)
    assert abs(splits.count("eval") / len(splits) - EVAL_FRACTION) <= 0.05
    t = texts[0]
    assert split_of("  " + t.replace(" ", " \n ") + "\n") == split_of(t)


def test_load_prompts_limit_covers_all_categories():
    prompts = load_prompts("spec_bench", "eval", limit=13)
    assert len(prompts) == 13
    assert {p.category for p in prompts} == SPEC_BENCH_CATEGORIES
    assert prompts == load_prompts(["spec_bench"], "eval", limit=13)  # deterministic
    assert set(prompts) <= set(load_prompts("spec_bench", "eval", limit=40))


def test_load_prompts_all_and_lists():
    everything = load_prompts("all", "eval")
    assert [p.suite for p in everything] == sorted((p.suite for p in everything), key=SUITES.index)
    assert len(everything) == sum(len(load_suite(n, "eval")) for n in SUITES)
    assert {p.suite for p in load_prompts("all", "eval", limit=9)} == set(SUITES)
    two = load_prompts("gsm8k, alpaca", "train")
    assert two == load_suite("gsm8k", "train") + load_suite("alpaca", "train")
    assert load_prompts(["gsm8k", "gsm8k"], "all") == load_suite("gsm8k")
    assert len(load_prompts("humaneval", "all", limit=1000)) == 80


@pytest.mark.parametrize(
    "call, needle",
    [
        (lambda: load_suite("nope"), "unknown suite 'nope'"),
        (lambda: load_prompts("spec_bench,nope"), "unknown suite 'nope'"),
        (lambda: load_suite("mmlu", "test"), "unknown split 'test'"),
        (lambda: load_prompts("mmlu", "dev"), "unknown split 'dev'"),
        (lambda: load_prompts("mmlu", limit=0), "limit must be a positive integer"),
        (lambda: load_prompts(""), "no suite given"),
    ],
)
def test_bad_arguments(call, needle):
    with pytest.raises(DraftwiseError, match=needle) as e:
        call()
    assert "\n" not in str(e.value)


def test_unknown_suite_lists_valid_names():
    with pytest.raises(DraftwiseError) as e:
        load_suite("specbench")
    assert all(name in str(e.value) for name in SUITES)


def test_read_prompt_file_jsonl_prompt(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "Hello there"})
        + "\n\n"
        + json.dumps({"prompt": "Line\u2028sep", "id": "q7", "category": "chat"})
        + "\n",
        encoding="utf-8",
    )
    a, b = read_prompt_file(f)
    assert (a.id, a.suite, a.category, a.text) == ("user/1", "user", "user", "Hello there")
    assert (b.id, b.category, b.text) == ("user/q7", "chat", "Line\u2028sep")
    assert a.extra == {} and read_prompt_file(_one(tmp_path, {"prompt": "x", "max_tokens": 7}))[0].extra == {
        "max_tokens": 7
    }


def test_read_prompt_file_an_openai_request_log(tmp_path):
    """Chat requests as an OpenAI log holds them: the messages' contents make the prompt; max_tokens and temperature
    are the request's own."""
    f = tmp_path / "log.jsonl"
    lines = [
        {
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
            "max_tokens": 400,
        },
        {"messages": [{"role": "user", "content": "Why?"}], "temperature": 0.7},
        {"prompt": "def f(", "temperature": 0},
    ]
    f.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    a, b, c = read_prompt_file(f)
    assert a.text == "Be brief.\n\nHi" and a.extra == {"max_tokens": 400}
    assert b.extra == {"temperature": 0.7} and c.extra == {"temperature": 0.0}


def _one(tmp_path, record: dict):
    f = tmp_path / "one.jsonl"
    f.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return f


def test_read_prompt_file_jsonl_turns(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"turns": ["first", "second"], "category": "x"}) + "\r\n", encoding="utf-8")
    (p,) = read_prompt_file(str(f))
    assert (p.id, p.category, p.text) == ("user/1", "x", "first")


def test_read_prompt_file_plain_text(tmp_path):
    f = tmp_path / "prompts.txt"
    f.write_text("What is 2+2?\n\n   \nTell me a joke.  \n", encoding="utf-8")
    prompts = read_prompt_file(f)
    assert [(p.id, p.text, p.category) for p in prompts] == [
        ("user/1", "What is 2+2?", "user"),
        ("user/4", "Tell me a joke.", "user"),
    ]


@pytest.mark.parametrize(
    "name, content, needle",
    [
        ("e.txt", "\n  \n", "prompt file has no prompts: {path}"),
        ("e.jsonl", "", "prompt file has no prompts: {path}"),
        ("bad.jsonl", '{"prompt": "ok"}\n{"prompt": oops}\n', "{path} line 2: not valid JSON"),
        (
            "none.jsonl",
            '{"prompt": "ok"}\n\n{"text": "x"}\n',
            "{path} line 3: has none of `prompt`, `turns` or `messages`",
        ),
        ("empty.jsonl", '{"prompt": "   "}\n', "{path} line 1: empty prompt"),
        ("emptyturn.jsonl", '{"turns": [""]}\n', "{path} line 1: empty prompt"),
        ("turns.jsonl", '{"turns": []}\n', "{path} line 1: `turns` must be"),
        ("list.jsonl", '["a"]\n', "{path} line 1: expected a JSON object"),
        ("dup.jsonl", '{"prompt": "a", "id": 1}\n{"prompt": "b", "id": 1}\n', "{path} line 2: duplicate id"),
        ("len.jsonl", '{"prompt": "a", "max_tokens": 0}\n', "{path} line 1: `max_tokens` must be a positive integer"),
        ("lenf.jsonl", '{"prompt": "a", "max_tokens": 2.5}\n', "{path} line 1: `max_tokens` must be a positive"),
        ("temp.jsonl", '{"prompt": "a"}\n{"prompt": "b", "temperature": -1}\n', "{path} line 2: `temperature` must"),
        ("temps.jsonl", '{"prompt": "a", "temperature": "1"}\n', "{path} line 1: `temperature` must be a number"),
        ("hot.jsonl", '{"prompt": "a", "temperature": 2.5}\n', "{path} line 1: `temperature` must be a number"),
        ("msgs.jsonl", '{"messages": []}\n', "{path} line 1: `messages` must be a non-empty list"),
        ("msg.jsonl", '\n{"messages": [{"role": "user"}]}\n', "{path} line 2: message 0 must be an object"),
    ],
)
def test_read_prompt_file_bad_input(tmp_path, name, content, needle):
    f = tmp_path / name
    f.write_text(content, encoding="utf-8")
    with pytest.raises(DraftwiseError) as e:
        read_prompt_file(f)
    assert needle.format(path=f) in str(e.value)
    assert "\n" not in str(e.value)


def test_read_prompt_file_missing(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DraftwiseError, match="prompt file not found") as e:
        read_prompt_file(missing)
    assert str(missing) in str(e.value)


def test_a_limit_of_a_users_file_spreads_over_its_categories():
    """A traffic grouped by category (the packaged code-chat: 8 code requests, then 8 chat): a limit of 6 holds 3 of
    each, in file order; a file of one category gives its first prompts; the packaged traffic reads by name."""
    prompts = read_prompt_file("code-chat")
    assert [p.category for p in prompts] == ["code"] * 8 + ["chat"] * 8
    six = spread(prompts, 6)
    assert [p.category for p in six] == ["code"] * 3 + ["chat"] * 3 and six == [p for p in prompts if p in six]
    assert set(spread(prompts, 4)) <= set(six) and spread(prompts, None) == prompts
    one = [replace(p, category="user") for p in prompts]
    assert spread(one, 5) == one[:5]
    assert {p.extra["temperature"] for p in six if p.category == "chat"} == {1.0}
