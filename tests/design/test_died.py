"""A native crash costs only its row: a stand-in llama.cpp engine that segfaults (a real SIGSEGV in native code, on
demand: `isolate.fault_point`) ends the llama.cpp row, the design finishes from the rows that ran and says why; a rerun
does not retry the row, `--retry-died` does."""

from __future__ import annotations

import json

import pytest

from draftwise import design, isolate
from draftwise.config import DesignConfig

ROW = "llama.cpp-F32"  # the tiny checkpoint's row: an f32 copy run by llama.cpp


def records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_segfaulting_engine_costs_its_row_and_the_design_finishes(tiny_dir, tmp_path, monkeypatch, capsys):
    config = DesignConfig(
        target=tiny_dir,
        minutes=0.2,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=2,
        refine_limit=2,
        headline_limit=2,
        tune_prompts=4,
        max_new_tokens=6,
        accuracy_items=2,
        draft_vocabs=(),
        adaptive=False,
        temperatures=(0.0,),
        feature_drafter=False,
        serve=False,
        threads=1,
    )
    out = tmp_path / "design"
    # every llama.cpp pass dies: in the isolated children (the environment) and, should one run here, in this process
    monkeypatch.setenv("DRAFTWISE_FAULT", "segv:llama.cpp")
    monkeypatch.setattr(isolate, "_FAULT", "segv:llama.cpp")
    design.run(config, out)
    died = [r for r in records(out) if r.get("event") == "died"]
    assert [(r["row"], r["stage"], r["signal"]) for r in died] == [(ROW, f"profile@{ROW}", "SIGSEGV")]
    assert "llama_decode" in died[0]["reason"] and "\n" not in died[0]["reason"]
    assert (out / "stages" / f"profile@{ROW}.died").is_dir() and not (out / "stages" / f"profile@{ROW}").exists()
    done = design.Pipeline(config, out).done
    assert "verdict@lean-int8" in done and f"verdict@{ROW}" not in done  # the other row ran
    assert not any(o.startswith(ROW) for o in done["fastest"]["options"])  # the answer comes from the rows that ran
    report = (out / "report.md").read_text()
    assert f"**{ROW}: not measured.**" in report and "died with SIGSEGV" in report and "## The machine" in report
    assert f"{ROW} was not measured" in capsys.readouterr().out

    design.run(config, out)  # a rerun does not retry the row that died
    assert len([r for r in records(out) if r.get("event") == "died"]) == 1

    # asked to, the row is measured (the children's engine works again) and the answer redone with it; a llama.cpp pass
    # in this process would still die: every one of them runs in a child
    monkeypatch.delenv("DRAFTWISE_FAULT")
    design.run(config, out, retry_died=True)
    done = design.Pipeline(config, out).done
    assert f"verdict@{ROW}" in done and any(o.startswith(ROW) for o in done["fastest"]["options"])
    assert (out / "stages" / "bench-fastest.superseded").is_dir()
    assert f"{ROW}: not measured" not in (out / "report.md").read_text()
