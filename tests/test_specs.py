"""Drafter specs: parsing (each family's module), loading, and a one-line error for each bad input (unknown kind, a
suffix folder that is not a gen-data folder, a corpus of another tokenizer, a corpus holding an eval prompt's output,
a bench its drafter's kind cannot run)."""

import json

import pytest

from conftest import save_checkpoint, tiny_config, tiny_model, tiny_tokenizer
from draftwise import data, specs
from draftwise.cli import main
from draftwise.config import BenchConfig, BenchGridConfig, GenDataConfig
from draftwise.errors import DraftwiseError
from draftwise.runtimes.registry import load
from draftwise.sd.drafters import HybridDrafter
from draftwise.sd.families import drafter_kind, hybrid, ngram, suffix
from draftwise.sd.lookup import NgramDrafter, SuffixDrafter
from draftwise.shards import read_shard
from draftwise.stages import gen_data
from draftwise.targets.fingerprint import write_fingerprint


@pytest.fixture(scope="module")
def gen_dir(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gen")
    return gen_data.run(
        GenDataConfig(
            target=tiny_dir, suites="spec_bench", limit=6, max_new_tokens=10, shard_size=4, temperatures=(0.0,)
        ),
        out,
    )


def test_kinds_and_options():
    assert [
        drafter_kind(s)
        for s in ("ngram", "ngram:max=3", "suffix", "suffix:/x,factor=2", "hybrid:a+ngram", "layers:0,1", "/some/ckpt")
    ] == ["lookup"] * 4 + ["hybrid", "model", "model"]
    assert ngram.parse("ngram:min=2,max=5") == NgramDrafter(2, 5)
    assert suffix.split("suffix:/data/gen,factor=2,min_prob=0.3") == (
        "/data/gen",
        {**suffix.DEFAULTS, "factor": 2.0, "min_prob": 0.3},
    )
    assert suffix.split("suffix,learn=1")[1]["learn"] is True
    assert hybrid.split("hybrid:runs/d+x+suffix:/g,factor=2,model_gamma=2") == ("runs/d+x", "suffix:/g,factor=2", 2)
    assert hybrid.compose("runs/d+x", "suffix:/g,factor=2", 2) == "hybrid:runs/d+x+suffix:/g,factor=2,model_gamma=2"
    assert specs.split_hybrid is hybrid.split  # the stages' name for it


@pytest.mark.parametrize(
    "spec,message",
    [
        ("ngram:max=0", "min <= max"),
        ("ngram:size=3", "unknown option 'size=3'"),
        ("suffix:,factor=0", "factor > 0"),
        ("suffix:,min_prob=x", "min_prob takes a float"),
        ("hybrid:ngram", "expected hybrid:<model drafter>"),
        ("hybrid:ngram+suffix", "must be a model or feature drafter"),
        ("hybrid:layers:0+ngram,model_gamma=0", "model_gamma must be >= 1"),
    ],
)
def test_bad_specs_are_named(spec, message):
    with pytest.raises(DraftwiseError, match=message):
        if spec.startswith("hybrid"):
            hybrid.split(spec)
        elif spec.startswith("ngram"):
            ngram.parse(spec)
        else:
            suffix.split(spec)


def test_loading_each_kind(tiny_dir, gen_dir):
    target = load(tiny_dir)
    assert specs.load("ngram:max=3", target).loop_drafter == NgramDrafter(1, 3)
    suffix = specs.load(f"suffix:{gen_dir},factor=2", target)
    assert (
        isinstance(suffix.loop_drafter, SuffixDrafter)
        and suffix.loop_drafter.factor == 2.0
        and suffix.loop_drafter.trie.tokens > 0
    )
    hybrid = specs.load("hybrid:layers:0+ngram,model_gamma=2", target)
    assert (
        isinstance(hybrid.loop_drafter, HybridDrafter)
        and hybrid.loop_drafter.model_gamma == 2
        and hybrid.model is not None
    )
    assert hybrid.describe()["lookup"]["method"] == "ngram" and hybrid.describe()["kind"] == "hybrid"


def test_the_corpus_is_the_continuations_of_train_prompts(tiny_dir, gen_dir):
    records = [json.loads(line) for line in (gen_dir / "records.jsonl").read_text().splitlines()]
    packaged = {p.id: p for p in data.load_prompts("all", "all")}
    assert all(data.split_of(packaged[pid].text) == "train" for r in records for pid, _ in r["prompts"])
    want = [row["tokens"][row["prompt_len"] :].tolist() for r in records for row in read_shard(gen_dir / r["file"])]
    assert suffix.read_corpus(gen_dir, load(tiny_dir)) == want  # outputs only: no prompt text at all
    prompts = {tuple(load(tiny_dir).encode(packaged[pid].text)) for r in records for pid, _ in r["prompts"]}
    assert not prompts & {tuple(s) for s in want}


def test_a_corpus_holding_an_eval_prompts_output_is_refused(tiny_dir, gen_dir, tmp_path):
    import shutil

    bad = tmp_path / "gen"
    shutil.copytree(gen_dir, bad)
    eval_id = data.load_prompts("spec_bench", "eval", 1)[0].id
    lines = (bad / "records.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    first["prompts"][0][0] = eval_id
    (bad / "records.jsonl").write_text("\n".join([json.dumps(first)] + lines[1:]) + "\n")
    with pytest.raises(DraftwiseError, match=f"output of eval prompt {eval_id}"):
        specs.load(f"suffix:{bad}", load(tiny_dir))


def test_a_folder_that_is_not_gen_data_is_refused(tiny_dir, tmp_path):
    target = load(tiny_dir)
    with pytest.raises(DraftwiseError, match="no such folder"):
        specs.load(f"suffix:{tmp_path / 'missing'}", target)
    write_fingerprint(tmp_path, target.tokenizer)
    (tmp_path / "config.json").write_text(json.dumps({"stage": "BenchConfig"}))
    with pytest.raises(DraftwiseError, match="not a gen-data run folder"):
        specs.load(f"suffix:{tmp_path}", target)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DraftwiseError, match=f"suffix corpus {empty}: not a gen-data run folder"):
        specs.load(f"suffix:{empty}", target)


def test_a_corpus_of_another_tokenizer_is_refused(tiny_dir, tmp_path):
    other = save_checkpoint(tmp_path / "other", tiny_model(tiny_config(vocab=40), seed=3), tiny_tokenizer(vocab=40))
    gen = gen_data.run(
        GenDataConfig(target=other, suites="spec_bench", limit=2, max_new_tokens=4, temperatures=(0.0,)),
        tmp_path / "gen",
    )
    with pytest.raises(DraftwiseError, match="another tokenizer"):
        specs.load(f"suffix:{gen}", load(tiny_dir))


def test_an_unknown_drafter_kind_gets_one_line(tiny_dir, tmp_path, capsys):
    code = main(
        ["bench", "--target", tiny_dir, "--drafter", "medusa:heads=4", "--limit", "1", "--out", str(tmp_path / "b")]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "unknown drafter kind 'medusa'" in err
    code = main(
        [
            "bench",
            "--target",
            tiny_dir,
            "--drafter",
            f"suffix:{tmp_path}/nope",
            "--limit",
            "1",
            "--out",
            str(tmp_path / "c"),
        ]
    )
    assert code == 2 and "no such folder" in capsys.readouterr().err


def test_a_bench_its_drafters_kind_cannot_run_is_refused_in_one_line():
    """The configs validate what needs no drafter; what the drafter's kind decides is `specs.check`'s (the stage
    calls it before its run folder exists)."""
    for config, message in [
        (
            BenchConfig(drafter="ngram", baselines=("ar", "hf-assisted")),
            "hf-assisted needs a model drafter, not a lookup",
        ),
        (BenchConfig(drafter="hybrid:layers:0+ngram", batch_size=2), "hybrid drafters run at batch size 1"),
        (BenchConfig(drafter="layers:0", baselines=("llama-cpp-lookup",)), "give an ngram or suffix --drafter"),
    ]:
        with pytest.raises(DraftwiseError, match=message):
            specs.check(config)
    specs.check(BenchConfig(drafter="ngram", baselines=("ar", "hf-prompt-lookup", "llama-cpp-lookup")))


def test_grid_points_keep_the_drafter_bound_baselines_their_kind_runs():
    grid = BenchGridConfig(
        bench=BenchConfig(drafter="ngram", baselines=("ar", "hf-assisted", "llama-cpp-lookup")),
        drafters=("ngram", "layers:0"),
    )
    own = {p.drafter: p.baselines for p in specs.points(grid) if p.drafter}
    assert own == {"ngram": ("llama-cpp-lookup",), "layers:0": ("hf-assisted",)}
