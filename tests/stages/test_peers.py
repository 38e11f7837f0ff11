"""llama.cpp's own decoding and draftwise's own server as bench baselines: the same greedy tokens as the draftwise AR
(llama.cpp on an f32 GGUF; `draftwise serve` through HTTP), the servers' draft counts in the summary, no server left
behind, and their place in configs, grids and the CLI."""

import json
from pathlib import Path

import pytest

from draftwise import cli
from draftwise.cli.bench import baselines
from draftwise.config import BenchConfig, BenchGridConfig
from draftwise.config.bench import serve_args
from draftwise.errors import DraftwiseError
from draftwise.rundir import RunDir
from draftwise.stages import bench, peers

NGRAM_SERVER = "llama-server:--spec-type ngram-simple --spec-ngram-simple-size-n 1 --spec-ngram-simple-size-m 4"


def config(target, **kw):
    base = dict(
        target=target,
        backend="llama.cpp",
        suite="spec_bench",
        limit=2,
        max_new_tokens=12,
        warmup=0,
        threads=1,
        baselines=("ar", "llama-server", "llama-cpp"),
    )
    base.update(kw)
    return BenchConfig(**base)


def read(out: Path) -> tuple[list[dict], dict]:
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    return records, json.loads((out / "summary.json").read_text())


@pytest.fixture
def servers(monkeypatch):
    """Every LlamaServer the bench makes, to check by pid that none outlives the run."""
    made = []

    class Recorded(peers.LlamaServer):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)

    monkeypatch.setattr(peers, "LlamaServer", Recorded)
    return made


def gone(server) -> bool:
    return server.proc is not None and server.proc.poll() is not None and not Path(f"/proc/{server.pid}").exists()


def test_llama_cpp_baselines_give_the_engines_greedy_tokens(tiny_dir, tmp_path, servers, capsys):
    out = bench.run(config(tiny_dir), tmp_path / "run")
    records, summary = read(out)
    assert summary["baselines"]["llama-server"]["identical_to_ar"] == 1.0
    assert summary["baselines"]["llama-cpp"]["identical_to_ar"] == 1.0
    server = [r for r in records if r["method"] == "llama-server"]
    assert all(
        r["seconds"] == pytest.approx((r["timings"]["prompt_ms"] + r["timings"]["predicted_ms"]) / 1e3) for r in server
    )
    assert all(
        r["wall_s"] > 0 and r["prefill_s"] > 0 and r["timings"]["prompt_n"] == r["prompt_tokens"] for r in server
    )
    assert summary["methods"]["llama-server"]["wall_tokens_per_s"] > 0
    assert (out / "llama-server.log").is_file()
    assert len(servers) == 1 and all(gone(s) for s in servers)
    assert "llama-server" in capsys.readouterr().out


def test_speculative_server_reports_drafted_and_accepted(tiny_dir, tmp_path, servers, capsys):
    out = bench.run(config(tiny_dir, baselines=("ar", NGRAM_SERVER), max_new_tokens=24), tmp_path / "run")
    _, summary = read(out)
    s = summary["baselines"][NGRAM_SERVER]
    assert s["drafted"] > 0 and 0 <= s["accepted"] <= s["drafted"] and s["alpha"] == s["accepted"] / s["drafted"]
    assert s["identical_to_ar"] == 1.0
    assert f"{NGRAM_SERVER}: drafted {s['drafted']}" in capsys.readouterr().out
    assert all(gone(x) for x in servers)


def test_prompt_lookup_beside_the_engines_ngram_sd(tiny_dir, tmp_path):
    out = bench.run(
        config(tiny_dir, drafter="ngram", gamma=3, baselines=("ar", "llama-cpp-prompt-lookup")), tmp_path / "r"
    )
    records, summary = read(out)
    lookup = [r for r in records if r["method"] == "llama-cpp-prompt-lookup"]
    assert all(0 <= r["accepted"] <= r["drafted"] for r in lookup) and sum(r["drafted"] for r in lookup) > 0
    assert summary["baselines"]["llama-cpp-prompt-lookup"]["identical_to_ar"] == 1.0


def test_beside_the_lean_engine_on_an_f32_gguf(tiny_dir, tmp_path):
    out = bench.run(config(tiny_dir, backend="lean", baselines=("ar", "llama-cpp")), tmp_path / "r")
    assert read(out)[1]["baselines"]["llama-cpp"]["identical_to_ar"] == 1.0


def test_a_crashed_bench_leaves_no_server(tiny_dir, tmp_path, servers, monkeypatch):
    append = RunDir.append

    def crash_after_the_server(self, rec):
        append(self, rec)
        if rec["method"] == "llama-server":
            raise RuntimeError("crash")

    monkeypatch.setattr(RunDir, "append", crash_after_the_server)
    with pytest.raises(RuntimeError, match="crash"):
        bench.run(config(tiny_dir, baselines=("ar", "llama-server")), tmp_path / "run")
    assert len(servers) == 1 and servers[0].pid and gone(servers[0])


def test_missing_server_binary_is_one_line(tiny_dir, tmp_path):
    with pytest.raises(DraftwiseError, match="no llama-server at /no/such/binary"):
        bench.run(config(tiny_dir, baselines=("ar", "llama-server"), llama_server="/no/such/binary"), tmp_path / "r")


def test_baseline_names_and_their_checks():
    ok = BenchConfig(
        baselines=("ar", "llama-cpp", "llama-cpp-prompt-lookup", "llama-server", "llama-server:-md d.gguf")
    )
    assert len(ok.baselines) == 5
    with pytest.raises(DraftwiseError, match="unknown baseline 'llama-serverx'"):
        BenchConfig(baselines=("llama-serverx",))
    with pytest.raises(DraftwiseError, match="given twice"):
        BenchConfig(baselines=("llama-cpp", "llama-cpp"))
    with pytest.raises(DraftwiseError, match="cannot split its llama-server arguments"):
        BenchConfig(baselines=("llama-server:--alias 'open",))
    with pytest.raises(DraftwiseError, match="batch_size > 1"):
        BenchConfig(baselines=("ar", "llama-server"), batch_size=2)


def test_grid_runs_llama_cpp_baselines_once_per_temperature_and_lookup_per_point():
    names = ("ar", "llama-cpp", "llama-server:--spec-default", "llama-cpp-prompt-lookup")
    grid = BenchGridConfig(
        bench=BenchConfig(drafter="ngram", baselines=names), gammas=(2, 3), temperatures=(0, 1), batch_sizes=(1, 2)
    )
    points = grid.points()
    sd = [p for p in points if p.drafter]
    base = [p for p in points if not p.drafter]
    assert all(p.baselines == (("llama-cpp-prompt-lookup",) if p.batch_size == 1 else ()) for p in sd)
    assert sorted((p.temperature, p.batch_size, p.baselines) for p in base) == [
        (0.0, 1, ("ar", "llama-cpp", "llama-server:--spec-default")),
        (0.0, 2, ("ar",)),
        (1.0, 1, ("ar", "llama-cpp", "llama-server:--spec-default")),
        (1.0, 2, ("ar",)),
    ]


def test_cli_baselines_repeat_and_keep_server_arguments_whole():
    assert baselines(None) == ("ar",)
    assert baselines([""]) == ()
    assert baselines(["ar,llama-cpp", "llama-server:--spec-type ngram-simple,ngram-mod"]) == (
        "ar",
        "llama-cpp",
        "llama-server:--spec-type ngram-simple,ngram-mod",
    )
    assert baselines(["ar,llama-server:-md a.gguf,b"]) == ("ar", "llama-server:-md a.gguf,b")


def test_cli_passes_the_binary_and_the_backend(monkeypatch, tmp_path):
    from draftwise.cli import bench as bench_command

    seen = {}  # what the command would run (in a child process: the llama.cpp backend runs there)
    monkeypatch.setattr(bench_command, "run_stage", lambda run, config, *a: seen.setdefault("config", config))
    assert (
        cli.main(
            [
                "bench",
                "--backend",
                "llama.cpp",
                "--baseline",
                "ar",
                "--baseline",
                "llama-server:--spec-default",
                "--llama-server",
                "/opt/llama-server",
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 0
    )
    c = seen["config"]
    assert c.backend == "llama.cpp" and c.llama_server == "/opt/llama-server"
    assert c.baselines == ("ar", "llama-server:--spec-default")


def test_sampled_baselines_run_and_are_seeded(tiny_dir, tmp_path):
    cfg = config(tiny_dir, temperature=0.8, top_p=0.9, baselines=("ar", "llama-server", "llama-cpp"), limit=1)
    one, two = (read(bench.run(cfg, tmp_path / name))[0] for name in ("a", "b"))
    assert [r["tokens"] for r in one] == [r["tokens"] for r in two]  # each method draws from its seed
    assert all(r["new_tokens"] >= 1 for r in one)


# --- draftwise's own server as a baseline: `draftwise serve` measured through its HTTP API ---------------------------


@pytest.fixture
def served(monkeypatch):
    """Every DraftwiseServer the bench makes, to check by pid that none outlives the run."""
    made = []

    class Recorded(peers.DraftwiseServer):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            made.append(self)

    monkeypatch.setattr(peers, "DraftwiseServer", Recorded)
    return made


def test_served_commands_give_the_engines_greedy_tokens_through_http(tiny_dir, tmp_path, served):
    """`serve:ARGS` (SD with an n-gram drafter) and a bare `serve` (the bench's own options: plain decoding here) give
    AR's greedy tokens; their seconds are the client's wall time, beside the server's own figures."""
    explicit = f"serve:--target {tiny_dir} --drafter ngram --gamma 3 --threads 1"
    cfg = config(tiny_dir, backend="auto", baselines=("ar", explicit, "serve"), max_new_tokens=16)
    out = bench.run(cfg, tmp_path / "run")
    records, summary = read(out)
    for name in (explicit, "serve"):
        assert summary["baselines"][name]["identical_to_ar"] == 1.0
        mine = [r for r in records if r["method"] == name]
        assert len(mine) == 2 and all(r["seconds"] == r["wall_s"] > r["server_seconds"] > 0 for r in mine)
        assert all(0 < r["first_token_s"] <= r["wall_s"] and 0 < r["prefill_s"] < r["server_seconds"] for r in mine)
    sd = summary["methods"][explicit]
    assert sd["drafted"] > 0 and 0 <= sd["accepted"] <= sd["drafted"]  # the server's own counts, summed
    assert summary["methods"]["serve"]["drafted"] == 0  # the bench has no drafter: its bare serve decodes plainly
    assert served[1].args == ["--target", tiny_dir, "--threads", "1"]
    assert len(served) == 2 and all(gone(s) for s in served)
    assert (out / "serve.log").is_file()


def test_a_bare_serve_decodes_as_the_bench_does():
    c = BenchConfig(target="t", drafter="ngram:max=3", gamma=3, draft_stop=0.2, dtype="int8", threads=2)
    assert serve_args("serve", c) == [
        "--target", "t", "--drafter", "ngram:max=3", "--gamma", "3", "--draft-stop", "0.2", "--dtype", "int8",
        "--threads", "2",
    ]  # fmt: skip
    plain = BenchConfig(target="default", backend="llama.cpp", gguf_quant="q8_0", llama_exact=True)
    assert serve_args("serve", plain) == [
        "--target", "default", "--backend", "llama.cpp", "--gguf-quant", "q8_0", "--llama-exact",
    ]  # fmt: skip
    assert serve_args("serve:--export e --threads 2", c) == ["--export", "e", "--threads", "2"]
    assert serve_args("llama-server", c) is None and serve_args("server", c) is None


def test_serve_baselines_keep_their_commas_and_refuse_where_to_listen(capsys, tmp_path):
    explicit = "serve:--drafter 'suffix:d,factor=2,min_prob=0.1' --gamma 3"
    assert baselines(["ar," + explicit]) == ("ar", explicit)
    assert BenchConfig(baselines=("ar", "serve", explicit)).baselines == ("ar", "serve", explicit)
    for bad in ("serve:--port 8000", "serve:--export e --host=0.0.0.0"):
        with pytest.raises(DraftwiseError, match="is the bench's to set"):
            BenchConfig(baselines=("ar", bad))
    with pytest.raises(DraftwiseError, match="cannot split its serve arguments"):
        BenchConfig(baselines=("serve:--drafter 'open",))
    with pytest.raises(DraftwiseError, match="batch_size > 1"):
        BenchConfig(baselines=("ar", "serve"), batch_size=2)
    assert cli.main(["bench", "--baseline", "ar,serve:--target x --port 9", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--port is the bench's to set" in err[0]


def test_grid_runs_serve_commands_once_per_temperature_and_a_bare_serve_per_point():
    names = ("ar", "serve:--export e", "serve")
    grid = BenchGridConfig(
        bench=BenchConfig(drafter="ngram", baselines=names), gammas=(2, 3), temperatures=(0, 1), batch_sizes=(1, 2)
    )
    sd = [p for p in grid.points() if p.drafter]
    base = [p for p in grid.points() if not p.drafter]
    assert all(p.baselines == (("serve",) if p.batch_size == 1 else ()) for p in sd)  # it serves the point's drafter
    assert sorted((p.temperature, p.batch_size, p.baselines) for p in base) == [
        (0.0, 1, ("ar", "serve:--export e")),
        (0.0, 2, ("ar",)),
        (1.0, 1, ("ar", "serve:--export e")),
        (1.0, 2, ("ar",)),
    ]
    plain = BenchGridConfig(bench=BenchConfig(drafter=None, baselines=names), temperatures=(0, 1))
    assert [p.baselines for p in plain.points()] == [names, names]  # no drafter: a bare serve decodes plainly
