"""A design run folder, read (`DesignFolder`: what the report renders from) and written (`Pipeline`: what the phases
run stages through).

Every stage writes its own run folder under `stages/` and, when finished, one `done` record in the design folder's
records.jsonl; a rerun skips finished stages and resumes the unfinished one from its own folder, so a kill at any
point loses no finished work. Decisions (chosen drafter, γ*, lookup settings, more gen-data) are records too, so a
rerun never re-decides them.

A stage that runs native code that can fault (a row's runtime: llama.cpp, the lean engine's int8 kernels) runs in a
child process (`Stages.isolated`, `isolate.run`). When that child dies by a signal the row it was running *died*: a
`died` record names it with the one-line reason, the stage's folder moves aside (`<stage>.died`), and the design goes
on without the row; a rerun does not retry a row that died unless `--retry-died` asks (a `retry-died` record).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .. import isolate, memory
from ..config import DesignConfig, from_dict
from ..executors import Executor, InProcess
from ..rundir import RunDir, read_records, write_atomic
from . import study
from .plan import Planner
from .sizes import Sizes, nominal

CANDIDATES = "candidates.json"  # the design's candidates (name, role, spec, shape), written once they are known


def runtime_options(config: DesignConfig) -> dict:
    """The options every stage of a design runs its models with."""
    return {"dtype": config.dtype, "device": config.device, "threads": config.threads}


class Stages:
    """Which stages are done and where each one's folder is; `stage` runs one unless it is done, writes its done
    record into the stage's own folder (done.json) and hands it to `on_done`. A worker (see `build.CandidateWork`)
    holds one of these without the run folder: it returns its records to the driver, which alone appends to
    records.jsonl; a done.json whose item never returned (a kill) is collected by the next `Pipeline`."""

    def __init__(
        self, config: DesignConfig, stages: Path, done: dict[str, dict], on_done: Callable[[dict], None], sizes: Sizes
    ):
        self.config, self.stages, self.done, self.on_done, self.sizes = config, stages, done, on_done, sizes

    def folder(self, name: str) -> Path:
        return self.stages / name

    def progress(self) -> str:
        return ""

    def stage(self, name: str, work: Callable[[Path], object], **decision) -> dict:
        """Run `work(folder)` unless `name` is finished; returns the stage's done record."""
        if name in self.done:
            return self.done[name]
        print(f"[design] {name} ...{self.progress()}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        with memory.Peak() as peak:  # this stage's own high-water mark: which stage sets the design's peak
            result = work(self.folder(name))
        memory.release()  # what it freed goes back to the OS, not under the next stage's peak
        result = result if isinstance(result, dict) else {}  # stage runs return their folder; decisions a dict
        record = {
            "event": "done",
            "stage": name,
            "folder": str(self.folder(name)),
            **decision,
            **result,
            "seconds": time.perf_counter() - start,
            **({"peak_gb": round(peak.gb, 2)} if peak.gb is not None else {}),
        }
        self.folder(name).mkdir(parents=True, exist_ok=True)
        write_atomic(self.folder(name) / "done.json", json.dumps(record) + "\n")
        self.done[name] = record
        self.on_done(record)
        return record

    def isolated(
        self, name: str, fn: Callable, config, runtime: str, names: dict[str, str] | None = None, **decision
    ) -> dict:
        """`stage(name, ...)` running `fn(config, folder)` in a child process. `runtime`: the row it runs, for a crash
        whose child left no crumb naming one; `names`: the row of each runtime a crumb may name. A death there is
        recorded (`died`) and raised as `isolate.NativeCrash`, its `row` set."""
        try:
            return self.stage(name, lambda f: isolate.run(fn, config, f, label=runtime), **decision)
        except isolate.NativeCrash as crash:
            crash.row = (names or {}).get(crash.runtime, crash.runtime) if crash.runtime else runtime
            self.died(crash.row, name, crash)
            raise

    def died(self, runtime: str, stage: str, crash: isolate.NativeCrash) -> None:
        """A runtime's native code died in `stage`: a worker only reports it (the driver records it)."""
        print(f"[design] {crash}", file=sys.stderr, flush=True)


# the stages after the rows whose outcome depends on which rows ran: redone when `--retry-died` brings a row back
AFTER_ROWS = ("quality", "bench-fastest", "fastest", "bench-serve", "served")


def _aside(folder: Path, suffix: str) -> None:
    """Move a stage's folder out of the way (`<stage><suffix>`, replacing an older one): a rerun starts it afresh."""
    if folder.exists():
        aside = folder.with_name(folder.name + suffix)
        shutil.rmtree(aside, ignore_errors=True)
        folder.rename(aside)


def history(records: list[dict]) -> tuple[dict[str, dict], dict[str, dict]]:
    """(the done record of each finished stage, the died record of each row that died), but what a later
    `retry-died` record sent back: its rows to be measured, its `redo` stages to be run again."""
    done: dict[str, dict] = {}
    dead: dict[str, dict] = {}
    for r in records:
        if r.get("event") == "done":
            done[r["stage"]] = r
        elif r.get("event") == "died":
            dead[r["row"]] = r
        elif r.get("event") == "retry-died":
            done = {k: v for k, v in done.items() if k not in r.get("redo", ())}
            dead = {k: v for k, v in dead.items() if k not in r["rows"]}
    return done, dead


def markers(stages: Path) -> list[dict]:
    """The done.json of each stage folder (a folder moved aside, `<stage>.died`, is not its stage's)."""
    out = []
    for marker in sorted(stages.glob("*/done.json")):
        record = json.loads(marker.read_text())
        if record.get("stage") == marker.parent.name:
            out.append(record)
    return out


class DesignFolder:
    """A design run folder as it stands on disk: `base`, the config the user gave (config.json); `done`, the done
    record of every finished stage; `config`, the config the last planned phase's stages read (its sizes); `planner`,
    the budget's records (None with `--fixed-sizes`). Reading one runs nothing: the report renders from it alone."""

    def __init__(self, out: str | Path):
        self.path = Path(out)
        self.base: DesignConfig = from_dict(DesignConfig, json.loads((self.path / "config.json").read_text()))
        self.records = read_records(self.path / "records.jsonl")
        self.done, self.dead = history(self.records)
        self.stages = self.path / "stages"
        for record in markers(self.stages):  # finished in an item that was killed before returning
            self.done.setdefault(record["stage"], record)
        self.planner = Planner(self, self.records, time.monotonic()) if self.base.plan else None
        plans = self.planner.plans if self.planner else {}
        last = list(plans.values())[-1]["sizes"] if plans else None
        self.sizes = (
            Sizes(**{k: tuple(v) if k == "dropped" else v for k, v in last.items()}) if last else nominal(self.base, 2)
        )
        self.config = self.sizes.config(self.base) if last else self.base

    def folder(self, name: str) -> Path:
        return self.stages / name

    def candidates(self) -> list[dict]:
        """The candidates the design measured: name, role, spec, trained, shape (`build.Candidate`)."""
        return json.loads((self.path / CANDIDATES).read_text())

    def elapsed(self) -> float:
        """Seconds the run's finished stages and plans took, across resumes."""
        return max((r.get("elapsed_s", 0.0) for r in self.records), default=0.0)


class Pipeline(Stages):
    """A design run being made: the folder (config.json, one done record per finished stage in records.jsonl), the
    executor its stages' items run on, and the budget. `base`: the config the user gave; `config`: the one the
    current phase's stages read (`replan` sets it from the phase's planned sizes)."""

    def __init__(
        self,
        config: DesignConfig,
        out: str | Path,
        executor: Executor | None = None,
        started: float | None = None,
        retry_died: bool = False,
    ):
        config = study.resolve_config(config, out)  # --dtype auto: fp32, or the file's own precision for a big target
        self.dir, self.executor = RunDir(out, config), executor or InProcess()  # where every stage's items run
        self.path = self.dir.path
        self.base, records, self.trained = config, self.dir.records(), 2  # trained: `know` updates it
        done, self.dead = history(records)  # self.dead: row -> its died record
        super().__init__(config, self.path / "stages", done, self._append, nominal(config, 2))
        if retry_died and self.dead:
            self._retry(self.done)
        self.planner = Planner(self, records, started) if config.plan else None
        for record in markers(self.stages):  # finished in an item that was killed before returning
            self.add(record)

    def _append(self, record: dict) -> None:
        if self.planner:  # its kind, prediction and time, which the planner's corrections learn from
            record = self.done[record["stage"]] = self.planner.stamp(record)
        self.dir.append(record)

    def died(self, runtime: str, stage: str, crash: isolate.NativeCrash) -> None:
        """Record that `runtime` died in `stage` (module docstring) and move the stage's folder aside."""
        super().died(runtime, stage, crash)
        _aside(self.folder(stage), ".died")
        record = {
            "event": "died",
            "row": runtime,
            "stage": stage,
            "signal": crash.signal,
            "where": crash.where,
            "reason": str(crash),
            **({"elapsed_s": self.planner.elapsed()} if self.planner else {}),
        }
        self.dead[runtime] = record
        self.dir.append(record)

    def _retry(self, done: dict[str, dict]) -> None:
        """`--retry-died`: the rows that died are measured again, and what the set of rows decided is redone."""
        redo = [s for s in AFTER_ROWS if s in done]
        for stage in redo:
            _aside(self.folder(stage), ".superseded")
            del done[stage]
        self.dir.append({"event": "retry-died", "rows": sorted(self.dead), "redo": redo})
        self.dead = {}

    def add(self, record: dict) -> None:
        """A done record a worker returned."""
        if record["stage"] not in self.done:
            self.done[record["stage"]] = record
            self._append(record)

    def progress(self) -> str:
        return self.planner.progress() if self.planner else ""

    def know(self, **outline) -> None:
        """Figures of the run's shape now known (`costs.Outline`)."""
        self.trained = outline.get("trained", self.trained)
        if self.planner:
            self.planner.know(**outline)

    def replan(self, phase: str, **outline) -> None:
        """Size the stages from `phase` on (`plan`); without a budget plan, the full sizes and nothing dropped."""
        self.know(**outline)
        if self.planner is None:
            self.sizes = nominal(self.base, self.trained)
            return
        self.sizes = self.planner.plan(phase)
        self.config = self.sizes.config(self.base)

    def dropped(self, name: str) -> bool:
        return name in self.sizes.dropped
