import dataclasses
import json

import pytest

from draftwise.config import BenchConfig
from draftwise.errors import DraftwiseError
from draftwise.rundir import RunDir


def test_a_folder_from_before_a_new_field_still_resumes(tmp_path):
    RunDir(tmp_path, BenchConfig(gamma=3)).append({"x": 1})
    saved = json.loads((tmp_path / "config.json").read_text())
    del saved["warmup"]  # as if written by a version without this field (its default is unchanged)
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert RunDir(tmp_path, BenchConfig(gamma=3)).records() == [{"x": 1}]
    with pytest.raises(DraftwiseError, match="different config .*warmup"):
        RunDir(tmp_path, BenchConfig(gamma=3, warmup=5))
    with pytest.raises(DraftwiseError, match="different config .*gamma"):
        RunDir(tmp_path, BenchConfig(gamma=4))


def test_a_cut_last_line_is_dropped_and_redone(tmp_path):
    run = RunDir(tmp_path, BenchConfig())
    run.append({"a": 1})
    with open(run.records_path, "a") as f:
        f.write('{"b": ')
    assert RunDir(tmp_path, BenchConfig()).records() == [{"a": 1}]


def test_a_corrupt_line_inside_the_records_is_refused_in_one_line(tmp_path):
    run = RunDir(tmp_path / "r", BenchConfig(target="x"))
    for i in range(3):
        run.append({"i": i})
    lines = run.records_path.read_text().splitlines()
    run.records_path.write_text("\n".join([lines[0], "{not json", lines[2]]) + "\n")
    with pytest.raises(DraftwiseError, match=r"line 2 is not a JSON record"):
        RunDir(tmp_path / "r", BenchConfig(target="x")).records()


def test_an_out_that_is_a_file_or_lies_under_one_is_refused_in_one_line(tmp_path):
    file = tmp_path / "notes.txt"
    file.write_text("x")
    with pytest.raises(DraftwiseError, match=r"notes.txt: is a file, not a run folder"):
        RunDir(file, BenchConfig())
    with pytest.raises(DraftwiseError, match=r"notes.txt/run: .*notes.txt is a file, not a folder"):
        RunDir(file / "run", BenchConfig())
    assert file.read_text() == "x"


def test_the_cli_refuses_a_file_as_out_in_one_line(tmp_path, capsys):
    from draftwise.cli import main

    file = tmp_path / "notes.txt"
    file.write_text("x")
    assert main(["bench", "--target", "default", "--drafter", "ngram", "--limit", "1", "--out", str(file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"draftwise: error: --out {file}: is a file, not a run folder"


def test_a_folder_of_another_stage_or_tool_is_refused_in_one_line(tmp_path):
    from draftwise.config import SweepConfig

    RunDir(tmp_path / "sweep", SweepConfig())
    with pytest.raises(DraftwiseError, match="holds a SweepConfig run, not a BenchConfig one: use another --out"):
        RunDir(tmp_path / "sweep", BenchConfig())
    for name, text in [("model", json.dumps({"architectures": ["LlamaForCausalLM"]})), ("torn", "{not json")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(text)
        with pytest.raises(DraftwiseError, match="config.json is not a draftwise run's config: use another --out"):
            RunDir(tmp_path / name, BenchConfig())
        assert (tmp_path / name / "config.json").read_text() == text


def test_a_design_folder_saved_before_engines_became_rows_still_resumes(tmp_path):
    from draftwise.config import DesignConfig, to_dict

    old = to_dict(DesignConfig(rows=("lean",)))
    old["engines"] = old.pop("rows")  # config.json as an older version wrote it
    (tmp_path / "config.json").write_text(json.dumps(old))
    RunDir(tmp_path, DesignConfig(rows=("lean",)))  # the same config under its new name: no "different config"
    with pytest.raises(DraftwiseError, match="rows differ"):
        RunDir(tmp_path, DesignConfig(rows=("lean", "llama.cpp")))
    assert "engines" not in [f.name for f in dataclasses.fields(DesignConfig)]
