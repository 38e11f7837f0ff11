"""Each bad input gives one clear line on stderr and exit status 2; every command's parser is derived from its
config, each option declared once."""

import argparse
import dataclasses

import pytest
import torch

from draftwise import config as cfg
from draftwise.cli import build, config_of, main
from draftwise.cli.options import flags
from draftwise.errors import DraftwiseError


def run_cli(capsys, *args):
    code = main(["bench", *args])
    err = capsys.readouterr().err.strip().splitlines()
    return code, err[-1] if err else ""


@pytest.mark.parametrize(
    "args,message",
    [
        (["--target", "/no/such/dir"], "model not found: /no/such/dir"),
        (["--gamma", "0"], "gamma (lookahead) must be >= 1"),
        (["--baseline", "vllm"], "unknown baseline 'vllm'"),
        (["--drafter", "layers:0,99"], "the target has layers 0..3"),
    ],
)
def test_bad_arguments(capsys, tmp_path, tiny_dir, args, message):
    argv = ["--target", tiny_dir, "--drafter", "layers:0", "--out", str(tmp_path / "r"), "--limit", "1"]
    code, line = run_cli(capsys, *argv, *args)
    assert code == 2 and line.startswith("draftwise: error: ") and message in line


def test_empty_prompt_file(capsys, tmp_path, tiny_dir):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    code, line = run_cli(capsys, "--target", tiny_dir, "--prompts", str(empty), "--out", str(tmp_path / "r"))
    assert code == 2 and "prompt file has no prompts" in line


def test_pickle_only_drafter(capsys, tmp_path, tiny_dir):
    d = tmp_path / "pickled"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama", "architectures": ["LlamaForCausalLM"]}')
    torch.save({}, d / "pytorch_model.bin")
    code, line = run_cli(capsys, "--target", tiny_dir, "--drafter", str(d), "--out", str(tmp_path / "r"))
    assert code == 2 and "refusing pickle weights" in line


def test_cli_runs_a_bench(capsys, tmp_path, tiny_dir):
    code = main(
        [
            "bench",
            "--target",
            tiny_dir,
            "--drafter",
            "layers:0,1",
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--warmup",
            "0",
            "--out",
            str(tmp_path / "r"),
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "tokens/s" in out
    assert "int8/q4 kernel:" in out  # the route was proven before the machine was described (`prove_matrix_route`)


def test_the_matrix_route_is_proven_before_the_command_runs(monkeypatch, tmp_path, tiny_dir):
    """A machine's first run names its matrix paths too: the ladder runs before the run folder describes the machine."""
    import draftwise.cli as cli
    from draftwise.runtimes.lean import kernels

    order = []
    monkeypatch.setattr(kernels, "route", lambda: order.append("route"))
    parser, commands = cli.build()
    bench = commands["bench"]
    commands["bench"] = bench._replace(run=lambda config, args: order.append("run"))
    monkeypatch.setattr(cli, "build", lambda: (parser, commands))
    assert main(["bench", "--target", tiny_dir, "--out", str(tmp_path / "r")]) == 0
    assert order == ["route", "run"]


# --- the parsers are derived from the configs: every option declared once, on its field ---------------------------

PARSER, COMMANDS = build()
# what each command needs besides its defaults: (argv, the config's non-default fields)
MINIMAL = {
    "agree": (["--drafter", "d", "--out", "o"], {"drafter": "d"}),
    "distill": (["--drafter", "d", "--data", "g", "--out", "o"], {"drafter": "d", "data": "g"}),
    "train-feature": (["--data", "g", "--out", "o"], {"data": "g"}),
    "predict": (["--profile", "p"], {"profile": "p"}),
    "export-gguf": (["m", "--out", "o.gguf"], {"model": "m"}),
    "serve": ([], {}),  # no run folder: it serves
}


def config_classes() -> list[type]:
    return [v for v in vars(cfg).values() if isinstance(v, type) and dataclasses.is_dataclass(v)]


def test_every_field_is_an_option_with_help_or_marked_internal():
    for cls in config_classes():
        for f in dataclasses.fields(cls):
            assert ("help" in f.metadata) != ("internal" in f.metadata), f"{cls.__name__}.{f.name}"
            assert f.metadata.get("help") or f.metadata.get("internal"), f"{cls.__name__}.{f.name}: say why"


def test_every_config_with_options_is_a_command():
    with_options = {cls for cls in config_classes() if cfg.user_fields(cls)}
    assert with_options == {c.config for c in COMMANDS.values() if cfg.user_fields(c.config)}
    assert {c.config for c in COMMANDS.values() if not cfg.user_fields(c.config)} == {cfg.ReportConfig}  # --out only


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_user_field_is_reachable_from_its_command(name):
    command = COMMANDS[name]
    actions = {a.dest: a for a in command.parser._actions}
    help_text = command.parser.format_help()
    for f in cfg.user_fields(command.config):
        assert f.name in actions, f"{name}: no flag for {command.config.__name__}.{f.name}"
        assert actions[f.name].help, f"{name} {f.name}: no help"
        assert actions[f.name].default in (argparse.SUPPRESS, None), f"{name} {f.name}: a default in the parser"
        if not f.metadata.get("positional"):
            assert all(flag in help_text for flag in flags(f))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_defaults_are_the_dataclass_defaults(name):
    argv, given = MINIMAL.get(name, (["--out", "o"], {}))
    assert config_of([name, *argv]) == COMMANDS[name].config(**given)


B = cfg.BenchConfig
OLD_COMMAND_LINES = [  # README.md, docs/ and the tests' command lines, as they parsed before the configs declared them
    (
        "design --target default --minutes 30 --threads 2 --out runs/design",
        cfg.DesignConfig(target="default", minutes=30.0, threads=2),
    ),
    (
        "design --fixed-sizes --no-lookups --no-scheduler --engines lean,llama.cpp --gguf-quants f32,q8_0 "
        "--temperatures 0,0.5 --wide-layers 2 --budget 7M --loss tvd --out d",
        cfg.DesignConfig(
            plan=False,
            lookups=False,
            scheduler=False,
            rows=("lean", "llama.cpp"),
            gguf_quants=("f32", "q8_0"),
            temperatures=(0.0, 0.5),
            wide_layers=(2,),
            budget="7M",
            loss="tvd",
        ),
    ),
    (
        "bench --target default --drafter ngram --gamma 3 --limit 4 --max-new-tokens 64 --threads 2 --out /tmp/first",
        B(drafter="ngram", gamma=3, limit=4, max_new_tokens=64, threads=2),
    ),
    (
        "bench --target default --drafter layers:0,29 --gamma 4 --limit 10 --max-new-tokens 128 --baseline "
        "ar,hf-generate,hf-assisted --threads 2 --out runs/foundation",
        B(drafter="layers:0,29", baselines=("ar", "hf-generate", "hf-assisted"), threads=2),
    ),
    (
        "bench --drafter layers:0 --limit 0 --baseline ar --baseline 'llama-server:--spec-type ngram-simple,ngram-mod' "
        "--temperature 0.7 --out b",
        B(
            drafter="layers:0",
            limit=None,
            baselines=("ar", "llama-server:--spec-type ngram-simple,ngram-mod"),
            temperature=0.7,
        ),
    ),
    ("bench --drafter layers:0 --batch-size 2 --top-p 0.9 --out b", B(drafter="layers:0", batch_size=2, top_p=0.9)),
    ("bench --baseline '' --drafter ngram --out b", B(drafter="ngram", baselines=())),
    (
        "bench --drafter layers:0 --drafter layers:0,2 --gamma 1,3 --limit 2 --max-new-tokens 24 --warmup 0 --out g",
        cfg.BenchGridConfig(
            bench=B(drafter="layers:0", gamma=1, limit=2, max_new_tokens=24, warmup=0),
            drafters=("layers:0", "layers:0,2"),
            gammas=(1, 3),
            temperatures=(0.0,),
            batch_sizes=(1,),
        ),
    ),
    (
        "bench --drafter layers:0@2 --drafter ngram:max=2@5 --temperature 0,1 --out g",
        cfg.BenchGridConfig(
            bench=B(drafter="layers:0", gamma=2),
            drafters=("layers:0", "ngram:max=2"),
            drafter_gammas=(2, 5),
            temperatures=(0.0, 1.0),
            batch_sizes=(1,),
        ),
    ),
    (
        "profile --target default --drafter layers:0,29 --drafter ngram --gammas 1,2,3,4 --batch 1 --context 256 "
        "--threads 2 --out p",
        cfg.ProfileConfig(drafters=("layers:0,29", "ngram"), gammas=(1, 2, 3, 4), batches=(1,), threads=2),
    ),
    (
        "sweep --target default --vocab 0,8192 --backend llama.cpp --gguf-quant q8_0 --budget 7M --batch 1 --out s",
        cfg.SweepConfig(vocabs=(0, 8192), backend="llama.cpp", gguf_quant="q8_0", budget="7M", batches=(1,)),
    ),
    (
        "predict --profile P --bench R --alpha 0.6 --batch 4 --gammas 1,2",
        cfg.PredictConfig(profile="P", bench="R", alpha=0.6, batch=4, gammas=(1, 2)),
    ),
    (
        "prune --target default --shape layers=4 --method l0 --draft-vocab 8192 --vocab-data g --out runs/p4",
        cfg.PruneConfig(shape="layers=4", method="l0", draft_vocab=8192, vocab_data="g"),
    ),
    (
        "agree --target default --drafter runs/p4 --gammas 1,2 --backend llama.cpp --out runs/a4",
        cfg.AgreeConfig(drafter="runs/p4", gammas=(1, 2), backend="llama.cpp"),
    ),
    (
        "quality --target default --runtimes lean:int8,llama.cpp,llama.cpp:q8_0 --out q",
        cfg.QualityConfig(runtimes=("lean:int8", "llama.cpp", "llama.cpp:q8_0")),
    ),
    (
        "gen-data --target default --split train --suites all --max-new-tokens 128 --temperatures 0,1 --out runs/data",
        cfg.GenDataConfig(),
    ),
    (
        "distill --target default --drafter runs/p4 --data runs/data --loss tvd --minutes 10 --out runs/d4",
        cfg.DistillConfig(drafter="runs/p4", data="runs/data"),
    ),
    (
        "distill --drafter d --data g --tokens 5000 --train-embeddings --out d",
        cfg.DistillConfig(drafter="d", data="g", tokens=5000, minutes=None, train_embeddings=True),
    ),
    ("export-gguf default --quant q8_0 --out F.gguf", cfg.ExportGgufConfig(model="default", quant="q8_0")),
]


@pytest.mark.parametrize("line,expected", OLD_COMMAND_LINES, ids=[line[:40] for line, _ in OLD_COMMAND_LINES])
def test_old_command_lines_give_the_same_configs(line, expected):
    import shlex

    assert config_of(shlex.split(line)) == expected


def test_agree_and_prune_take_dtype_and_device():
    assert config_of(
        ["agree", "--drafter", "d", "--dtype", "bf16", "--device", "cuda", "--out", "o"]
    ) == cfg.AgreeConfig(drafter="d", dtype="bf16", device="cuda")
    assert config_of(["prune", "--dtype", "fp16", "--device", "cuda:1", "--out", "o"]) == cfg.PruneConfig(
        dtype="fp16", device="cuda:1"
    )


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "--gamma", "x", "--out", "o"],
        ["agree", "--out", "o"],
        ["distill", "--minutes", "1", "--tokens", "2"],
        ["bench", "--dtype", "int4"],
    ],
)
def test_bad_flags_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as e:
        config_of(argv)
    assert e.value.code == 2 and "error:" in capsys.readouterr().err


def test_a_config_error_is_one_line(capsys):
    assert main(["design", "--rows", "llama.cpp", "--out", "o"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("draftwise: error: rows must include lean")


@pytest.mark.parametrize("command", ["prune", "distill"])
def test_a_stage_that_takes_gradients_refuses_int8_in_one_line(command, capsys):
    argv = (
        [command, "--drafter", "layers:0", "--data", "d", "--dtype", "int8", "--out", "o"]
        if command == "distill"
        else [command, "--dtype", "int8", "--out", "o"]
    )
    with pytest.raises(DraftwiseError, match="takes gradients through the models: run it at fp32"):
        config_of(argv)


def test_a_native_crash_in_a_llama_cpp_bench_ends_it_in_one_line(capsys, tmp_path, tiny_dir, monkeypatch):
    """The llama.cpp engine runs in a child: a segfault there (a stand-in: `isolate.fault_point`) is one line and
    exit status 2, the caller alive; the run folder keeps what finished (nothing here) for a rerun."""
    monkeypatch.setenv("DRAFTWISE_FAULT", "segv:llama.cpp")
    code, err = run_cli(
        capsys, "--target", tiny_dir, "--backend", "llama.cpp", "--limit", "1", "--out", str(tmp_path / "b")
    )
    assert code == 2
    assert err.startswith("draftwise: error: llama.cpp (") and "the engine died with SIGSEGV in llama_decode" in err


def test_a_resumed_distillation_trains_on_with_its_sources_settings(tmp_path):
    """`distill --resume-from RUN` with only the added budget: every setting the line leaves out is the source's (the
    design's loss, learning rate, head and held-out set), not the command's defaults; the budget, stop rule and where
    it runs are the line's; a given setting that would make it another run is refused in one line."""
    from draftwise.rundir import RunDir

    source = cfg.DistillConfig(
        drafter="p", data="g,t", loss="fkl", lr=5e-5, minutes=0.86, draft_vocab=16384, vocab_data="g",
        eval_prompts=8, eval_tokens=32, stop_below=0.09, target_dtype="q4", threads=2,
    )  # fmt: skip
    RunDir(tmp_path / "src", source)
    line = ["distill", "--drafter", "p", "--data", "g,t", "--resume-from", str(tmp_path / "src")]
    got = config_of([*line, "--minutes", "25", "--lr", "1e-4", "--out", "o"])
    assert got == dataclasses.replace(
        source, minutes=25.0, lr=1e-4, stop_below=0.0, threads=None, resume_from=str(tmp_path / "src")
    )
    assert config_of([*line, "--out", "o"]).minutes == 10.0  # the command's default: the budget is never the source's
    with pytest.raises(DraftwiseError, match=r"trains on as it did: drop --draft-vocab 0 \(it trained with 16384\)"):
        config_of([*line, "--draft-vocab", "0", "--out", "o"])
    with pytest.raises(DraftwiseError, match="not a distill run folder"):
        config_of([*line[:-1], str(tmp_path), "--out", "o"])
