"""Runtimes as plug-ins: a new runtime is one module (`recompute_runtime.py`) that registers itself, and `bench` then
runs on it end to end — loading target and drafter, the SD loop and AR, the machine stamp — with no stage naming it."""

from __future__ import annotations

import importlib
import json

import pytest

from draftwise.config import BenchConfig
from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import RUNTIMES, load
from draftwise.stages import bench


@pytest.fixture
def recompute():
    saved = dict(RUNTIMES)
    yield importlib.reload(importlib.import_module("recompute_runtime"))
    RUNTIMES.clear()
    RUNTIMES.update(saved)


def test_an_unregistered_backend_is_one_line():
    with pytest.raises(DraftwiseError, match="unknown backend 'recompute'"):
        load("default", ModelOptions(backend="recompute"))


def test_a_registered_runtime_runs_bench_end_to_end(recompute, tiny_dir, tiny_drafter_dir, tmp_path):
    common = dict(target=tiny_dir, drafter=tiny_drafter_dir, gamma=3, suite="spec_bench", limit=2, warmup=0)
    common.update(max_new_tokens=10, baselines=("ar",))
    out = bench.run(BenchConfig(backend="recompute", **common), tmp_path / "recompute")
    lean = bench.run(BenchConfig(backend="lean", **common), tmp_path / "lean")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["greedy_identical_to_ar"] == 1.0  # greedy SD on the new runtime: its own AR's tokens
    assert summary["target"]["backend"] == summary["drafter"]["backend"] == "recompute"
    ours, theirs = ([json.loads(line) for line in (f / "records.jsonl").read_text().splitlines()] for f in (out, lean))
    assert {r["method"] for r in ours} == {"sd", "ar"} and len(ours) == len(theirs) == 4
    # the same weights at fp32 on another runtime: the same greedy tokens as the lean forward's
    tokens = lambda recs: {(r["prompt_id"], r["method"]): r["tokens"] for r in recs}  # noqa: E731
    assert tokens(ours) == tokens(theirs)
