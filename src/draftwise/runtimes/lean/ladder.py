"""Which path the integer kernel (`cpu_int8.c`) takes on this machine, proven before it is trusted.

The CPU's feature bits say what it has, not what runs: a hypervisor may hide state the instructions need, an OS may
refuse it (AMX tiles must be asked for), a compiler may emit what this CPU lacks. So the best path the CPU reports is
run first in a child process (`smoke.py`: a small product on every weight format at both activation precisions,
compared bit for bit with the torch reference), and a path whose child dies (SIGILL, SIGSEGV, a refused request) or
disagrees falls to the next rung — AMX (where the OS grants the tiles), AVX-512 VNNI, then AVX2, then torch, which
computes the same function slower.
Never a crash: the parent only reads the child's exit status. llama.cpp's build ladder (`runtimes/llamacpp`) proves
its rungs the same way.

The verdict is kept per kernel build and CPU (`cache_dir("kernels")`), so the child runs once a machine, not once a
process: about two seconds (its torch import).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ... import machine

NAMES = {3: "amx", 2: "avx512", 1: "avx2", 0: "torch"}  # the kernel's isa codes (`draftwise_int8_isa`), best first
SMOKE_TIMEOUT_S = 120


def smoke(isa: int) -> bool:
    """Whether path `isa` runs and gives the reference's bits here, judged in a child process."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "draftwise.runtimes.lean.smoke", str(isa)],
            capture_output=True,
            timeout=SMOKE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def choose(best: int, test: Callable[[int], bool] = smoke) -> tuple[int, dict[str, bool]]:
    """The first rung from `best` down whose smoke test passes (0: torch, no test needed), and each tried rung's
    verdict by name."""
    tried = {}
    for isa in range(best, 0, -1):
        tried[NAMES[isa]] = test(isa)
        if tried[NAMES[isa]]:
            return isa, tried
    return 0, tried


def proven(best: int, build: str, folder: Path, test: Callable[[int], bool] = smoke) -> int:
    """`choose`'s rung for kernel build `build` on this CPU, read from `folder` when this machine proved it before;
    the path is also left where the machine's description reads it (`machine.matrix_path`)."""
    cpu = machine.cpu_key()
    record = folder / f"ladder-{build}-{cpu}.json"
    try:
        kept = json.loads(record.read_text())
        isa = int(kept["isa"]) if kept.get("best") == best else None
    except (OSError, ValueError, KeyError):
        isa = None
    if isa is None:
        isa, tried = choose(best, test)
        _write(record, {"best": best, "isa": isa, "path": NAMES[isa], "tried": tried})
    published, now = folder / machine.MATRIX_PATH_RECORD, {"cpu": cpu, "path": NAMES[isa]}
    if not published.is_file() or json.loads(published.read_text()) != now:
        _write(published, now)
    return isa


def _write(path: Path, obj: dict) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(obj))
    os.replace(tmp, path)  # atomic: two processes proving at once write the same verdict
