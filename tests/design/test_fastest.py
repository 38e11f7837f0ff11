"""The design's answer (`fastest`): the fastest option of one interleaved grid over every runtime, stated against the
fastest plain decoding measured there — whichever engine that is — on fake grids."""

import json
import random
from types import SimpleNamespace

import pytest

from draftwise.config import BenchConfig, BenchGridConfig
from draftwise.design import fastest
from draftwise.errors import DraftwiseError

ROWS = [
    fastest.Entry("lean-fp32", None, "sd", "suffix"),
    fastest.Entry("lean-int8", None, "sd", "suffix"),
    fastest.Entry("llama.cpp-Q4_1", None, None, None),
]


def fake(tmp_path, speeds: dict[str, float], prompts: int = 12, noise: float = 0.03) -> SimpleNamespace:
    """A finished bench-fastest stage: per prompt, each '<runtime>/<method>' at its tokens/s (± noise, seeded)."""
    rng, records = random.Random(0), []
    for i in range(prompts):
        for option, speed in speeds.items():
            runtime, method = option.split("/")
            s = speed * (1 + rng.uniform(-noise, noise))
            records.append(
                {
                    "runtime": None if runtime == "lean-fp32" else runtime,
                    "method": method,
                    "drafter": "suffix:x" if method == "sd" else None,
                    "prompt_id": f"p{i}",
                    "temperature": 0.0,
                    "new_tokens": 96,
                    "seconds": 96 / s,
                }
            )
    folder = tmp_path / fastest.STAGE
    folder.mkdir()
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return SimpleNamespace(done={fastest.STAGE: {"folder": str(folder)}}, config=SimpleNamespace(seed=0))


def test_the_fastest_method_of_any_row_against_the_fastest_plain_decoding_of_any_row(tmp_path):
    p = fake(
        tmp_path,
        {
            "lean-fp32/ar": 30,
            "lean-fp32/sd": 36,
            "lean-int8/ar": 60,
            "lean-int8/sd": 90,
            "llama.cpp-Q4_1/ar": 42,
            "llama.cpp-Q4_1/llama-server": 45,
        },
    )
    f = fastest.decide_fastest(p, ROWS)
    assert f["recommend"] and f["option"] == "lean-int8/sd" and f["drafter"] == "suffix"
    assert f["fastest_plain"] == "lean-int8/ar" and f["plain_tokens_per_s"] == pytest.approx(60, rel=0.03)
    pt, lo, hi = f["speedup"]
    assert lo < pt < hi and pt == pytest.approx(1.5, rel=0.03) and lo > 1
    assert fastest.sentence(f).startswith(
        "Deploy suffix on lean-int8"
    ) and "draftwise AR on lean-int8" in fastest.sentence(f)


def test_a_method_faster_than_its_own_engine_but_not_than_llama_server_is_not_deployed(tmp_path):
    """The issue's case: lean fp32 SD at 1.19x lean AR, below llama-server's plain decoding of the shipped file."""
    p = fake(
        tmp_path,
        {
            "lean-fp32/ar": 28.5,
            "lean-fp32/sd": 34,
            "lean-int8/ar": 38,
            "lean-int8/sd": 40,
            "llama.cpp-Q4_1/ar": 42,
            "llama.cpp-Q4_1/llama-server": 43,
        },
    )
    f = fastest.decide_fastest(p, ROWS)
    assert not f["recommend"] and f["option"] == f["fastest_plain"]
    assert f["fastest_plain"] in ("llama.cpp-Q4_1/llama-server", "llama.cpp-Q4_1/ar")
    assert f["options"]["lean-fp32/sd"]["speedup"][2] < 1  # beside its own AR it looked like a win
    clause = fastest.versus(f, "lean-fp32", "sd")
    assert "Against the fastest plain decoding measured on this machine" in clause and "0.8" in clause
    assert fastest.sentence(f).startswith("Use plain decoding with ") and "llama.cpp-Q4_1" in fastest.sentence(f)


def test_a_method_within_noise_of_the_fastest_plain_decoding_is_not_deployed(tmp_path):
    p = fake(
        tmp_path,
        {
            "lean-fp32/ar": 30,
            "lean-fp32/sd": 33,
            "lean-int8/ar": 60,
            "lean-int8/sd": 61,
            "llama.cpp-Q4_1/ar": 42,
            "llama.cpp-Q4_1/llama-server": 45,
        },
        noise=0.1,
    )
    f = fastest.decide_fastest(p, ROWS)
    assert not f["recommend"] and f["option"] == f["fastest_plain"] == "lean-int8/ar"


def test_rows_run_on_their_own_runtimes_on_the_grids_prompts():
    lean = BenchConfig(target="t", drafter=None, baselines=("ar",), limit=4)
    int8 = BenchConfig(target="t", dtype="int8", drafter="ngram", gamma=3, baselines=("ar",), limit=4)
    grid = fastest.grid([fastest.Entry("lean-fp32", lean, None, None), fastest.Entry("lean-int8", int8, "sd", "ngram")])
    assert [c.dtype for c in grid.points()] == ["fp32", "int8"] and grid.runtimes() == [None, "lean-int8"]
    with pytest.raises(DraftwiseError, match="grid's prompts"):
        BenchGridConfig(bench=lean, rows=(BenchConfig(target="t", limit=5),), row_names=("x",))


def test_the_export_opens_with_the_answer_and_its_command(tmp_path):
    """SD on lean-int8 as the answer: the export README's first lines say it, with its quality and the command that
    runs it from the export folder (the suffix corpus under engines/lean-int8/, no path of this machine)."""
    from draftwise.design import export_rows

    p = fake(
        tmp_path,
        {
            "lean-fp32/ar": 30,
            "lean-fp32/sd": 36,
            "lean-int8/ar": 60,
            "lean-int8/sd": 90,
            "llama.cpp-Q4_1/ar": 42,
            "llama.cpp-Q4_1/llama-server": 45,
        },
    )
    f = fastest.decide_fastest(p, ROWS)
    corpus = tmp_path / "run" / "stages" / "suffix-index"
    corpus.mkdir(parents=True)
    v = {
        "engine": "lean-int8",
        "backend": "lean",
        "dtype": "int8",
        "quant": "INT8",
        "shipped": False,
        "recommend": True,
        "drafter": "suffix",
        "spec": f"suffix:{corpus},factor=2,min_prob=0.1",
        "kind": "lookup",
        "method": "sd",
        "gamma": 2,
        "speedup": [1.5, 1.4, 1.6],
        "tokens_per_s": 90.0,
        "ar_tokens_per_s": 60.0,
        "builtins": {},
        "best_builtin": None,
    }
    top = tmp_path / "export"
    top.mkdir()
    (top / "README.md").write_text("## The draftwise lean engine at fp32\n")
    export_rows.export_rows(
        top,
        [v],
        SimpleNamespace(target="default", threads=2),
        f,
        {"lean-int8": v},
        {"lean-int8": "agreement 0.993, ΔNLL +0.000"},
    )
    readme = (top / "README.md").read_text()
    assert readme.startswith("# What to run on this machine\n\n**Verdict:** Deploy suffix")
    assert "Its quality against fp32 (a lossy runtime): agreement 0.993" in readme
    assert (
        "`draftwise bench --target default --dtype int8 --drafter 'suffix:engines/lean-int8/suffix-corpus,factor=2,"
        "min_prob=0.1' --gamma 2`" in readme
    )
    own = (top / "engines" / "lean-int8" / "README.md").read_text()
    assert "--drafter 'suffix:suffix-corpus,factor=2,min_prob=0.1' --gamma 2" in own
    assert str(tmp_path) not in readme + own
