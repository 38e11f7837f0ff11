"""`draftwise train-feature` (stages/feature.py) on a small teacher folder with features, and the feature drafter in
`agree` and `profile`."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftwise import continuations, data, shards, specs
from draftwise.config import AgreeConfig, ProfileConfig, TrainFeatureConfig
from draftwise.errors import DraftwiseError
from draftwise.runtimes.lean.feature_head import WEIGHTS
from draftwise.runtimes.registry import load
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.stages import agree, feature, profile


def write_teacher(folder, target, features: bool = True, topk: int = 8, prompts: int = 24):
    """A teacher folder as `draftwise teacher` writes one: the target's own text (greedy and sampled continuations of
    train prompts) scored teacher-forced, prompt_len 1, in two shards."""
    (folder / "shards").mkdir(parents=True)
    chosen = continuations.prompts_for(target, "train", "spec_bench,alpaca", 64, prompts)
    seqs = [s for t in (0.0, 1.0) for s in continuations.generate(target, chosen, 24, params=SamplingParams(t))]
    rows, lm = [], target.lm
    for s in seqs:
        lm.reset(1, len(s.tokens))
        probs = torch.softmax(lm.forward(torch.tensor([s.tokens]), 0)[0, :-1].float(), -1)
        top = probs.topk(topk)
        row = {"tokens": s.tokens, "prompt_len": 1, "topk_ids": top.indices, "topk_probs": top.values}
        rows.append(row | ({"hidden": lm.features(lm.last_hidden[0, :-1]).clone()} if features else {}))
    half = len(rows) // 2
    for i, part in enumerate((rows[:half], rows[half:])):
        shards.write_shard(folder / "shards" / f"{i}.safetensors", part, topk)
    records = "".join(json.dumps({"shard": i, "file": f"shards/{i}.safetensors"}) + "\n" for i in range(2))
    (folder / "records.jsonl").write_text(records)
    return folder


@pytest.fixture(scope="module")
def teacher(tiny_dir, tmp_path_factory):
    return write_teacher(tmp_path_factory.mktemp("teacher"), load(tiny_dir))


def config(tiny_dir, teacher, **kw) -> TrainFeatureConfig:
    base = dict(
        target=tiny_dir,
        data=str(teacher),
        tokens=64 * 200,
        batch_size=64,
        eval_every=100,
        checkpoint_every=40,
        eval_prompts=6,
        eval_tokens=20,
        eval_suites="spec_bench",
    )
    return TrainFeatureConfig(**(base | kw))


@pytest.fixture(scope="module")
def trained(tiny_dir, teacher, tmp_path_factory):
    return feature.run(config(tiny_dir, teacher), tmp_path_factory.mktemp("train") / "f")


def test_training_raises_held_out_agreement_and_writes_a_checkpoint(trained):
    records = [json.loads(line) for line in (trained / "records.jsonl").read_text().splitlines()]
    evals = [r for r in records if r["event"] == "eval"]
    train = [r for r in records if r["event"] == "train"]
    assert [r["step"] for r in evals] == [0, 100, 200] and len(train) == 200
    assert set(train[0]) == {"event", "step", "loss", "tokens", "seconds"} and train[-1]["tokens"] == 64 * 200
    assert set(evals[0]) == {"event", "step", "tokens", "agreement", "tar_gamma4"}
    assert evals[-1]["agreement"] > evals[0]["agreement"] + 0.2 and evals[-1]["tar_gamma4"] > evals[0]["tar_gamma4"]
    assert (trained / "learning_curve.png").stat().st_size > 0
    assert (trained / "eval_features.safetensors").exists() and (trained / "checkpoint" / WEIGHTS).exists()


def test_the_trained_drafter_is_lossless_and_agree_predicts_its_greedy_tar(tiny_dir, trained, tmp_path):
    out = agree.run(
        AgreeConfig(
            target=tiny_dir,
            drafter=f"feature:{trained}",
            suites="spec_bench",
            limit=5,
            max_new_tokens=20,
            gammas=(2, 4),
            batch_size=5,
        ),
        tmp_path / "a",
    )
    summary = json.loads((out / "agree.json").read_text())
    assert 0.2 < summary["agreement"] < 1
    target = load(tiny_dir)
    drafter = specs.load(f"feature:{trained}", target)
    prompts = {p.id: p for p in data.load_prompts("spec_bench", "eval")}
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    for gamma in (2, 4):
        rounds = tokens = 0
        for r in records:
            ids = target.encode(prompts[r["prompt_id"]].text)
            n = len(r["continuation"])
            sd = generate(target.lm, ids, SamplingParams(), n, torch.Generator(), drafter.loop_drafter, gamma=gamma)
            assert sd.tokens == r["continuation"]  # greedy SD = the target's greedy text
            rounds, tokens = rounds + len(sd.rounds), tokens + len(sd.tokens)
        # exact: the replay drafts from teacher-forced features, the real run from its verify passes' (the CPU fast
        # path computes each row as a one-token step does)
        assert summary["predicted_greedy_tar"][str(gamma)] == tokens / rounds
        assert summary["predicted_greedy_tar"][str(gamma)] > 1.2


def test_a_resumed_run_equals_an_uninterrupted_one(tiny_dir, teacher, trained, tmp_path, monkeypatch):
    calls = {"n": 0}
    real_step = feature._step

    def killed_after_fifty(*args):
        calls["n"] += 1
        if calls["n"] > 50:
            raise KeyboardInterrupt
        return real_step(*args)

    monkeypatch.setattr(feature, "_step", killed_after_fifty)
    with pytest.raises(KeyboardInterrupt):
        feature.run(config(tiny_dir, teacher), tmp_path / "r")
    monkeypatch.setattr(feature, "_step", real_step)
    feature.run(config(tiny_dir, teacher), tmp_path / "r")  # resumes from the step-40 checkpoint
    a, b = load_file(trained / "checkpoint" / WEIGHTS), load_file(tmp_path / "r" / "checkpoint" / WEIGHTS)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    records = [json.loads(line) for line in (tmp_path / "r" / "records.jsonl").read_text().splitlines()]
    keys = [(r["event"], r["step"]) for r in records]
    assert len(keys) == len(set(keys)) == 203  # the redone steps 41..50 are recorded once


def test_teacher_data_without_features_is_refused(tiny_dir, tmp_path):
    bare = write_teacher(tmp_path / "bare", load(tiny_dir), features=False, prompts=2)
    with pytest.raises(DraftwiseError, match="holds no target features"):
        feature.run(config(tiny_dir, bare), tmp_path / "f")
    with pytest.raises(DraftwiseError, match="needs --data"):
        TrainFeatureConfig(tokens=10)
    with pytest.raises(DraftwiseError, match="int8 is a deployment precision"):
        TrainFeatureConfig(data="x", dtype="int8")


def test_profile_times_a_feature_drafters_step(tiny_dir, trained, tmp_path):
    spec = f"feature:{trained}"
    out = profile.run(
        ProfileConfig(target=tiny_dir, drafters=(spec,), depths=(), gammas=(1, 2), batches=(1,), context=16, repeats=3),
        tmp_path / "p",
    )
    d = json.loads((out / "profile.json").read_text())["batches"]["1"]["drafters"][spec]
    assert d["kind"] == "feature" and d["step_ms"] > 0 and 0 < d["c"] and d["head_ms"] is None
