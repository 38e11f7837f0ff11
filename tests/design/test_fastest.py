"""The design's answer (`fastest`): the fastest option of one interleaved grid over every runtime, stated against the
fastest plain decoding measured there — whichever engine that is — on fake grids."""

import json
import random
from types import SimpleNamespace

import pytest

from draftwise.config import BenchConfig, BenchGridConfig
from draftwise.design import deploy, fastest
from draftwise.design import served as served_phase
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
                    "prefill_s": 0.1 * 96 / s,
                }
            )
    folder = tmp_path / fastest.STAGE
    folder.mkdir()
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return SimpleNamespace(
        done={fastest.STAGE: {"folder": str(folder)}},
        folder=lambda stage: tmp_path / stage,
        config=SimpleNamespace(seed=0),
    )


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
        SimpleNamespace(target="default", threads=2, dtype="fp32"),
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
    # the deploy command: draftwise serve from the row's folder (serve.json), its explicit equivalent, how to call it,
    # and the line `served` fills in with what it measured through HTTP
    how = readme.split("How (from this folder): ", 1)[1].split("\n\nEvery option", 1)[0]
    assert how.startswith("`draftwise serve --export engines/lean-int8 --threads 2`")
    assert (
        "`draftwise serve --target default --backend lean --dtype int8 --drafter "
        "suffix:engines/lean-int8/suffix-corpus,factor=2,min_prob=0.1 --gamma 2 --threads 2`" in how
    )
    assert "curl -s http://127.0.0.1:8000/v1/completions" in how and deploy.PENDING in how
    assert "Deploy (from this folder): `draftwise serve --export . --threads 2`" in own and deploy.PENDING in own
    saved = json.loads((top / "engines" / "lean-int8" / "serve.json").read_text())
    assert saved == {
        "target": "default",
        "dtype": "int8",
        "backend": "lean",
        "drafter": "suffix:{export}/suffix-corpus,factor=2,min_prob=0.1",
        "gamma": 2,
        "paths": ["drafter"],
    }
    from draftwise.config import ServeConfig
    from draftwise.config.serve import from_export

    served = from_export(ServeConfig(export=str(top / "engines" / "lean-int8"), threads=2, given=("export", "threads")))
    folder = (top / "engines" / "lean-int8").resolve()
    assert (served.target, served.dtype, served.backend, served.gamma) == ("default", "int8", "lean", 2)
    assert served.drafter == f"suffix:{folder}/suffix-corpus,factor=2,min_prob=0.1"
    for record, line in (
        ({"measured": False, "why": served_phase.LEFT_OUT}, "not measured: the time budget left it out."),
        (
            {
                "measured": True,
                "tokens_per_s": 80.0,
                "prompts": 8,
                "over_llama_server": [1.6, 1.5, 1.7],
                "llama_server": {"tokens_per_s": 50.0, "file": "model-q4_1.gguf"},
            },
            "80.0 tokens/s, 1.60× llama-server's plain decoding under the same client [95 % 1.50–1.70]",
        ),
    ):
        (top / "README.md").write_text(readme)
        served_phase.annotate(top, record)
        assert deploy.PENDING not in (top / "README.md").read_text() and line in (top / "README.md").read_text()


def test_the_serve_command_applies_to_the_draftwise_engine_only_and_fits_the_budget(tmp_path, monkeypatch):
    """An answer on llama.cpp: the README gives llama-server's command and says `draftwise serve` does not apply, and
    nothing is measured. A lean answer the budget leaves out: nothing is measured and the README says so."""
    from draftwise.config import DesignConfig
    from draftwise.design import Pipeline, export_rows

    p = fake(
        tmp_path,
        {
            "lean-fp32/ar": 30,
            "lean-fp32/sd": 31,
            "lean-int8/ar": 38,
            "lean-int8/sd": 39,
            "llama.cpp-Q4_1/ar": 42,
            "llama.cpp-Q4_1/llama-server": 60,
        },
    )
    f = fastest.decide_fastest(p, ROWS)
    assert f["option"] == "llama.cpp-Q4_1/llama-server"
    top = tmp_path / "export"
    top.mkdir()
    (top / "README.md").write_text("")
    export_rows.export_rows(top, [], SimpleNamespace(target="default", threads=2, dtype="fp32"), f, {})
    readme = (top / "README.md").read_text()
    assert "llama-server -m <the target's Q4_1 GGUF>" in readme and "`draftwise serve` does not apply" in readme
    assert deploy.PENDING not in readme
    design = Pipeline(DesignConfig(target="default", plan=False), tmp_path / "d")
    monkeypatch.setattr(served_phase, "measure_command", lambda *a: pytest.fail("measured what does not apply"))
    record = served_phase.run(design, f)
    assert not record["applies"] and not record["measured"] and served_phase.command(design, f) is None
    lean = {**f, "runtime": "lean-int8", "method": "ar", "recommend": False, "tokens_per_s": 38.0}
    assert served_phase.deploy.join(served_phase.command(design, lean)) == (
        "draftwise serve --target default --dtype int8"
    )
    later = Pipeline(DesignConfig(target="default", plan=False), tmp_path / "e")
    monkeypatch.setattr(later, "dropped", lambda name: name == "serve")
    (later.path / "export").mkdir()
    (later.path / "export" / "README.md").write_text(f"How: ...\n\n{deploy.PENDING}\n")
    record = served_phase.run(later, lean)
    assert record["applies"] and not record["measured"] and record["why"] == served_phase.LEFT_OUT
    assert "not measured: the time budget left it out." in (later.path / "export" / "README.md").read_text()


def phased(tmp_path, options: dict[str, tuple[float, float]], answer: int, temps=(0.0,), prompts: int = 12):
    """A bench-fastest stage whose options have a time to first token (s) and a decode speed (tokens/s) each, every
    request answered with `answer` tokens, at each of `temps` (± 2 % noise, seeded)."""
    rng, records = random.Random(1), []
    for t in temps:
        for i in range(prompts):
            for option, (ttft, decode) in options.items():
                runtime, method = option.split("/")
                ttft, decode = ttft * (1 + rng.uniform(-0.02, 0.02)), decode * (1 + rng.uniform(-0.02, 0.02))
                records.append(
                    {
                        "runtime": None if runtime == "lean-fp32" else runtime,
                        "method": method,
                        "prompt_id": f"p{i}",
                        "temperature": t,
                        "new_tokens": answer,
                        "seconds": ttft + answer / decode,
                        "prefill_s": ttft,
                    }
                )
    folder = tmp_path / fastest.STAGE
    folder.mkdir(parents=True)
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return SimpleNamespace(folder=lambda stage: tmp_path / stage, config=SimpleNamespace(seed=0))


# the issue's chat traffic at T = 1: draftwise SD wins the prefill, llama-server plain the decode
ISSUE = {
    "lean-fp32/ar": (0.25, 60.0),
    "lean-int8/ar": (0.20, 79.2),
    "lean-int8/sd": (0.21, 82.3),
    "llama.cpp-Q4_1/ar": (0.45, 90.0),
    "llama.cpp-Q4_1/llama-server": (0.49, 96.0),
}


def test_short_answers_go_to_the_faster_prefill_and_the_crossover_is_stated(tmp_path):
    f = fastest.decide_fastest(phased(tmp_path, ISSUE, answer=96), ROWS)
    assert f["recommend"] and f["option"] == "lean-int8/sd"
    o = f["options"]["lean-int8/sd"]
    assert o["ttft_s"] == pytest.approx(0.21, rel=0.03) and o["decode_tokens_per_s"] == pytest.approx(82.3, rel=0.03)
    assert o["request_s"] == pytest.approx(0.21 + 96 / 82.3, rel=0.03)
    # equal request times where 0.21 + L / 82.3 = 0.49 + L / 96: L = 0.28 / (1/82.3 - 1/96) = 161 tokens
    assert f["crossovers"]["llama.cpp-Q4_1/llama-server"] == pytest.approx(161, rel=0.15)
    assert "beyond ~1" in fastest.sentence(f) and "llama-server plain decoding on llama.cpp-Q4_1 would be faster" in (
        fastest.sentence(f)
    )


def test_long_answers_go_to_the_faster_decoder(tmp_path):
    """400 new tokens at T = 1: llama-server plain finishes a request first, so the verdict says to run it."""
    f = fastest.decide_fastest(phased(tmp_path, ISSUE, answer=400, temps=(1.0,)), ROWS)
    assert not f["recommend"] and f["option"] == f["fastest_plain"] == "llama.cpp-Q4_1/llama-server"
    assert fastest.sentence(f).startswith("Use plain decoding with llama-server plain decoding on llama.cpp-Q4_1")
    assert f["options"]["lean-int8/sd"]["speedup"][2] < 1


def test_the_verdict_per_temperature_where_they_differ(tmp_path):
    """Traffic at T = 0 and 1 where SD pays at T = 0 only (its decode 140 tokens/s there, 70 at T = 1): each
    temperature's verdict is its own, the sentence names the one that differs from the whole, and the whole counts
    only the traffic's requests."""
    phased(tmp_path / "t1", {**ISSUE, "lean-int8/sd": (0.21, 70.0)}, answer=96, temps=(1.0,))
    phased(tmp_path / "t0", {**ISSUE, "lean-int8/sd": (0.21, 140.0)}, answer=96, temps=(0.0,))
    both = [tmp_path / t / fastest.STAGE / "records.jsonl" for t in ("t0", "t1")]
    (tmp_path / fastest.STAGE).mkdir()
    (tmp_path / fastest.STAGE / "records.jsonl").write_text("".join(x.read_text() for x in both))
    p = SimpleNamespace(folder=lambda stage: tmp_path / stage, config=SimpleNamespace(seed=0))
    f = fastest.decide_fastest(p, ROWS)
    assert f["temperatures"]["0"]["option"] == "lean-int8/sd" and f["temperatures"]["0"]["recommend"]
    assert f["temperatures"]["1"]["option"] == "lean-int8/ar" and not f["temperatures"]["1"]["recommend"]
    assert f["prompts"] == 24  # 12 prompts at each temperature
    only_t1 = fastest.decide_fastest(p, ROWS, wanted={(1.0, f"p{i}") for i in range(12)})
    assert only_t1["option"] == "lean-int8/ar" and only_t1["prompts"] == 12
    assert f["option"] == "lean-int8/sd"  # over both: 0.90 + 1.58 s a request pair against AR's 1.41 + 1.41
    assert "At T = 1 alone the answer is draftwise AR on lean-int8" in fastest.sentence(f)
    # deployed as measured: the row's method at T = 0, its plain decoding at T = 1, one server for the mix
    assert fastest.gammas_by_temperature(f, "lean-int8", 3) == "0:3,1:0"
    assert fastest.gammas_by_temperature(f, "lean-fp32", 3) is None  # no method measured on it
    assert fastest.gammas_by_temperature(only_t1, "lean-int8", 3) is None  # one temperature: --gamma serves it
    saved = deploy.options(
        "default", "int8", "ngram", 3, False, "lean", fastest.gammas_by_temperature(f, "lean-int8", 3)
    )
    assert saved["gamma_by_temperature"] == "0:3,1:0"
    assert "--gamma-by-temperature 0:3,1:0" in deploy.join(deploy.explicit(saved, ".", 2))
    assert "gamma_by_temperature" not in deploy.options("default", "int8", None, 3, False, "lean", "0:3,1:0")


def test_the_served_figure_is_of_the_traffics_own_temperatures(tmp_path):
    """With a traffic file the served command is measured at each request's own temperature: one prompt file per
    temperature, the requests as the traffic holds them."""
    from draftwise.config import DesignConfig
    from draftwise.data import read_prompt_file
    from draftwise.design import Pipeline

    design = Pipeline(DesignConfig(target="default", prompts="code-chat", plan=False, headline_limit=6), tmp_path / "d")
    by = served_phase.by_temperature(design)
    assert sorted(by) == [0.0, 1.0] and sum(map(len, by.values())) == 6
    assert {x.category for x in by[0.0]} == {"code"} and {x.category for x in by[1.0]} == {"chat"}
    path = served_phase.write_prompts(tmp_path, by[1.0])
    again = read_prompt_file(path)
    assert [x.id for x in again] == [x.id for x in by[1.0]] and {x.extra["temperature"] for x in again} == {1.0}
    assert "each at its own temperature" in served_phase.what(design)


def test_every_row_runs_at_every_temperature_of_the_traffic():
    lean = BenchConfig(target="t", drafter=None, baselines=("ar",), limit=4)
    int8 = BenchConfig(target="t", dtype="int8", drafter="ngram", gamma=3, baselines=("ar",), limit=4)
    entries = [fastest.Entry("lean-fp32", lean, None, None), fastest.Entry("lean-int8", int8, "sd", "ngram")]
    grid = fastest.grid(entries, (0.0, 1.0))
    assert [(c.dtype, c.temperature) for c in grid.points()] == [
        ("fp32", 0.0),
        ("fp32", 1.0),
        ("int8", 0.0),
        ("int8", 1.0),
    ]
    assert grid.runtimes() == [None, None, "lean-int8", "lean-int8"]
