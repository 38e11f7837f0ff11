import os

import numpy as np
import pytest

from draftwise import memory

linux = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")


@linux
def test_a_peak_counts_from_what_the_process_holds_when_it_starts():
    held = np.ones(64 * 2**20 // 8)  # 64 MB held before: inside the block's peak, as it is resident
    with memory.Peak() as first:
        big = np.ones(256 * 2**20 // 8)  # 256 MB touched inside the block
        del big
    with memory.Peak() as second:  # reset: the 256 MB freed before this block is not its peak
        pass
    assert first.gb - second.gb > 0.2
    assert second.gb >= held.nbytes / 1e9
    assert memory.resident_gb() <= first.gb


def test_release_runs_anywhere():
    memory.release()  # glibc or not: never raises
