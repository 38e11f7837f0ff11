"""Each bad input gives one clear line on stderr and exit status 2."""

import pytest
import torch

from draftwise.cli import main


def run_cli(capsys, *args):
    code = main(["bench", *args])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


@pytest.mark.parametrize("args,message", [
    (["--target", "/no/such/dir"], "model not found: /no/such/dir"),
    (["--gamma", "0"], "gamma (lookahead) must be >= 1"),
    (["--baseline", "vllm"], "unknown baseline 'vllm'"),
    (["--drafter", "layers:0,99"], "the target has layers 0..3"),
])
def test_bad_arguments(capsys, tmp_path, tiny_dir, args, message):
    argv = ["--target", tiny_dir, "--drafter", "layers:0", "--out", str(tmp_path / "r"), "--limit", "1"]
    code, line = run_cli(capsys, *argv, *args)
    assert code == 2 and line.startswith("draftwise: error: ") and message in line


def test_empty_prompt_file(capsys, tmp_path, tiny_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    code, line = run_cli(capsys, "--target", tiny_dir, "--prompts", str(empty), "--out", str(tmp_path / "r"))
    assert code == 2 and "prompt file has no prompts" in line


def test_pickle_only_drafter(capsys, tmp_path, tiny_dir):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    torch.save({}, d / "pytorch_model.bin")
    code, line = run_cli(capsys, "--target", tiny_dir, "--drafter", str(d), "--out", str(tmp_path / "r"))
    assert code == 2 and "refusing pickle weights" in line


def test_cli_runs_a_bench(capsys, tmp_path, tiny_dir):
    code = main(["bench", "--target", tiny_dir, "--drafter", "layers:0,1", "--limit", "2", "--max-new-tokens", "8",
                 "--warmup", "0", "--out", str(tmp_path / "r")])
    assert code == 0
    assert "tokens/s" in capsys.readouterr().out
