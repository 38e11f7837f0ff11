import json
from dataclasses import replace

import pytest
import torch

from draftwise import continuations
from draftwise.config import AgreeConfig
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load, load_drafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.stages import agree


def test_greedy_rounds_replay():
    assert agree.greedy_rounds([1, 1, 1, 1, 1, 1], 4) == (2, 6)  # 4 accepted + bonus, then the last 1 token
    assert agree.greedy_rounds([0, 0, 0], 4) == (3, 3)
    assert agree.greedy_rounds([1, 0, 1, 1], 2) == (2, 4)  # [1 acc + recovered], [2 acc]: capped at the end


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_agreement_predicts_the_tar_of_a_real_greedy_sd_run(tiny_dir, tmp_path, dtype):
    """At either precision of the lean engine (int8: batched continuations equal one-by-one SD runs, bit for bit)."""
    out = agree.run(
        AgreeConfig(
            target=tiny_dir,
            drafter="layers:0,1,3",
            suites="spec_bench",
            limit=6,
            max_new_tokens=20,
            gammas=(2, 4),
            batch_size=4,
            dtype=dtype,
        ),
        tmp_path / "a",
    )
    summary = json.loads((out / "agree.json").read_text())
    assert 0 < summary["agreement"] < 1
    target = load(tiny_dir, ModelOptions(dtype=dtype))
    drafter = load_drafter("layers:0,1,3", target, ModelOptions(dtype=dtype))
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    from draftwise import data

    prompts = {p.id: p for p in data.load_prompts("spec_bench", "eval")}
    for gamma in (2, 4):
        rounds = tokens = 0
        for r in records:
            ids = target.encode(prompts[r["prompt_id"]].text)
            sd = generate(
                target.lm,
                ids,
                SamplingParams(),
                len(r["continuation"]),
                torch.Generator(),
                drafter=drafter.lm,
                gamma=gamma,
                eos=target.eos_ids,
            )
            assert sd.tokens == r["continuation"]
            rounds, tokens = rounds + len(sd.rounds), tokens + len(sd.tokens)
        assert summary["predicted_greedy_tar"][str(gamma)] == tokens / rounds


def test_a_lookup_drafters_replay_is_a_real_greedy_sd_run(tiny_dir, tmp_path):
    """Replayed rounds of a lookup (and of a hybrid) equal the rounds the engine runs on the same prompts."""
    from draftwise import specs

    target = load(tiny_dir)
    for spec in ("ngram:max=3", "hybrid:layers:0,1,3+ngram:max=2,model_gamma=2"):
        out = agree.run(
            AgreeConfig(
                target=tiny_dir,
                drafter=spec,
                suites="spec_bench",
                limit=4,
                max_new_tokens=24,
                gammas=(2, 5),
                batch_size=4,
            ),
            tmp_path / spec.split(":")[0],
        )
        summary = json.loads((out / "agree.json").read_text())
        drafter = specs.load(spec, target)
        for r in (json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()):
            for gamma in (2, 5):
                sd = generate(
                    target.lm,
                    r["prompt"],
                    SamplingParams(),
                    len(r["continuation"]),
                    torch.Generator(),
                    drafter=drafter.loop_drafter,
                    gamma=gamma,
                    eos=target.eos_ids,
                )
                assert sd.tokens == r["continuation"]
                assert [[x.drafted, x.accepted] for x in sd.rounds] == r["rounds"][str(gamma)]
        assert summary["predicted_greedy_tar"]["5"] >= 1 and 0 < summary["proposed_fraction"]["5"] <= 1


def test_agreement_on_llama_cpp_predicts_its_greedy_sd_run(tiny_dir, tiny_drafter_dir, tmp_path):
    """Both models in llama.cpp (GGUF at f32): the replayed TAR is what greedy SD on that engine measures."""
    from draftwise.runtimes.base import ModelOptions

    out = agree.run(
        AgreeConfig(
            target=tiny_dir,
            drafter=tiny_drafter_dir,
            suites="spec_bench",
            limit=4,
            max_new_tokens=16,
            gammas=(3,),
            batch_size=4,
            backend="llama.cpp",
        ),
        tmp_path / "a",
    )
    summary = json.loads((out / "agree.json").read_text())
    options = ModelOptions(backend="llama.cpp")
    target = load(tiny_dir, options)
    drafter = load_drafter(tiny_drafter_dir, target, options)
    rounds = tokens = 0
    for r in (json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()):
        sd = generate(
            target.lm,
            r["prompt"],
            SamplingParams(),
            len(r["continuation"]),
            torch.Generator(),
            drafter=drafter.lm,
            gamma=3,
            eos=target.eos_ids,
        )
        assert sd.tokens == r["continuation"]
        rounds, tokens = rounds + len(sd.rounds), tokens + len(sd.tokens)
    assert summary["predicted_greedy_tar"]["3"] == tokens / rounds


def test_agreements_share_the_targets_continuations(tiny_dir, tmp_path, monkeypatch):
    """`share` generates the continuations once; each agree with the same target, runtime and prompts reads them (it
    generates nothing) and scores the same text it would have generated; other settings generate their own."""
    config = AgreeConfig(
        target=tiny_dir, drafter="layers:0", suites="spec_bench", limit=4, max_new_tokens=12, shared=str(tmp_path / "s")
    )
    agree.share(config, tmp_path / "share")
    alone = agree.run(replace(config, shared=None), tmp_path / "alone")
    generated = []
    real = continuations.generate
    monkeypatch.setattr(continuations, "generate", lambda *a, **k: generated.append(1) or real(*a, **k))
    for drafter in ("layers:0", "layers:1,2"):
        out = agree.run(replace(config, drafter=drafter), tmp_path / drafter)
        assert not generated
        texts = lambda d: [json.loads(x)["continuation"] for x in (d / "records.jsonl").read_text().splitlines()]  # noqa: E731
        assert texts(out) == texts(alone)
    agree.run(replace(config, max_new_tokens=8), tmp_path / "shorter")
    assert generated  # another key: its own continuations
    assert len(list((tmp_path / "s").glob("*.jsonl"))) == 2


def test_agreement_on_the_users_traffic_replays_its_own_prompts(tiny_dir, tmp_path):
    """`prompts`: the traffic's texts instead of the suites' (what the design's lookup tuning and candidates'
    agreement measure when the user gives `--prompts`)."""
    traffic = tmp_path / "traffic.jsonl"
    lines = [
        {"id": f"r{i}", "prompt": " ".join(f"w{(i * 7 + j) % 50}" for j in range(12)), "temperature": 0}
        for i in range(5)
    ]
    traffic.write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = AgreeConfig(target=tiny_dir, drafter="ngram", prompts=str(traffic), limit=3, max_new_tokens=8, gammas=(2,))
    out = agree.run(config, tmp_path / "agree")
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in records] == ["user/r0", "user/r1", "user/r2"]
