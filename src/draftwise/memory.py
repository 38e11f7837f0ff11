"""What a process holds in memory, stage by stage, and handing back what a finished stage left behind.

A design runs its stages one after another in one process. A stage that loaded the 1.5B target and freed it leaves
its pages with glibc's allocator, not the OS: torch's CPU tensors below glibc's (self-raising) mmap threshold come
from the heap, and a heap with one live block near its top cannot shrink. `release` collects Python's garbage and asks
glibc to return every free page (`malloc_trim(0)`), so the next stage does not stack its peak on what the last one
left. `Peak` measures one stage's own highest resident set so a design's records say which stage set its peak: the
process's high-water mark (Linux's VmHWM) where the stage raised it, which is exact, else the highest of samples taken
every `SAMPLE_S` by a thread. Why not reset VmHWM per stage (/proc/self/clear_refs): the reset also lowers what the
kernel reports at exit as the process's peak (`time -v`'s maximum resident set read 10.1 GB for a Zen 4 design whose
teacher stage alone peaked at 17.7). Elsewhere than Linux both do nothing.
"""

from __future__ import annotations

import ctypes
import gc
import re
import threading
from pathlib import Path

STATUS = Path("/proc/self/status")
SAMPLE_S = 0.05  # how often `Peak` reads the resident set where the stage stayed below the process's high-water mark


def _status_kb(field: str) -> int | None:
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def _gb(kb: int | None) -> float | None:
    return None if kb is None else kb * 1024 / 1e9


def resident_gb() -> float | None:
    """This process's resident set now, in GB (None where the OS does not say)."""
    return _gb(_status_kb("VmRSS"))


def release() -> None:
    """Hand the memory a finished stage freed back to the OS."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Peak:
    """`with Peak() as p:` ... `p.kb`: the process's highest resident set inside the block, as the OS counts it
    (`p.gb` in GB; None where the OS does not say); it counts what the process held when the block began."""

    def __init__(self):
        self.kb: int | None = None
        self._sampled = 0
        self._done = threading.Event()

    def _sample(self) -> None:
        while not self._done.wait(SAMPLE_S):
            self._sampled = max(self._sampled, _status_kb("VmRSS") or 0)

    def __enter__(self) -> Peak:
        self._before = _status_kb("VmHWM")
        self._sampled = _status_kb("VmRSS") or 0
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        after = _status_kb("VmHWM")
        if after is None or self._before is None:
            return
        self.kb = after if after > self._before else max(self._sampled, _status_kb("VmRSS") or 0)

    @property
    def gb(self) -> float | None:
        return _gb(self.kb)
