"""llama-server as a peer: the same greedy tokens as the draftwise llama.cpp engine, its speculative counts, and a
one-line error for each way a start can fail (no binary, a binary that exits, a port in use, a start that hangs)."""

import os
import socket
import sys
from pathlib import Path

import pytest
import torch

from draftwise.errors import DraftwiseError
from draftwise.peers import llama_server
from draftwise.peers.llama_server import LlamaServer
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams

pytestmark = pytest.mark.slow  # llama-server processes: the slow tier

PROMPT = "w1 w2 w3 w4 w5 w6 w1 w2 w3 w4 w5 w6 w1 w2 w3"


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


@pytest.fixture(scope="module")
def target(tiny_dir):
    return load(tiny_dir, ModelOptions(backend="llama.cpp"))  # the tiny Llama written as an f32 GGUF, run in llama.cpp


def fake_binary(tmp_path, body: str) -> str:
    path = tmp_path / "llama-server"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def test_greedy_completion_is_the_engines_ar(target, tmp_path):
    ids = target.encode(PROMPT)
    ar = generate(target.lm, ids, SamplingParams(), 20, torch.Generator().manual_seed(0), eos=target.eos_ids)
    with LlamaServer(target.gguf, threads=1, n_ctx=256, log=tmp_path / "s.log") as server:
        first = server.complete(ids, 20)
        again = server.complete(ids, 20)  # no prompt cache: the same prefill paid again, the same tokens
        a = server.complete(ids, 20, temperature=0.9, seed=5)
        b = server.complete(ids, 20, temperature=0.9, seed=5)
        pid = server.pid
    assert first.tokens == ar.tokens == again.tokens
    assert first.timings["prompt_n"] == len(ids) and first.timings["cache_n"] == again.timings["cache_n"] == 0
    assert first.seconds > 0 and first.wall_s > 0 and first.drafted == 0
    assert a.tokens == b.tokens  # a seeded draw
    assert not alive(pid)
    assert "listening on http://127.0.0.1" in (tmp_path / "s.log").read_text()


def test_speculative_server_reports_its_draft_counts(target):
    ids = target.encode(PROMPT)
    args = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "1", "--spec-ngram-simple-size-m", "4"]
    with LlamaServer(target.gguf, threads=1, n_ctx=256, args=args) as server:
        c = server.complete(ids, 24)
        plain = generate(target.lm, ids, SamplingParams(), 24, torch.Generator().manual_seed(0), eos=target.eos_ids)
    assert c.drafted > 0 and 0 <= c.accepted <= c.drafted
    assert {"draft_n", "draft_n_accepted"} <= set(c.timings)
    assert c.tokens == plain.tokens  # greedy SD is lossless


def test_missing_binary_is_one_line(monkeypatch, tmp_path):
    with pytest.raises(DraftwiseError, match="no llama-server at /no/such/llama-server") as e:
        LlamaServer("x.gguf", threads=1, n_ctx=256, binary="/no/such/llama-server").start()
    assert "\n" not in str(e.value)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    with pytest.raises(DraftwiseError, match="^no llama-server: give --llama-server PATH or run scripts/setup.sh$"):
        llama_server.find_binary()


def test_binary_that_exits_at_start(tmp_path):
    binary = fake_binary(tmp_path, 'echo "starting"; echo "fatal: cannot read the model" >&2; exit 1')
    with pytest.raises(DraftwiseError, match=r"exited with code 1 at start: fatal: cannot read the model \(log: ") as e:
        LlamaServer("x.gguf", threads=1, n_ctx=256, binary=binary, log=tmp_path / "s.log").start()
    assert "\n" not in str(e.value)


def test_start_that_never_becomes_ready_times_out_and_is_killed(tmp_path):
    binary = fake_binary(tmp_path, "exec sleep 60")
    server = LlamaServer("x.gguf", threads=1, n_ctx=256, binary=binary, log=tmp_path / "s.log", start_timeout=0.5)
    with pytest.raises(DraftwiseError, match="did not become ready within 0.5 s"):
        server.start()
    assert server.proc.poll() is not None and not alive(server.pid)


def test_port_in_use(target):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(DraftwiseError, match=f"port {port} on 127.0.0.1 is already in use"):
            LlamaServer(target.gguf, threads=1, n_ctx=256, port=port).start()


def test_reserved_options_are_refused():
    with pytest.raises(DraftwiseError, match="--port is draftwise's to set"):
        LlamaServer("x.gguf", threads=1, n_ctx=256, args=["--port", "8080"])


def test_binary_found_beside_python(monkeypatch, tmp_path):
    binary = fake_binary(tmp_path, "exit 0")
    monkeypatch.setenv("PATH", os.devnull)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    assert llama_server.find_binary() == Path(binary)


def test_a_server_that_dies_mid_run_is_one_line(target, tmp_path):
    with LlamaServer(target.gguf, threads=1, n_ctx=256, log=tmp_path / "s.log") as server:
        server.proc.kill()
        server.proc.wait()
        with pytest.raises(DraftwiseError, match=r"^llama-server died with SIGKILL in a request \(log: "):
            server.complete(target.encode(PROMPT), 4)
