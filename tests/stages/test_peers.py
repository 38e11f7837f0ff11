"""llama.cpp's own decoding as bench baselines: the same greedy tokens as the draftwise llama.cpp AR on an f32 GGUF,
llama-server's draft counts in the summary, no server left behind, and their place in configs, grids and the CLI."""

import json
from pathlib import Path

import pytest

from draftwise import cli
from draftwise.cli.bench import baselines
from draftwise.config import BenchConfig, BenchGridConfig
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
    seen = {}
    monkeypatch.setattr(bench, "run", lambda config, out, executor=None: seen.setdefault("config", config))
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
