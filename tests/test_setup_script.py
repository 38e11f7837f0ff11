"""A set-up killed at any moment is repaired by the next run (the README's promise): `scripts/venv.sh` mends a venv
left without pip, or without a python that starts, keeping what it holds; and `scripts/setup.sh`, run on a copy of
the repository whose `.venv` is what a set-up killed in `python3 -m venv` leaves (`--without-pip`), completes and
keeps the llama.cpp build that is still there instead of compiling it again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYTHON = shutil.which("python3") or sys.executable  # what a fresh machine's set-up calls


def _pip_runs(venv: Path) -> bool:
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "--version"], capture_output=True)
    return done.returncode == 0


def _base_venv(venv: Path) -> None:
    """`python3 -m venv --without-pip`: a venv cut off before pip went in."""
    subprocess.run([PYTHON, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert not _pip_runs(venv)


def test_a_venv_without_pip_is_repaired_and_keeps_what_it_holds(tmp_path):
    venv = tmp_path / ".venv"
    _base_venv(venv)
    (venv / "llama.cpp").mkdir()
    (venv / "llama.cpp" / "kept").write_text("a build")
    subprocess.run(["bash", str(ROOT / "scripts" / "venv.sh"), str(venv)], check=True, timeout=600)
    assert _pip_runs(venv)
    assert (venv / "llama.cpp" / "kept").read_text() == "a build"


def test_a_venv_whose_python_is_gone_is_repaired(tmp_path):
    venv = tmp_path / ".venv"
    _base_venv(venv)
    for link in (venv / "bin").glob("python*"):
        link.unlink()  # killed before venv linked its interpreter
    subprocess.run(["bash", str(ROOT / "scripts" / "venv.sh"), str(venv)], check=True, timeout=600)
    assert _pip_runs(venv)


@pytest.mark.slow
def test_setup_completes_after_a_kill_in_venv_keeping_the_llamacpp_build(tmp_path):
    build = ROOT / ".venv" / "llama.cpp"
    if not (build / "draftwise-build.json").is_file():
        pytest.skip("no llama.cpp build with its record in .venv (run scripts/setup.sh)")
    copy = tmp_path / "repo"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    _base_venv(copy / ".venv")
    # what the killed set-up's earlier run had built: the compiled tree and the source it came from (hard links)
    for part in ("llama.cpp", "src"):
        subprocess.run(["cp", "-al", str(ROOT / ".venv" / part), str(copy / ".venv" / part)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTEST", "DRAFTWISE_CACHE"))}
    done = subprocess.run(["bash", "scripts/setup.sh"], cwd=copy, env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "build kept" in done.stdout, done.stdout[-2000:]
    assert _pip_runs(copy / ".venv")
