import os

import pytest

from conftest import held
from draftwise import memory

linux = pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc/self/status")


@linux
def test_a_stage_below_the_high_water_mark_is_sampled():
    with memory.Peak() as first:
        held(256)
    with memory.Peak() as second:
        pass
    assert first.gb - second.gb > 0.2
    assert memory.resident_gb() <= first.gb


@linux
def test_the_stage_that_raises_the_high_water_mark_reads_it_exactly():
    hwm = memory._status_kb("VmHWM")
    need = hwm - memory._status_kb("VmRSS") + 128 * 1024  # kB above what the process ever held
    if need > 2 * 2**20:
        pytest.skip("this process once held 2 GB more than it does now")
    with memory.Peak() as peak:
        held(need // 1024, seconds=0.0)  # no time to sample: only VmHWM can see it
    assert peak.kb == memory._status_kb("VmHWM") > hwm
    assert peak.kb >= hwm + 100 * 1024


def test_release_runs_anywhere():
    memory.release()  # glibc or not: never raises
