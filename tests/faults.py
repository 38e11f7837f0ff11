"""Fault injection for run folders: run a `draftwise` command in a subprocess, SIGKILL it at a chosen point, rerun it
to completion, and compare the folder with an uninterrupted run's. A helper module for tests, not a test file.

Kill points:
- after N records: the harness polls the folder's records.jsonl and SIGKILLs the driver once it holds N lines (a
  kill from outside, between or during generations, as an OOM killer or a scheduler would);
- inside a write: `DRAFTWISE_FAULT=append:N` (read by `draftwise.rundir`) makes the driver write half of its N-th
  record's line and SIGKILL itself, leaving the torn last line a kill mid-write leaves.

`kill_worker` SIGKILLs a Ray worker while it runs an item (the driver lives on; Ray retries the task).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

POLL_S = 0.005
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "OMP_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
}


def command(args: list[str], out: Path) -> list[str]:
    return [sys.executable, "-m", "draftwise", *map(str, args), "--out", str(out)]


def environment(extra: dict | None = None) -> dict:
    env = {**os.environ, **ENV}
    env.pop("DRAFTWISE_FAULT", None)  # a fault only where a kill point asks for one
    env.pop("RAY_ADDRESS", None)  # --executor ray starts its own local instance unless --ray-address says otherwise
    return {**env, **(extra or {})}


def _log(out: Path, what: str) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    return out.parent / f"{out.name}.{what}.log"  # beside the folder, so the folder holds only what draftwise wrote


def draftwise(args: list[str], out: Path, env: dict | None = None, timeout: float = 300) -> Path:
    """Run the command to completion (it must succeed); the run folder."""
    log = _log(out, f"run{time.monotonic_ns()}")
    with open(log, "wb") as f:
        rc = subprocess.run(
            command(args, out), env=environment(env), stdout=f, stderr=subprocess.STDOUT, timeout=timeout
        ).returncode
    assert rc == 0, f"draftwise {' '.join(map(str, args))} exited {rc}:\n{log.read_text()[-3000:]}"
    return out


def record_count(out: Path) -> int:
    try:
        return (out / "records.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (a Ray driver's raylet, GCS, agents and workers); [] without psutil (Ray brings it)."""
    try:
        import psutil
    except ImportError:
        return []
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:  # the driver gone, or a child vanishing mid-scan: the next poll sees the rest
        return []


@dataclass
class Kill:
    records: int  # lines in records.jsonl when the kill landed (a torn one not counted)
    returncode: int
    descendants: dict[int, str] = field(default_factory=dict)  # the driver's child processes seen until the kill
    log: Path | None = None


def kill_at(
    args: list[str],
    out: Path,
    *,
    after_records: int | None = None,
    inside_write: int | None = None,
    inside_file: tuple[str, int] | None = None,
    during: str | None = None,
    env: dict | None = None,
    timeout: float = 300,
) -> Kill:
    """Start the command and SIGKILL it after `after_records` records (and, with `during`, once a process below it
    titled so runs: a Ray worker in an item), inside the write of record `inside_write` (counted from 1, this
    process's appends), or inside its N-th atomic write of a file NAME (`inside_file`: (NAME, N); a stage's final
    file). Fails if the command finishes first: the kill must really land."""
    assert sum(x is not None for x in (after_records, inside_write, inside_file)) == 1, "one kill point"
    extra = dict(env or {})
    if inside_write is not None:
        extra["DRAFTWISE_FAULT"] = f"append:{inside_write}"
    if inside_file is not None:
        extra["DRAFTWISE_FAULT"] = f"file:{inside_file[0]}:{inside_file[1]}"
    log = _log(out, "killed")
    with open(log, "wb") as f:
        proc = subprocess.Popen(command(args, out), env=environment(extra), stdout=f, stderr=subprocess.STDOUT)
    children: dict[int, str] = {}
    deadline, polls = time.monotonic() + timeout, 0
    try:
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"no kill point within {timeout}s:\n{log.read_text()[-3000:]}")
            if polls % 20 == 0:  # every 0.1 s: whatever runs below the driver (a Ray instance), for `reap`
                children.update(names(descendants(proc.pid)))
            polls += 1
            if after_records is not None and record_count(out) >= after_records:
                children.update(now := names(descendants(proc.pid)))
                if during is not None and during not in now.values():
                    time.sleep(POLL_S)
                    continue
                time.sleep(0.5 if during else 0)  # into the item, not at its very start
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                break
            time.sleep(POLL_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, (
        f"expected a SIGKILL, the command exited {proc.returncode}:\n{log.read_text()[-3000:]}"
    )
    return Kill(record_count(out), proc.returncode, children, log)


def run_killed(
    args: list[str],
    out: Path,
    *,
    after_records: int | None = None,
    inside_write: int | None = None,
    inside_file: tuple[str, int] | None = None,
    env: dict | None = None,
    timeout: float = 300,
) -> Path:
    """`kill_at`, then the same command again on the same folder to completion: the resumed run folder."""
    kill_at(
        args,
        out,
        after_records=after_records,
        inside_write=inside_write,
        inside_file=inside_file,
        env=env,
        timeout=timeout,
    )
    return draftwise(args, out, env, timeout)


def kill_worker(
    args: list[str],
    out: Path,
    *,
    after_records: int,
    env: dict | None = None,
    timeout: float = 300,
    name: str = "ray::_run_item",
) -> Kill:
    """Run a `--executor ray` command to completion, SIGKILLing one Ray worker (a process below the driver titled
    `name`: running an item) once `after_records` records are in. `descendants`: every process seen below the
    driver while it ran (to check that a finished run leaves none of them behind)."""
    log = _log(out, "worker-killed")
    victim, seen = None, {}
    with open(log, "wb") as f:
        proc = subprocess.Popen(command(args, out), env=environment(env), stdout=f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            now = names(descendants(proc.pid))  # titles change (a worker's: ray::IDLE, ray::_run_item)
            seen.update(now)
            if victim is None and record_count(out) >= after_records:
                for pid, title in now.items():
                    if title == name:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            continue
                        victim = pid
                        break
            time.sleep(10 * POLL_S)
        if proc.poll() is None:
            proc.kill()
    finally:
        proc.wait()
    assert proc.returncode == 0, f"the command exited {proc.returncode}:\n{log.read_text()[-3000:]}"
    assert victim is not None, "no worker was running an item after that many records: the kill never landed"
    return Kill(record_count(out), proc.returncode, seen, log)


# --- comparing a run folder with an uninterrupted run's ---------------------------------------------------------


def records(folder: Path) -> list[dict]:
    """Every line of records.jsonl, which must be valid JSONL: each line a JSON object, the file ending in a newline."""
    data = (folder / "records.jsonl").read_text()
    assert data.endswith("\n"), "records.jsonl ends in a torn line"
    return [json.loads(line) for line in data.splitlines()]


def key(record: dict) -> tuple:
    """What a bench or bench-grid record is a record of (its point, method and prompt)."""
    return tuple(record.get(k) for k in ("drafter", "gamma", "temperature", "batch_size", "method", "prompt_id"))


def untimed(value):
    """A record without its timings (`seconds`, `*_s`): what a greedy rerun must reproduce exactly."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k != "seconds" and not k.endswith("_s")}
    if isinstance(value, list):
        return [untimed(v) for v in value]
    return value


def compare(folder: Path, reference: Path, key=key, greedy: bool = True) -> None:
    """`folder` (a killed and resumed run) holds what `reference` (uninterrupted) holds: the same record keys, none
    twice, for greedy runs the same tokens and decisions, and no temporary file left behind."""
    mine, theirs = records(folder), records(reference)
    keys = [key(r) for r in mine]
    assert len(keys) == len(set(keys)), f"records twice: {sorted(k for k in set(keys) if keys.count(k) > 1)}"
    assert set(keys) == {key(r) for r in theirs}, (
        f"missing {set(map(key, theirs)) - set(keys)}, extra {set(keys) - set(map(key, theirs))}"
    )
    if greedy:
        want = {key(r): untimed(r) for r in theirs}
        for r in mine:
            assert untimed(r) == want[key(r)], f"record {key(r)} differs from the uninterrupted run's"
    leftovers = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.tmp"))
    assert not leftovers, f"temporary files left behind: {leftovers}"
    assert json.loads((folder / "config.json").read_text()) == json.loads((reference / "config.json").read_text())


def alive(pids: list[int]) -> list[int]:
    """Those of `pids` still running (zombies, dead but not reaped by their parent, do not count)."""
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def names(pids: list[int]) -> dict[int, str]:
    """Each live process of `pids` by its program: the binary, the script a Python runs, or its title (ray::...)."""
    import psutil

    out = {}
    for pid in pids:
        try:
            process = psutil.Process(pid)
            argv = process.cmdline() or [process.name()]  # a process still starting may show no argv yet
        except psutil.Error:
            continue
        scripts = [a for a in argv[1:] if a.endswith(".py")]
        program = scripts[0] if scripts and "python" in argv[0] else argv[0]
        out[pid] = program.rsplit("/", 1)[-1]
    return out


def reap(pids: list[int], grace_s: float = 0.0) -> dict[int, str]:
    """Wait up to `grace_s` for `pids` to end, then SIGKILL those still alive (by pid: only processes the test's own
    run started); what was still alive, by pid, with its program name."""
    deadline = time.monotonic() + grace_s
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = names(alive(pids))
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
