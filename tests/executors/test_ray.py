"""The Ray executor on a local 2-CPU cluster: the same records as in-process, and a killed task retried once."""

import json
import os
import sys
from dataclasses import dataclass

import pytest

ray = pytest.importorskip("ray")

from draftwise.config import BenchConfig, BenchGridConfig, SweepConfig  # noqa: E402
from draftwise.executors import InProcess  # noqa: E402
from draftwise.executors.ray import RayExecutor  # noqa: E402
from draftwise.stages import bench_grid, sweep  # noqa: E402

pytestmark = pytest.mark.slow  # a local Ray cluster: the slow tier


@pytest.fixture(scope="module")
def cluster():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import this test module
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield RayExecutor()
    ray.shutdown()


def records(folder):
    return [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]


@dataclass(frozen=True)
class KillOnce:
    """Wraps a stage's Work: the worker running item number `victim` dies (hard exit, as on a node loss or OOM kill)
    the first time; Ray retries the task on a fresh worker."""

    inner: object
    marker: str
    victim: object

    def __call__(self):
        fn = self.inner()

        def run(item):
            if repr(item) == self.victim and not os.path.exists(self.marker):
                open(self.marker, "w").close()
                os._exit(1)
            return fn(item)

        return run


class KillingExecutor(RayExecutor):
    def __init__(self, marker, victim_index: int):
        super().__init__()
        self.marker, self.victim_index = marker, victim_index

    def map(self, work, items, resources, local=None):
        items = list(items)
        return super().map(KillOnce(work, str(self.marker), repr(items[self.victim_index])), items, resources)


def sweep_config(tiny_dir):
    return SweepConfig(
        target=tiny_dir,
        budget="20k",
        layers=(1, 2),
        widths=(16,),
        width_depth=1,
        truncations=(1,),
        context=16,
        memory="1GiB",
        batches=(1,),
        warmup=0,
        repeats=2,
        threads=1,
    )


def test_ray_sweep_gives_the_in_process_records_and_survives_a_killed_task(cluster, tiny_dir, tmp_path):
    config = sweep_config(tiny_dir)
    here = sweep.run(config, tmp_path / "here", InProcess())
    there = sweep.run(config, tmp_path / "ray", KillingExecutor(tmp_path / "killed", victim_index=1))
    assert (tmp_path / "killed").exists()  # a worker really died mid-run
    keys_here = sorted(sweep.key(r) for r in records(here))
    keys_ray = [sweep.key(r) for r in records(there)]
    assert sorted(keys_ray) == keys_here and len(set(keys_ray)) == len(keys_ray)  # nothing lost, nothing twice
    assert json.loads((there / "sweep.json").read_text())["rows"]
    sweep.run(config, tmp_path / "ray", cluster)  # finished: a rerun adds nothing
    assert len(records(there)) == len(keys_here)


def test_ray_bench_grid_gives_the_in_process_records(cluster, tiny_dir, tmp_path):
    base = BenchConfig(
        target=tiny_dir,
        drafter="layers:0",
        suite="spec_bench",
        limit=3,
        max_new_tokens=8,
        baselines=("ar",),
        warmup=0,
        threads=1,
    )
    grid = BenchGridConfig(bench=base, drafters=("layers:0", "layers:0,2"), gammas=(1, 3), batch_sizes=(1, 2))
    here = bench_grid.run(grid, tmp_path / "here", InProcess())
    there = bench_grid.run(grid, tmp_path / "ray", KillingExecutor(tmp_path / "killed", victim_index=3))
    assert (tmp_path / "killed").exists()

    def tokens(folder):
        return {bench_grid._key(r): r["tokens"] for r in records(folder)}

    assert tokens(there) == tokens(here)  # greedy: the same tokens, point by point, prompt by prompt
    assert len(records(there)) == len(tokens(there))  # no duplicate record
    assert len(json.loads((there / "grid.json").read_text())["points"]) == 2 * 2 * 2
    lines = (there / "records.jsonl").read_text().splitlines(keepends=True)
    (there / "records.jsonl").write_text("".join(lines[:5]))  # killed after 5 records
    bench_grid.run(grid, there, cluster)  # a resumed recipe holds those records (dicts): not hashable, still cached
    assert tokens(there) == tokens(here) and len(records(there)) == len(lines)


def test_ray_executor_closes_only_the_ray_it_started(cluster):
    with RayExecutor() as joined:  # Ray was running already (the fixture's): leave it be
        assert not joined.owns
    assert ray.is_initialized()


def test_ray_design_runs_each_candidate_as_a_task(cluster, tiny_dir, tmp_path):
    from draftwise import design
    from draftwise.config import DesignConfig

    config = DesignConfig(
        target=tiny_dir,
        minutes=0.2,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=2,
        headline_limit=2,
        max_new_tokens=6,
        accuracy_items=2,
        draft_vocabs=(16,),
        adaptive=False,
        memory="1GiB",
        context=32,
        batch_cap=2,
        threads=1,
    )
    out = design.run(config, tmp_path / "d", cluster)
    stages = [json.loads(line)["stage"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(stages) == len(set(stages))  # each stage recorded once
    for name in ("wide-L1", "narrow-L2"):
        assert {f"prune-{name}", f"distill-{name}", f"agree-{name}"} <= set(stages)
    assert (out / "report.md").exists()
