"""A run keeps its promises under faults: killed (SIGKILL, from outside, inside a record write or inside a stage's
final file) and rerun, a run folder holds what an uninterrupted run's holds, nothing lost, nothing twice, no
temporary file; in-process and under Ray (a driver killed and resumed, a worker killed mid-item; the design's
prune, distill and agree run in Ray workers). Tiny random models, a few prompts and tokens."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from faults import (
    Kill,
    command,
    compare,
    descendants,
    draftwise,
    environment,
    kill_at,
    kill_worker,
    names,
    reap,
    records,
    run_killed,
)

pytestmark = pytest.mark.slow  # fault injection (subprocesses killed mid-run): the slow tier

FAST = ["--warmup", "0", "--threads", "1", "--seed", "0"]


def bench_args(tiny_dir) -> list[str]:  # 3 prompts × (sd, ar): 6 records
    return [
        "bench",
        "--target",
        tiny_dir,
        "--drafter",
        "layers:0,2",
        "--gamma",
        "3",
        "--limit",
        "3",
        "--max-new-tokens",
        "24",
        *FAST,
    ]


def grid_args(tiny_dir) -> list[str]:  # 2 drafters × 2 γ + AR, 2 prompts: 10 records
    return [
        "bench",
        "--target",
        tiny_dir,
        "--drafter",
        "layers:0",
        "--drafter",
        "layers:0,2",
        "--gamma",
        "1,3",
        "--limit",
        "2",
        "--max-new-tokens",
        "24",
        *FAST,
    ]


def uninterrupted(args: list[str], out):
    """The reference run folder: the same command, in this process (no interpreter to start)."""
    from draftwise.cli import main

    assert main([*args, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def bench_reference(tiny_dir, tmp_path_factory):
    return uninterrupted(bench_args(tiny_dir), tmp_path_factory.mktemp("faults") / "bench")


@pytest.fixture(scope="module")
def grid_reference(tiny_dir, tmp_path_factory):
    return uninterrupted(grid_args(tiny_dir), tmp_path_factory.mktemp("faults") / "grid")


# --- the fault hook and the torn line -----------------------------------------------------------------------------

HOOKED = """
import sys
from draftwise.config import BenchConfig
from draftwise.rundir import RunDir
run = RunDir(sys.argv[1], BenchConfig(target=sys.argv[2]))
for i in range(4):
    run.append({"i": i, "text": "x" * 40})
"""


def test_fault_hook_tears_the_nth_record_and_a_reopened_folder_mends_it(tiny_dir, tmp_path):
    from draftwise.config import BenchConfig
    from draftwise.rundir import RunDir

    env = {**os.environ, "DRAFTWISE_FAULT": "append:3"}
    proc = subprocess.run([sys.executable, "-c", HOOKED, str(tmp_path / "r"), tiny_dir], env=env)
    assert proc.returncode == -signal.SIGKILL
    data = (tmp_path / "r" / "records.jsonl").read_bytes()
    assert data.count(b"\n") == 2 and not data.endswith(b"\n")  # two whole records, then half of the third
    run = RunDir(tmp_path / "r", BenchConfig(target=tiny_dir))  # resuming: the torn line is cut off
    assert [r["i"] for r in run.records()] == [0, 1]
    run.append({"i": 2})
    assert [r["i"] for r in records(tmp_path / "r")] == [0, 1, 2]  # valid JSONL, nothing lost, nothing twice
    assert not list((tmp_path / "r").glob("*.tmp"))


def test_fault_hook_is_inert_unless_it_names_an_append(tiny_dir, tmp_path, monkeypatch):
    from draftwise.config import BenchConfig
    from draftwise.rundir import FAULT, RunDir

    run = RunDir(tmp_path / "r", BenchConfig(target=tiny_dir))
    for value in ("", "append:", "append:x", "write:1", "append:0"):
        monkeypatch.setenv(FAULT, value)
        run.append({"v": value})
    assert len(run.records()) == 5


# --- bench, in-process ----------------------------------------------------------------------------------------------


def test_bench_killed_inside_a_record_write_then_after_records(tiny_dir, bench_reference, tmp_path):
    args, out = bench_args(tiny_dir), tmp_path / "run"
    kill = kill_at(args, out, inside_write=2)
    assert kill.records == 1 and not (out / "records.jsonl").read_bytes().endswith(b"\n")  # the second record torn
    again = kill_at(args, out, after_records=3)  # the rerun killed too, from outside this time
    assert again.records >= 3
    draftwise(args, out)
    compare(out, bench_reference)
    assert (out / "summary.json").exists()


def test_bench_grid_killed_after_records_and_inside_its_final_file(tiny_dir, grid_reference, tmp_path):
    out = run_killed(grid_args(tiny_dir), tmp_path / "grid", after_records=3)
    compare(out, grid_reference)
    assert len(json.loads((out / "grid.json").read_text())["points"]) == 4
    out = tmp_path / "grid-file"
    kill_at(grid_args(tiny_dir), out, inside_file=("grid.json", 1))  # every record in, the summary half written
    assert (out / "grid.json.tmp").exists() and not (out / "grid.json").exists()
    draftwise(grid_args(tiny_dir), out)
    compare(out, grid_reference)  # (compare also checks that no *.tmp is left)
    assert len(json.loads((out / "grid.json").read_text())["points"]) == 4


TIMING_STAGES = {  # timing records: no greedy tokens to compare, only which points were measured
    "sweep": [
        "sweep",
        "--budget",
        "20k",
        "--layers",
        "1,2",
        "--widths",
        "16",
        "--width-depth",
        "1",
        "--truncations",
        "1",
        "--context",
        "16",
        "--memory",
        "1GiB",
        "--batch",
        "1",
        "--warmup",
        "0",
        "--repeats",
        "2",
        "--threads",
        "1",
    ],
    "profile": [
        "profile",
        "--drafter",
        "layers:0,3",
        "--depths",
        "1,2",
        "--gammas",
        "1,2",
        "--batch",
        "1",
        "--context",
        "16",
        "--warmup",
        "0",
        "--repeats",
        "2",
        "--threads",
        "1",
    ],
}


@pytest.mark.parametrize("executor", ["inprocess", "ray"])
@pytest.mark.parametrize("stage", sorted(TIMING_STAGES))
def test_timing_stage_killed_inside_a_record_write(stage, executor, tiny_dir, tmp_path):
    """Killed inside the driver's second record write and rerun; under Ray the driver dies with its items in flight
    (what its Ray instance leaves is killed here, by pid, once the run is over)."""
    import importlib

    if executor == "ray":
        pytest.importorskip("ray")
    key = importlib.import_module(f"draftwise.stages.{stage}").key
    args = [TIMING_STAGES[stage][0], "--target", tiny_dir, *TIMING_STAGES[stage][1:]]
    reference = uninterrupted(args, tmp_path / "reference")  # in-process, uninterrupted
    args += ["--executor", executor]
    kill = kill_at(args, tmp_path / "run", inside_write=2)
    out = draftwise(args, tmp_path / "run")
    reap(list(kill.descendants))
    compare(out, reference, key=key, greedy=False)
    assert (out / f"{stage}.json").exists()


# --- under Ray ------------------------------------------------------------------------------------------------------

CORE = ("gcs_server", "raylet")  # a local Ray instance's own processes


def test_ray_driver_kill9_then_a_resumed_ray_run_with_a_worker_killed(tiny_dir, grid_reference, tmp_path, capsys):
    """SIGKILL the driver that started its own local Ray, mid-grid; the rerun under Ray (its recipe holds the
    finished records: dicts, unhashable) loses a worker mid-item too, and still finishes the folder an uninterrupted
    in-process run gives: the task Ray retried is recorded once."""
    pytest.importorskip("ray")
    args = [*grid_args(tiny_dir), "--executor", "ray"]
    out = tmp_path / "grid"
    kill: Kill = kill_at(args, out, after_records=2)
    assert kill.records < 10 and set(CORE) <= set(kill.descendants.values())
    left = reap(list(kill.descendants), grace_s=2)  # what SIGKILL left behind, killed here by pid
    with capsys.disabled():
        print(f"\nleft running 2 s after the Ray driver's SIGKILL: {sorted(left.values()) or 'nothing'}")
    assert not set(CORE) & set(left.values())  # GCS and raylet go with their driver
    run = kill_worker(args, out, after_records=kill.records + 1)
    compare(out, grid_reference)
    assert set(CORE) <= set(run.descendants.values())
    assert not reap(list(run.descendants), grace_s=10), "a finished Ray run left processes behind"
    assert len(json.loads((out / "grid.json").read_text())["points"]) == 4


def test_ray_sigterm_shuts_the_local_instance_down(tiny_dir, tmp_path):
    """`kill` (SIGTERM) of a driver that started Ray, while an item runs: it exits through its `finally`, and Ray
    goes with it. (Not sooner: a SIGTERM inside `ray.init` meets Ray's own C++ handler, which aborts the driver.)"""
    pytest.importorskip("ray")
    out = tmp_path / "grid"
    proc = subprocess.Popen(
        command([*grid_args(tiny_dir), "--executor", "ray"], out),
        env=environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline, children = time.monotonic() + 120, {}
    while "ray::_run_item" not in children.values() and proc.poll() is None and time.monotonic() < deadline:
        children = names(descendants(proc.pid))
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    # SystemExit(143), which Ray's core worker turns into SystemExit(1) when it lands inside ray.wait
    assert proc.wait(timeout=60) in (1, 128 + signal.SIGTERM)
    assert set(CORE) <= set(children.values())
    left = reap(list(children), grace_s=10)
    assert not left, f"left running after SIGTERM: {left}"


# --- gen-data and distill, in-process ------------------------------------------------------------------------------

GEN_DATA = [
    "gen-data",
    "--suites",
    "spec_bench,alpaca",
    "--limit",
    "12",
    "--max-new-tokens",
    "10",
    "--temperatures",
    "0,1",
    "--topk",
    "8",
    "--shard-size",
    "10",
    "--batch-size",
    "4",
    "--threads",
    "1",
]


def test_gen_data_and_distill_killed_inside_a_record_write_and_after_records(tiny_dir, tmp_path):
    """gen-data killed inside its second shard's record: the rerun rewrites that shard alone, to the same record and
    the same file as an uninterrupted run (sampled shards too: the seed follows the shard). distill killed after a
    few steps, past its last checkpoint: the rerun resumes from the checkpoint, records each step once, and ends in
    the uninterrupted run's weights."""
    from safetensors.torch import load_file

    args = [GEN_DATA[0], "--target", tiny_dir, *GEN_DATA[1:]]
    reference = uninterrupted(args, tmp_path / "gen-reference")
    data = run_killed(args, tmp_path / "gen", inside_write=2)
    compare(data, reference, key=lambda r: r["file"])
    for r in records(reference):
        a, b = load_file(reference / r["file"]), load_file(data / r["file"])
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)

    distill_args = [
        "distill",
        "--target",
        tiny_dir,
        "--drafter",
        "layers:0,1",
        "--data",
        str(reference),
        "--tokens",
        "1200",
        "--batch-size",
        "4",
        "--lr",
        "1e-2",
        "--eval-every",
        "3",
        "--checkpoint-every",
        "4",
        "--threads",
        "1",
    ]
    whole = uninterrupted(distill_args, tmp_path / "distill-reference")
    steps = sum(r["event"] == "train" for r in records(whole))
    assert steps >= 8
    out = run_killed(distill_args, tmp_path / "distill", after_records=7)  # eval 0, then steps 1-6 (past checkpoint 4)
    compare(out, whole, key=lambda r: (r["event"], r["step"]), greedy=False)
    a, b = load_file(whole / "checkpoint" / "model.safetensors"), load_file(out / "checkpoint" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


# --- design, in-process and under Ray -------------------------------------------------------------------------------


@pytest.mark.parametrize("executor", ["inprocess", "ray"])
def test_design_killed_inside_a_write_and_between_stages(executor, tiny_dir, tmp_path):
    """The whole design killed twice — inside some stage's record write, then after a few more stages — and rerun:
    every stage is done once, every stage folder's records are valid JSONL, nothing temporary is left, and the run
    ends in its report and export. Under Ray the candidates' prune, distill and agree stages run in Ray workers, so
    the driver dies with items in flight (what its Ray instance leaves is killed here, by pid)."""
    if executor == "ray":
        pytest.importorskip("ray")
    args = [
        "design",
        "--target",
        tiny_dir,
        "--minutes",
        "0.2",
        "--fixed-sizes",
        "--wide-layers",
        "1",
        "--narrow-factor",
        "2",
        "--bench-limit",
        "2",
        "--refine-limit",
        "2",
        "--tune-prompts",
        "4",
        "--max-new-tokens",
        "8",
        "--engines",
        "lean",
        "--temperatures",
        "0,1",
        "--threads",
        "1",
        "--executor",
        executor,
    ]
    out = tmp_path / "design"
    if executor == "inprocess":
        first = kill_at(args, out, inside_write=40, timeout=600)  # the 40th record this process appends, in any stage
        second = kill_at(args, out, inside_file=("done.json", 3), timeout=600)  # inside a stage's final file
        assert second.records > first.records
        draftwise(args, out, timeout=600)
    else:  # the fault hook would fire in Ray's workers too: the driver is killed from outside, a worker mid-item
        first = kill_at(args, out, after_records=3, during="ray::_run_item", timeout=600)  # candidates building
        reap(list(first.descendants), grace_s=2)
        run = kill_worker(args, out, after_records=first.records + 2, timeout=600)
        assert not reap(list(run.descendants), grace_s=10), "a finished Ray design left processes behind"
    stages = [r["stage"] for r in records(out)]
    assert len(stages) == len(set(stages)) and {"sweep", "gen-data", "calibrate-lookup", "verdict"} <= set(stages)
    for folder in (out / "stages").iterdir():
        if (folder / "records.jsonl").exists():
            records(folder)  # whole lines only
        if (folder / "done.json").exists():
            assert json.loads((folder / "done.json").read_text())["stage"] in stages
    assert not list(out.rglob("*.tmp")) and (out / "report.md").exists() and (out / "export" / "README.md").exists()
