import json

import pytest

from draftwise.config import BenchConfig, BenchGridConfig, from_dict, to_dict
from draftwise.errors import DraftwiseError
from draftwise.stages import bench_grid


def grid(tiny_dir, **kw):
    base = BenchConfig(
        target=tiny_dir, drafter="layers:0", suite="spec_bench", limit=3, max_new_tokens=8, baselines=("ar",), warmup=0
    )
    return BenchGridConfig(
        **{"bench": base, "drafters": ("layers:0", "layers:0,2"), "gammas": (1, 2), "temperatures": (0.0, 1.0), **kw}
    )


def test_grid_points_share_baselines_and_roundtrip(tiny_dir):
    g = grid(tiny_dir, batch_sizes=(1, 2))
    points = g.points()
    sd = [p for p in points if p.drafter]
    ar = [p for p in points if not p.drafter]
    assert len(sd) == 2 * 2 * 2 * 2 and len(ar) == 2 * 2  # AR once per (temperature, batch size)
    assert all(p.baselines == () for p in sd) and all(p.baselines == ("ar",) for p in ar)
    assert from_dict(BenchGridConfig, json.loads(json.dumps(to_dict(g)))) == g  # config.json reads back


def test_grid_records_resume_and_summary(tiny_dir, tmp_path):
    g = grid(tiny_dir)
    out = bench_grid.run(g, tmp_path / "g")
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == (2 * 2 * 2 + 2) * 3  # (SD points + AR per temperature) × 3 prompts
    (out / "records.jsonl").write_text("\n".join(lines[:5]) + "\n")  # killed after 5 records
    bench_grid.run(g, out)
    again = (out / "records.jsonl").read_text().splitlines()
    assert again[:5] == lines[:5] and len(again) == len(lines)
    summary = json.loads((out / "grid.json").read_text())
    assert len(summary["points"]) == 8
    greedy = [p for p in summary["points"] if p["temperature"] == 0]
    assert all(p["greedy_identical_to_ar"] == 1.0 for p in greedy)  # lossless at every point
    assert all(p["speedup_vs_ar"] > 0 for p in summary["points"])


def test_grid_runs_transformers_baselines_at_batch_1_only(tiny_dir):
    base = BenchConfig(target=tiny_dir, drafter="layers:0", baselines=("ar", "hf-generate", "hf-assisted"))
    points = grid(tiny_dir, bench=base, gammas=(1,), temperatures=(0.0,), batch_sizes=(1, 2)).points()
    assert {(p.drafter, p.batch_size, p.baselines) for p in points} == {
        ("layers:0", 1, ("hf-assisted",)),
        ("layers:0,2", 1, ("hf-assisted",)),
        ("layers:0", 2, ()),
        ("layers:0,2", 2, ()),
        (None, 1, ("ar", "hf-generate")),
        (None, 2, ("ar",)),
    }


def test_grid_refuses_impossible_points(tiny_dir):
    with pytest.raises(DraftwiseError, match="batch_size > 1"):
        grid(tiny_dir, batch_sizes=(2,), bench=BenchConfig(target=tiny_dir, drafter="layers:0", draft_stop=0.3))
    with pytest.raises(DraftwiseError, match="gammas"):
        grid(tiny_dir, gammas=(0,))


def test_each_drafter_at_its_own_gamma_with_per_suite_figures(tiny_dir, tmp_path, capsys):
    from draftwise.cli import main

    code = main(
        [
            "bench",
            "--target",
            tiny_dir,
            "--drafter",
            "layers:0@2",
            "--drafter",
            "ngram:max=2@5",
            "--suite",
            "spec_bench,arena",
            "--limit",
            "4",
            "--max-new-tokens",
            "8",
            "--warmup",
            "0",
            "--out",
            str(tmp_path / "g"),
        ]
    )
    assert code == 0
    config = json.loads((tmp_path / "g" / "config.json").read_text())
    assert config["drafters"] == ["layers:0", "ngram:max=2"] and config["drafter_gammas"] == [2, 5]
    points = json.loads((tmp_path / "g" / "grid.json").read_text())["points"]
    assert {(p["drafter"], p["gamma"]) for p in points} == {("layers:0", 2), ("ngram:max=2", 5)}
    records = [json.loads(line) for line in (tmp_path / "g" / "records.jsonl").read_text().splitlines()]
    for p in points:  # per suite: the drafter's tokens/s over AR's on the same prompts
        for suite, v in p["by_suite"].items():
            sd = [r for r in records if r["drafter"] == p["drafter"] and r["suite"] == suite]
            ar = [r for r in records if r["method"] == "ar" and r["suite"] == suite]
            speed = lambda rs: sum(r["new_tokens"] for r in rs) / sum(r["seconds"] for r in rs)  # noqa: E731
            assert v["speedup_vs_ar"] == pytest.approx(speed(sd) / speed(ar)) and v["prompts"] == len(sd)
        assert set(p["by_suite"]) == {"spec_bench", "arena"}
    assert "TAR / SD over AR per suite" in capsys.readouterr().out
    with pytest.raises(DraftwiseError, match="one γ per drafter"):
        BenchGridConfig(
            bench=BenchConfig(target=tiny_dir, drafter="layers:0"), drafters=("layers:0",), drafter_gammas=(1, 2)
        )
    assert (
        main(
            [
                "bench",
                "--target",
                tiny_dir,
                "--drafter",
                "layers:0@2",
                "--drafter",
                "ngram",
                "--limit",
                "1",
                "--out",
                str(tmp_path / "h"),
            ]
        )
        == 2
    )


def test_only_the_drafters_a_grid_names_run_the_scheduler(tiny_dir, tmp_path):
    bench = BenchConfig(
        target=tiny_dir,
        drafter="ngram",
        baselines=("ar",),
        schedule=str(tmp_path / "profile"),
        calibration=str(tmp_path / "cal"),
    )
    grid = BenchGridConfig(bench=bench, drafters=("ngram", "layers:0"), drafter_gammas=(4, 2), scheduled=("ngram",))
    sd = {p.drafter: p for p in grid.points() if p.drafter}
    assert (sd["ngram"].schedule, sd["ngram"].calibration) == (bench.schedule, bench.calibration)
    assert sd["layers:0"].schedule is None and sd["layers:0"].calibration is None
    assert all(p.schedule is None for p in grid.points() if not p.drafter)  # baselines never schedule
    assert all(p.schedule for p in BenchGridConfig(bench=bench, drafters=("ngram", "layers:0")).points() if p.drafter)
    assert from_dict(BenchGridConfig, to_dict(grid)) == grid
    with pytest.raises(DraftwiseError, match="scheduled names drafters of the grid"):
        BenchGridConfig(bench=bench, drafters=("layers:0",), scheduled=("ngram",))
    with pytest.raises(DraftwiseError, match="needs bench.schedule"):
        BenchGridConfig(bench=BenchConfig(target=tiny_dir, drafter="ngram"), drafters=("ngram",), scheduled=("ngram",))


def test_a_drafter_is_labelled_by_its_folder_and_a_generic_one_by_its_run_too():
    """Two distillations' reduced heads in one bench are told apart in its table and progress bar."""
    assert bench_grid.label("runs/a/distill-narrow/reduced") == "distill-narrow/reduced"
    assert bench_grid.label("runs/a/distill-wide/reduced/", width=64) == "distill-wide/reduced"
    assert bench_grid.label("runs/a/prune-cut") == "prune-cut"
    assert bench_grid.label("ngram:min=2,max=4") == "ngram:min=2,max=4"
    assert bench_grid.label("suffix:runs/x/suffix-index,factor=2") == "suffix:suffix-index,factor=2"


def test_a_prompt_files_requests_are_each_decoded_at_their_own_temperature(tiny_dir, tmp_path, capsys):
    """`bench --prompts FILE` without `--temperature`: a point per temperature the file's lines set (a line without
    one at the OpenAI default, 1), each decoding only its own lines; `--temperature` decodes every line at it, and a
    file that sets none keeps `--temperature`'s default."""
    from draftwise.cli import main

    traffic = tmp_path / "traffic.jsonl"
    lines = [{"prompt": "w1 w2 w3", "temperature": 0}, {"prompt": "w4 w5", "temperature": 1}, {"prompt": "w6 w7"}]
    traffic.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["bench", "--target", tiny_dir, "--drafter", "layers:0", "--max-new-tokens", "4", "--warmup", "0"]
    assert main([*args, "--prompts", str(traffic), "--out", str(tmp_path / "own")]) == 0
    assert "at its own temperature: T = 0, 1" in capsys.readouterr().err
    records = [json.loads(x) for x in (tmp_path / "own" / "records.jsonl").read_text().splitlines()]

    def ids(method: str, t: float) -> list[str]:
        return sorted(r["prompt_id"] for r in records if r["method"] == method and r["temperature"] == t)

    assert ids("sd", 0.0) == ids("ar", 0.0) == ["user/1"]
    assert ids("sd", 1.0) == ids("ar", 1.0) == ["user/2", "user/3"]

    assert main([*args, "--prompts", str(traffic), "--temperature", "0", "--out", str(tmp_path / "all0")]) == 0
    records = [json.loads(x) for x in (tmp_path / "all0" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 2 * 3 and all(r.get("temperature", 0.0) == 0.0 for r in records)

    bare = tmp_path / "bare.txt"
    bare.write_text("w1 w2\nw3 w4\n")
    config = bench_grid.by_request(BenchConfig(target=tiny_dir, prompts=str(bare), own_temperatures=True))
    assert isinstance(config, BenchConfig) and (config.temperature, config.own_temperatures) == (0.0, False)
