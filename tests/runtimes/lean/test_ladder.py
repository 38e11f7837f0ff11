"""The integer kernel's path is proven by a smoke test in a child process before it is trusted: a path whose child
dies falls to the next rung, never crashing the parent; the verdict is kept per CPU and kernel build."""

import json

import pytest

from draftwise import machine
from draftwise.runtimes.lean import kernels, ladder

BEST = kernels._kernel().draftwise_int8_isa() if kernels.kernel_available() else 0


def test_a_rung_that_fails_falls_to_the_next():
    tried = []

    def test(isa):
        tried.append(isa)
        return isa == 1

    assert ladder.choose(2, test) == (1, {"avx512": False, "avx2": True})
    assert ladder.choose(2, lambda isa: False) == (0, {"avx512": False, "avx2": False})  # torch: the same function
    assert ladder.choose(0, test) == (0, {})
    assert tried == [2, 1]
    assert ladder.choose(3, lambda isa: isa < 3) == (2, {"amx": False, "avx512": True})  # AMX refused: AVX-512


def test_the_verdict_is_kept_per_machine(tmp_path):
    calls = []

    def test(isa):
        calls.append(isa)
        return True

    assert ladder.proven(2, "build", tmp_path, test) == 2
    assert ladder.proven(2, "build", tmp_path, test) == 2
    assert calls == [2]  # proven once
    published = json.loads((tmp_path / machine.MATRIX_PATH_RECORD).read_text())
    assert published == {"cpu": machine.cpu_key(), "path": "avx512"}  # what the machine's description reads
    assert ladder.proven(1, "build", tmp_path, test) == 1  # another best (another CPU report): proven again
    assert ladder.proven(2, "other-build", tmp_path, test) == 2
    assert calls == [2, 1, 2]


@pytest.mark.skipif(not BEST, reason="no int8 C kernel on this machine")
def test_the_best_path_passes_its_smoke_test_in_a_child():
    assert ladder.smoke(BEST)
    assert kernels.int8_isa() == BEST  # this machine's proven path is the best it reports
    here = machine.facts()
    assert here["matrix_path"] == ladder.NAMES[BEST]
    assert f"int8/q4 kernel: {ladder.NAMES[BEST]} (smoke-tested)" in machine.line(here)


@pytest.mark.skipif(not BEST, reason="no int8 C kernel on this machine")
def test_a_path_whose_child_dies_falls_to_the_next(tmp_path, monkeypatch):
    """A stand-in that dies (the child aborts, as on SIGILL): the parent reads its status and takes the next path."""
    monkeypatch.setenv("DRAFTWISE_SMOKE_DIE", ladder.NAMES[BEST])
    assert not ladder.smoke(BEST)
    assert ladder.proven(BEST, "build", tmp_path) == BEST - 1
    kept = (tmp_path / next(p.name for p in tmp_path.iterdir())).read_text()
    assert f'"{ladder.NAMES[BEST]}": false' in kept
