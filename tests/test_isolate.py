"""Native code that can fault runs in a child process: a crash there costs that call, never the caller."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftwise import isolate
from draftwise.errors import DraftwiseError

ROOT = Path(__file__).resolve().parents[1]


def double(x):
    return {"twice": 2 * x, "pid": os.getpid()}


def refuse(x):
    raise DraftwiseError(f"cannot do {x}")


def broken(x):
    raise ValueError("a bug")


def segfault(runtime):
    isolate.crumb(runtime=runtime, call="llama_decode of 40 token(s) on x.gguf")
    ctypes.string_at(0)  # a real SIGSEGV, in native code


def server_died(runtime):
    isolate.crumb(runtime=runtime)
    raise isolate.NativeCrash("llama-server", "SIGILL", None, "its start (log: x.log)", "llama-server")


def test_a_call_runs_in_another_process_and_returns_its_result():
    out = isolate.run(double, 21, label="x")
    assert out["twice"] == 42 and out["pid"] != os.getpid()


def test_an_error_in_the_child_comes_back_in_one_line():
    with pytest.raises(DraftwiseError, match="^cannot do that$"):
        isolate.run(refuse, "that", label="x")
    with pytest.raises(DraftwiseError, match="^x: ValueError: a bug$"):
        isolate.run(broken, 1, label="x")


def test_a_segfault_in_the_child_is_a_one_line_crash_that_names_the_runtime_and_the_call():
    with pytest.raises(isolate.NativeCrash) as e:
        isolate.run(segfault, "llama.cpp-Q4_1", label="a row")
    crash = e.value
    assert (crash.signal, crash.runtime, crash.row) == ("SIGSEGV", "llama.cpp-Q4_1", "llama.cpp-Q4_1")
    assert str(crash).startswith("llama.cpp-Q4_1: the engine died with SIGSEGV in llama_decode of 40 token(s)")
    assert "\n" not in str(crash)


def test_a_crash_without_crumbs_is_named_by_its_label():
    with pytest.raises(isolate.NativeCrash, match="^a row: the engine died with SIGSEGV"):
        isolate.run(segfault, "", label="a row")


def test_a_server_the_child_started_that_died_is_a_crash_of_the_childs_runtime():
    with pytest.raises(isolate.NativeCrash) as e:
        isolate.run(server_died, "llama.cpp-Q8_0", label="x")
    assert (e.value.signal, e.value.runtime) == ("SIGILL", "llama.cpp-Q8_0")
    assert str(e.value) == "llama.cpp-Q8_0: llama-server died with SIGILL in its start (log: x.log)"


def test_crumbs_and_fault_points_are_no_ops_outside_an_isolated_child(monkeypatch):
    isolate.crumb(runtime="r", call="c")  # nothing to write to: no effect
    monkeypatch.setattr(isolate, "_FAULT", "segv:something-else")
    isolate.fault_point("llama.cpp")


def test_a_segfaulting_test_fails_alone_and_pytest_goes_on(tmp_path):
    """The suite's own configuration (pyproject: one xdist worker) keeps pytest alive when native code kills a test."""
    (tmp_path / "test_native.py").write_text(
        "import ctypes\n\ndef test_dies():\n    ctypes.string_at(0)\n\ndef test_after():\n    assert True\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "-p", "no:cacheprovider", "-q"]
        + ["--rootdir", str(tmp_path), str(tmp_path / "test_native.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "1 failed, 1 passed" in done.stdout and "test_dies" in done.stdout, done.stdout[-2000:]
