"""An in-process `draftwise serve` for the tests: the app on a free 127.0.0.1 port, uvicorn in a background thread."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import torch
import uvicorn

from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.serve import build, create_app, listen


class Running:
    """A served app on `port`; `served` is its state (engine, metrics, tokenizer)."""

    def __init__(self, served, port: int):
        self.served, self.port = served, port
        self.url = f"http://127.0.0.1:{port}"

    def client(self, **kw):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "x"), max_retries=0, **kw)

    def metric(self, name: str, labels: str = "") -> float:
        """One sample of /metrics (`name{labels}`), 0 when absent."""
        import httpx2 as httpx

        text = httpx.get(f"{self.url}/metrics", headers=self.auth()).text
        for line in text.splitlines():
            if line.startswith(f"{name}{{{labels}}} " if labels else f"{name} "):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def auth(self) -> dict:
        key = self.served.api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    def post(self, path: str, body, headers: dict | None = None, timeout: float = 30):
        """A raw POST (bytes or a JSON-able object): (status, headers, parsed JSON body or None)."""
        import http.client

        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request("POST", path, data, {"Content-Type": "application/json", **self.auth(), **(headers or {})})
            resp = conn.getresponse()
            raw = resp.read()
            with contextlib.suppress(ValueError):
                return resp.status, lower_headers(resp), json.loads(raw)
            return resp.status, lower_headers(resp), None
        finally:
            conn.close()


def lower_headers(resp) -> dict[str, str]:
    return {k.lower(): v for k, v in resp.getheaders()}


@contextlib.contextmanager
def serving(config):
    """`config` (a ServeConfig) built and served on a free port until the block ends (torch's thread count, which
    `build` sets, restored after)."""
    threads = torch.get_num_threads()
    served = build(config)
    served.engine.start()  # on a thread: the tests' main thread runs them
    sock = listen("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(served), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield Running(served, sock.getsockname()[1])
    finally:
        server.should_exit = True
        thread.join(30)
        served.engine.stop()
        sock.close()
        torch.set_num_threads(threads)


def ar(served, ids: list[int], n: int, params=None, seed: int = 0) -> list[int]:
    """draftwise's own decoding of `ids` on the served target without a drafter (greedy unless `params`), the
    target's EOS included: what the server must return at temperature 0. Call it while the server is idle."""
    params = params or SamplingParams(0.0)
    target = served.engine.target
    with torch.inference_mode():
        gen = torch.Generator(device=target.lm.device).manual_seed(seed)
        return generate(target.lm, ids, params, n, gen, eos=target.eos_ids).tokens


def assert_error(status: int, body, want: int, param="any", code="any") -> dict:
    """`body` is OpenAI's error object and `status` is `want`; its `param` and `code` checked when given."""
    assert status == want, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    if param != "any":
        assert err["param"] == param, err
    if code != "any":
        assert err["code"] == code, err
    return err
