"""`draftwise serve` as a process (`python -m draftwise serve`): on SIGTERM it stops taking connections, finishes the
open request and the one queued behind it (one at a time) or decoding beside it (the continuous batch), and exits 0."""

import json
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest

from conftest import save_checkpoint, tiny_config, tiny_model, tiny_tokenizer

TOKENS = 2000  # a second or more of decoding on the tiny model: the signal comes in the middle of it


def wait_until(check, what: str, timeout: float = 30):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def up(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def refused(url: str) -> bool:
    """A new connection is refused (or, made just as the server stopped listening, closed unanswered)."""
    try:
        httpx.get(f"{url}/health", timeout=2)
        return False
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return True


def gauge(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=2).text
    return float(next(line for line in text.splitlines() if line.startswith(name + " ")).split()[1])


@pytest.mark.slow  # a real `draftwise serve` process: ~4 s of start-up, then a 2000-token stream
@pytest.mark.parametrize("max_batch", [1, 2])
def test_sigterm_drains_the_open_and_queued_requests_then_exits_0(tmp_path, max_batch):
    config = tiny_config(layers=4, max_position_embeddings=2048)  # a long context, for one long request
    target = save_checkpoint(tmp_path / "long", tiny_model(config, seed=1), tiny_tokenizer())
    cmd = [sys.executable, "-m", "draftwise", "serve", "--target", target, "--port", "0", "--threads", "1"]
    cmd += ["--max-batch", str(max_batch)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(90, proc.kill)  # a hung server fails the test instead of hanging it
    guard.start()
    try:
        line = proc.stdout.readline()
        port = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        assert port, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = f"http://127.0.0.1:{port[1]}"
        wait_until(lambda: up(url) or proc.poll() is not None, "the server did not come up")
        assert proc.poll() is None
        long = {"model": target, "prompt": [1], "max_tokens": TOKENS, "temperature": 0, "return_token_ids": True}
        long.update(stream=True, stream_options={"include_usage": True})
        short = {"model": target, "prompt": [1, 5], "max_tokens": 20, "temperature": 0}
        events, tokens = [], 0
        with ThreadPoolExecutor(1) as pool, httpx.stream("POST", f"{url}/v1/completions", json=long, timeout=30) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line:
                    continue
                events.append(line)
                if len(events) == 1:  # decoding: queue a second request behind it, then signal
                    queued = pool.submit(httpx.post, f"{url}/v1/completions", json=short, timeout=30)
                    if max_batch == 1:  # one at a time: it waits in the queue
                        wait_until(lambda: gauge(url, "draftwise_queue_depth") == 1, "it was not queued")
                    else:  # it joins the batch beside the long one (its 20 tokens may be done already)
                        beside = lambda: gauge(url, "draftwise_requests_running") == 2 or queued.done()  # noqa: E731
                        wait_until(beside, "it did not join the batch")
                    proc.send_signal(signal.SIGTERM)
                    wait_until(lambda: refused(url), "new connections were still taken after SIGTERM", 10)
                    assert proc.poll() is None  # refusing connections, yet still running: draining
                if line.startswith("data: {"):
                    chunk = json.loads(line[len("data: ") :])
                    tokens += sum(len(c.get("token_ids", [])) for c in chunk["choices"])
            second = queued.result()
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][len("data: ") :])["usage"]["completion_tokens"] == tokens == TOKENS
        assert json.loads(events[-3][len("data: ") :])["choices"][0]["finish_reason"] == "length"
        assert second.status_code == 200 and second.json()["usage"]["completion_tokens"] == 20
        assert proc.wait(30) == 0
        assert "stopped" in proc.stderr.read()
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
