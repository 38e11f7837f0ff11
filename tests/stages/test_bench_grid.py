import json

import pytest

from draftwise.config import BenchConfig, BenchGridConfig, from_dict, to_dict
from draftwise.errors import DraftwiseError
from draftwise.stages import bench_grid


def grid(tiny_dir, **kw):
    base = BenchConfig(target=tiny_dir, drafter="layers:0", suite="spec_bench", limit=3, max_new_tokens=8,
                       baselines=("ar",), warmup=0)
    return BenchGridConfig(**{"bench": base, "drafters": ("layers:0", "layers:0,2"), "gammas": (1, 2),
                              "temperatures": (0.0, 1.0), **kw})


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
        ("layers:0", 1, ("hf-assisted",)), ("layers:0,2", 1, ("hf-assisted",)), ("layers:0", 2, ()), ("layers:0,2", 2, ()),
        (None, 1, ("ar", "hf-generate")), (None, 2, ("ar",))}


def test_grid_refuses_impossible_points(tiny_dir):
    with pytest.raises(DraftwiseError, match="batch_size > 1"):
        grid(tiny_dir, batch_sizes=(2,), bench=BenchConfig(target=tiny_dir, drafter="layers:0", draft_stop=0.3))
    with pytest.raises(DraftwiseError, match="gammas"):
        grid(tiny_dir, gammas=(0,))
