"""What a process holds in memory, stage by stage, and handing back what a finished stage left behind.

A design runs its stages one after another in one process. A stage that loaded the 1.5B target and freed it leaves
its pages with glibc's allocator, not the OS: torch's CPU tensors below glibc's (self-raising) mmap threshold come
from the heap, and a heap with one live block near its top cannot shrink. The next stage then stacks its own peak on
what the last one left, and the process peaks higher than any stage alone (a Zen 4 real-pair design: 17.7 GB, where
a teacher run alone peaked at 13.4). `release` collects Python's garbage and asks glibc to return every free page
(`malloc_trim(0)`); `Peak` measures one stage's own high-water mark (Linux's VmHWM, reset through
/proc/self/clear_refs), so a design's records say which stage set its peak. Elsewhere both do nothing.
"""

from __future__ import annotations

import ctypes
import gc
import re
from pathlib import Path

STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")
RESET_PEAK = "5"  # proc(5): writing 5 to clear_refs resets the peak resident set size (VmHWM) to the current one


def _status_kb(field: str) -> int | None:
    try:
        found = re.search(rf"^{field}:\s+(\d+) kB", STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) if found else None


def resident_gb() -> float | None:
    """This process's resident set now, in GB (None where the OS does not say)."""
    kb = _status_kb("VmRSS")
    return None if kb is None else kb * 1024 / 1e9


def release() -> None:
    """Hand the memory a finished stage freed back to the OS."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Peak:
    """`with Peak() as p:` ... `p.gb`: the process's highest resident set inside the block, in GB (None where the OS
    does not keep one); the block starts from what the process holds when it is entered."""

    def __init__(self):
        self.gb: float | None = None

    def __enter__(self) -> Peak:
        try:
            CLEAR_REFS.write_text(RESET_PEAK)
        except OSError:
            pass  # the peak then counts from the process's start: still a true upper bound
        return self

    def __exit__(self, *exc) -> None:
        kb = _status_kb("VmHWM")
        self.gb = None if kb is None else kb * 1024 / 1e9
