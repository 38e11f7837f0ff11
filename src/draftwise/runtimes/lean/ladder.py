"""Which path the integer kernel (`cpu_int8.c`) takes on this machine, proven before it is trusted.

The CPU's feature bits say what it has, not what runs: a hypervisor may hide state the instructions need, an OS may
refuse it (AMX tiles must be asked for), a compiler may emit what this CPU lacks. So the best path the CPU reports is
run first in a child process (`smoke.py`: a small product on every weight format at both activation precisions,
compared bit for bit with the torch reference), and a path whose child dies (SIGILL, SIGSEGV, a refused request) or
disagrees falls to the next rung — AVX-512 VNNI, then AVX2, then torch, which computes the same function slower.
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

NAMES = {2: "avx512", 1: "avx2", 0: "torch"}  # the kernel's isa codes (`draftwise_int8_isa`), best first
SMOKE_TIMEOUT_S = 120


def smoke(isa: int) -> bool:
    """Whether path `isa` runs and gives the reference's bits here, judged in a child process."""
    env = dict(os.environ)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "draftwise.runtimes.lean.smoke", str(isa)],
            capture_output=True,
            timeout=SMOKE_TIMEOUT_S,
            env=env,
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
    """`choose`'s rung for kernel build `build` on this CPU, read from `folder` when this machine proved it before."""
    record = folder / f"ladder-{build}-{_cpu_key()}.json"
    try:
        kept = json.loads(record.read_text())
        if kept.get("best") == best:
            return int(kept["isa"])
    except (OSError, ValueError, KeyError):
        pass
    isa, tried = choose(best, test)
    tmp = record.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"best": best, "isa": isa, "path": NAMES[isa], "tried": tried}))
    os.replace(tmp, record)  # atomic: two processes proving at once write the same verdict
    return isa


def _cpu_key() -> str:
    """The CPU's model name and feature flags, hashed: a verdict moves with neither a disk image nor a live
    migration to another CPU."""
    import hashlib

    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    lines = sorted({ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))})
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
