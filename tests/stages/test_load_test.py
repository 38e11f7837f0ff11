"""`draftwise load-test` on the tiny checkpoint served by `draftwise serve` processes: every request answered and
recorded, the summary derived from the records, a killed run resumed block by block, failures and 503s recorded
rather than dropped, bad configs refused in one line; llama-server (slow tier) when its binary is there."""

import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from draftwise import cli
from draftwise.config import LoadConfig
from draftwise.errors import DraftwiseError
from draftwise.peers.llama_server import find_binary
from draftwise.stages import load_test

PROMPTS = ["w1 w2 w3 w4 w5 w1 w2 w3", "w7 w8 w9 w7 w8 w9 w7", "w10 w11 w12 w13 w10 w11 w12"]
REQUEST_KEYS = {
    "kind", "server", "clients", "attempt", "client", "request", "prompt_id", "prompt_tokens", "new_tokens",
    "ttft_s", "wall_s", "start_s", "end_s", "ok", "error", "retries", "finish_reason", "drafted", "accepted",
    "max_tokens", "temperature",
}  # fmt: skip


def serve(tiny_dir: str, extra: str = "") -> str:
    return f"serve:--target {tiny_dir} --drafter ngram --gamma 3 --threads 1{extra}"


@pytest.fixture
def prompts(tmp_path) -> str:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return str(path)


def config(tiny_dir, prompts, **kw) -> LoadConfig:
    base = dict(
        servers=(serve(tiny_dir),),
        clients=(1, 3),
        requests=2,
        max_new_tokens=8,
        target=tiny_dir,
        prompts=prompts,
        threads=1,
        timeout=120.0,
    )
    return LoadConfig(**{**base, **kw})


def read(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_every_request_is_answered_and_the_summary_comes_from_the_records(tiny_dir, prompts, tmp_path, capsys):
    cfg = config(tiny_dir, prompts)
    out = load_test.run(cfg, tmp_path / "run")
    records = read(out)
    requests = [r for r in records if r["kind"] == "request"]
    assert len(requests) == 1 * 2 + 3 * 2 and all(set(r) == REQUEST_KEYS for r in requests)
    assert all(r["ok"] and r["error"] is None and r["new_tokens"] == 8 and r["retries"] == 0 for r in requests)
    assert all(0 < r["ttft_s"] <= r["wall_s"] and r["start_s"] >= 0 and r["end_s"] > r["start_s"] for r in requests)
    assert all(0 <= r["accepted"] <= r["drafted"] for r in requests)  # the server's own counts (n-gram drafter)
    # client k's j-th request is prompt (k * requests + j) mod 3
    three = sorted((r["client"], r["request"], r["prompt_id"]) for r in requests if r["clients"] == 3)
    assert [p for *_, p in three] == [f"user/{(k * 2 + j) % 3 + 1}" for k in range(3) for j in range(2)]
    blocks = [r for r in records if r["kind"] == "block"]
    assert [(b["clients"], b["attempt"]) for b in blocks] == [(1, 1), (3, 1)]
    assert "--threads" in blocks[0]["command"] and "127.0.0.1" in blocks[0]["command"]

    summary = json.loads((out / "summary.json").read_text())
    assert summary["reference"] is None and len(summary["blocks"]) == 2
    for b in summary["blocks"]:
        mine = [r for r in requests if r["clients"] == b["clients"]]
        assert (b["sent"], b["ok"], b["failed"], b["lost"], b["retries"]) == (len(mine), len(mine), 0, 0, 0)
        span = max(r["end_s"] for r in mine) - min(r["start_s"] for r in mine)
        assert b["aggregate_tokens_per_s"] == pytest.approx(8 * len(mine) / span)
        assert b["ttft_p50_s"] == pytest.approx(statistics.median(r["ttft_s"] for r in mine))
        assert b["ttft_p99_s"] == pytest.approx(np.percentile([r["ttft_s"] for r in mine], 99))
        per_client = [16 / sum(r["wall_s"] for r in mine if r["client"] == k) for k in range(b["clients"])]
        assert b["tokens_per_s_per_client"] == pytest.approx(statistics.mean(per_client))
        assert b["vs_llama_server"] is None
    assert (out / "load_test.png").stat().st_size > 0
    assert len(list((out / "logs").glob("*.log"))) == 2
    table = capsys.readouterr().out
    assert "TTFT p50" in table and "aggregate" in table and str(out) in table


def test_a_killed_run_resumes_without_redoing_finished_blocks(tiny_dir, prompts, tmp_path, monkeypatch):
    cfg, calls, pids = config(tiny_dir, prompts), [], []
    real = load_test.run_block

    def killed_in_second_block(block, server, append, tick):
        calls.append((block.clients, block.attempt))
        if len(calls) < 2:
            return real(block, server, append, tick)
        appended = []

        def dying(rec):  # the kill lands after two of the block's six records
            append(rec)
            appended.append(rec)
            pids.append(server.pid)
            if len(appended) == 2:
                raise RuntimeError("killed")

        return real(block, server, dying, tick)

    monkeypatch.setattr(load_test, "run_block", killed_in_second_block)
    with pytest.raises(RuntimeError, match="killed"):
        load_test.run(cfg, tmp_path / "run")
    assert calls == [(1, 1), (3, 1)] and not alive(pids[-1])  # the block's server stopped on the crash
    first = read(tmp_path / "run")
    assert [r["kind"] for r in first] == ["request"] * 2 + ["block"] + ["request"] * 2

    calls.clear()
    monkeypatch.setattr(load_test, "run_block", lambda *a: calls.append((a[0].clients, a[0].attempt)) or real(*a))
    out = load_test.run(cfg, tmp_path / "run")
    assert calls == [(3, 2)]  # the finished block is not redone; the cut one runs again whole
    records = read(out)
    assert records[: len(first)] == first  # appended, never rewritten
    again = [r for r in records[len(first) :] if r["kind"] == "request"]
    assert len(again) == 6 and {r["attempt"] for r in again} == {2}
    summary = json.loads((out / "summary.json").read_text())
    assert [(b["clients"], b["ok"], b["sent"]) for b in summary["blocks"]] == [(1, 2, 2), (3, 6, 6)]


def test_failed_requests_and_503s_are_recorded_not_dropped(tiny_dir, tmp_path):
    path = tmp_path / "prompts.txt"  # the third prompt is past the tiny model's context of 256: a 400 answer
    path.write_text("\n".join(PROMPTS[:2] + [" ".join(["w3"] * 300)]) + "\n")
    one_at_a_time = serve(tiny_dir, " --max-queue 0 --max-batch 1")
    cfg = config(tiny_dir, str(path), servers=(one_at_a_time,), clients=(3,), requests=2)
    out = load_test.run(cfg, tmp_path / "run")
    requests = [r for r in read(out) if r["kind"] == "request"]
    failed = [r for r in requests if not r["ok"]]
    assert len(requests) == 6 and len(failed) == 2  # prompt 3 is client 1's first and client 2's second
    assert all("256" in r["error"] and r["new_tokens"] == 0 for r in failed)
    assert sum(r["retries"] for r in requests) > 0  # one request decodes at a time, none waits: 503s, retried
    block = json.loads((out / "summary.json").read_text())["blocks"][0]
    assert (block["ok"], block["failed"], block["lost"]) == (4, 2, 0) and block["retries"] > 0
    assert list(block["errors"].values()) == [2]


def test_a_prompt_files_lines_ask_for_their_own_answer_lengths(tiny_dir, tmp_path):
    """A mixed workload: each line's max_tokens and temperature are what its requests ask for (the others get
    --max-new-tokens and --temperature)."""
    path = tmp_path / "mixed.jsonl"
    lines = [
        {"prompt": PROMPTS[0], "max_tokens": 3},
        {"prompt": PROMPTS[1], "temperature": 1.0},
        {"prompt": PROMPTS[2], "max_tokens": 12},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = load_test.run(config(tiny_dir, str(path), clients=(3,), requests=1), tmp_path / "run")
    got = {
        r["prompt_id"]: (r["max_tokens"], r["new_tokens"], r["temperature"])
        for r in read(out)
        if r["kind"] == "request"
    }
    assert got == {"user/1": (3, 3, 0.0), "user/2": (8, 8, 1.0), "user/3": (12, 12, 0.0)}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--clients", "0"], "clients must all be >= 1, got 0"),
        (["--server", "vllm:--port 1"], "unknown server 'vllm:--port 1': give serve:ARGS"),
        (["--server", "serve:--gamma '2"], "cannot split its serve arguments"),
        (["--server", "llama-server", "--server", "llama-server"], "server 'llama-server' is given twice"),
        (["--requests", "0"], "requests must be >= 1"),
    ],
)
def test_bad_configs_are_refused_in_one_line(argv, message, tmp_path, capsys):
    assert cli.main(["load-test", *argv, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_server_arguments_the_load_test_sets_are_refused_before_the_folder(tiny_dir, prompts, tmp_path):
    cfg = config(tiny_dir, prompts, servers=(serve(tiny_dir, " --port 9000"),))
    with pytest.raises(DraftwiseError, match="--port is the benchmark's to set"):
        load_test.run(cfg, tmp_path / "run")
    with pytest.raises(DraftwiseError, match="-m is draftwise's to set"):
        load_test.run(replace(cfg, servers=("llama-server:-m x.gguf",)), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def _llama_server() -> bool:
    try:
        return bool(find_binary())
    except DraftwiseError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _llama_server(), reason="no llama-server binary")
def test_llama_server_plain_and_speculative_under_load(tiny_dir, prompts, tmp_path):
    servers = ("llama-server", "llama-server:--spec-type ngram-simple", serve(tiny_dir))
    out = load_test.run(config(tiny_dir, prompts, servers=servers, clients=(1, 2)), tmp_path / "run")
    records = read(out)
    assert all(r["ok"] and r["new_tokens"] > 0 for r in records if r["kind"] == "request")
    assert all(r["drafted"] == 0 for r in records if r["kind"] == "request" and r["server"] == "llama-server")
    commands = {(b["server"], b["clients"]): b["command"] for b in records if b["kind"] == "block"}
    assert commands[("llama-server", 2)][-2:] == ["-np", "2"]  # as many slots as clients
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reference"] == "llama-server"
    for b in summary["blocks"]:
        assert b["ok"] == b["sent"] and b["lost"] == 0
        assert (b["vs_llama_server"] == pytest.approx(1.0)) == (b["server"] == "llama-server")


def test_servers_that_differ_past_the_cut_get_log_files_of_their_own():
    from draftwise.peers.clients import log_name

    long = "serve:--target default --dtype int8 --drafter 'suffix:runs/load/gen-data,factor=2,min_prob=0.1' --gamma 2"
    assert log_name(long, 4) != log_name(long + " --max-batch 1", 4)
    assert log_name("llama-server:--spec-default", 8) == "llama-server_--spec-default-c8.log"
    assert all(len(log_name(s, 16)) <= 80 + len("-c16.log") for s in (long, long + " --max-batch 1"))
