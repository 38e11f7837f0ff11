import json
import math

import pytest

from draftwise.cli import main
from draftwise.config import QualityConfig
from draftwise.continuations import prompts_for
from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load
from draftwise.stages import quality

SMALL = dict(suites="spec_bench", limit=4, max_prompt_tokens=64, threads=2)


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def test_the_tiny_tokenizer_yields_eval_prompts(tiny_dir):
    prompts = prompts_for(load(tiny_dir), "eval", "spec_bench", 64, 4)
    assert len(prompts) == 4 and all(1 < len(ids) <= 64 for _, ids in prompts)


def test_fp32_against_itself_agrees_everywhere_and_resumes(tiny_dir, tmp_path):
    config = QualityConfig(target=tiny_dir, runtimes=("lean:fp32",), **SMALL)
    out = quality.run(config, tmp_path / "q")
    summary = json.loads((out / "quality.json").read_text())
    s = summary["lean:fp32"]
    assert s["agreement"] == 1.0 and s["nll_delta"] == 0.0 and s["prompts"] == 4
    assert s["nll"] == summary["reference"]["nll"] and math.isfinite(s["nll"]) and s["nll"] > 0
    assert s["positions"] == sum(r["positions"] for r in records(out))
    assert "top-1 agreement with fp32 1.000" in quality.sentence(summary, "lean:fp32")
    assert "on 4 eval prompts" in quality.sentence(summary, "lean:fp32")
    before = (out / "records.jsonl").read_text()
    quality.run(config, out)  # resume: everything is recorded, nothing is added
    assert (out / "records.jsonl").read_text() == before


def test_lossy_runtimes_cost_something_but_not_everything(tiny_dir, tmp_path):
    out = quality.run(QualityConfig(target=tiny_dir, runtimes=("lean:int8",), **SMALL), tmp_path / "q")
    s = json.loads((out / "quality.json").read_text())["lean:int8"]
    assert 0.5 <= s["agreement"] <= 1 and math.isfinite(s["nll"]) and math.isfinite(s["nll_delta"])
    assert {r["runtime"] for r in records(out)} == {"lean:int8"} and len(records(out)) == 4


def test_an_f32_gguf_on_llama_cpp_agrees_with_fp32(tiny_dir, tmp_path):
    pytest.importorskip("llama_cpp")
    out = quality.run(QualityConfig(target=tiny_dir, runtimes=("llama.cpp:f32",), **SMALL), tmp_path / "q")
    s = json.loads((out / "quality.json").read_text())["llama.cpp:f32"]
    assert s["agreement"] >= 0.95 and abs(s["nll_delta"]) < 0.05


def test_lean_q4_at_8_bit_activations_keeps_its_verdict_for_the_file(tmp_path):
    """`lean:q4-a8` runs the file's q4 model at 8-bit activations per block, and its measurement, kept for that file,
    decides the bits of its later loads: per block where it kept the bar, 16 where it did not."""
    from conftest import small_gguf
    from draftwise.runtimes.lean.activations import bits_of, keeps_bar, kept

    target = small_gguf(tmp_path, "q4_1")  # a file of its own: its verdict is no other test's
    out = quality.run(QualityConfig(target=target, runtimes=("lean:q4", "lean:q4-a8"), **SMALL), tmp_path / "q")
    summary = json.loads((out / "quality.json").read_text())
    at16, at8 = summary["lean:q4"], summary["lean:q4-a8"]
    assert at16["agreement"] != at8["agreement"] or at16["nll"] != at8["nll"]  # two precisions were run
    passed = keeps_bar(at8["agreement"], at8["nll_delta"])
    assert kept(target) == (8 if passed else 16) and list(summary["activations_kept"]) == ["lean:q4-a8"]
    assert ("keep the bar" if passed else "miss the bar") in summary["activations_kept"]["lean:q4-a8"]
    assert bits_of(load(target, ModelOptions(dtype="q4")).lm) == kept(target)


@pytest.mark.parametrize(
    "runtimes", [("lean:int4",), ("lean:q4-a4",), ("llama.cpp:q4_0",), ("vllm",), ("lean:int8", "lean:int8"), ()]
)
def test_bad_runtimes_are_refused_in_one_line(runtimes):
    with pytest.raises(DraftwiseError) as e:
        QualityConfig(runtimes=runtimes)
    assert "\n" not in str(e.value)
    if runtimes and runtimes[0] != "lean:int8":
        assert "unknown runtime" in str(e.value) and "lean:" in str(e.value) and "llama.cpp:" in str(e.value)


def test_parse_runtime():
    label, options, spec = quality.parse_runtime("lean:q4-a8", "x.gguf")  # q4; its bits are set after the load
    assert (label, options.dtype, options.backend) == ("lean:q4-a8", "q4", "lean")
    label, options, spec = quality.parse_runtime("lean:int8", "/some/dir")
    assert (label, options.dtype, options.backend, spec) == ("lean:int8", "int8", "lean", "/some/dir")
    label, options, spec = quality.parse_runtime("llama.cpp:q8_0", "/some/dir")  # an HF dir: load writes it at q8_0
    assert (options.backend, options.gguf_quant, spec) == ("llama.cpp", "q8_0", "/some/dir")


def test_cli_runs_quality(capsys, tiny_dir, tmp_path):
    code = main(
        [
            "quality",
            "--target",
            tiny_dir,
            "--runtimes",
            "lean:fp32,lean:int8",
            "--suites",
            "spec_bench",
            "--limit",
            "3",
            "--max-prompt-tokens",
            "64",
            "--threads",
            "2",
            "--out",
            str(tmp_path / "q"),
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "lean:int8" in captured.out and "ΔNLL" in captured.out
    summary = json.loads((tmp_path / "q" / "quality.json").read_text())
    assert summary["lean:fp32"]["agreement"] == 1.0 and summary["lean:int8"]["prompts"] == 3
    assert main(["quality", "--target", tiny_dir, "--runtimes", "lean:int3", "--out", str(tmp_path / "r")]) == 2
    assert "unknown runtime 'lean:int3'" in capsys.readouterr().err
