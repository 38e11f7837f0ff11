import json

import torch

from draftwise.config import AgreeConfig
from draftwise.models import load, load_drafter
from draftwise.sd.engine import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.stages import agree


def test_greedy_rounds_replay():
    assert agree.greedy_rounds([1, 1, 1, 1, 1, 1], 4) == (2, 6)  # 4 accepted + bonus, then the last 1 token
    assert agree.greedy_rounds([0, 0, 0], 4) == (3, 3)
    assert agree.greedy_rounds([1, 0, 1, 1], 2) == (2, 4)  # [1 acc + recovered], [2 acc]: capped at the end


def test_agreement_predicts_the_tar_of_a_real_greedy_sd_run(tiny_dir, tmp_path):
    out = agree.run(AgreeConfig(target=tiny_dir, drafter="layers:0,1,3", suites="spec_bench", limit=6, max_new_tokens=20,
                                gammas=(2, 4), batch_size=4), tmp_path / "a")
    summary = json.loads((out / "agree.json").read_text())
    assert 0 < summary["agreement"] < 1
    target = load(tiny_dir)
    drafter = load_drafter("layers:0,1,3", target)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    from draftwise import data

    prompts = {p.id: p for p in data.load_prompts("spec_bench", "eval")}
    for gamma in (2, 4):
        rounds = tokens = 0
        for r in records:
            ids = target.encode(prompts[r["prompt_id"]].text)
            sd = generate(target.lm, ids, SamplingParams(), len(r["continuation"]), torch.Generator(),
                          drafter=drafter.lm, gamma=gamma, eos=target.eos_ids)
            assert sd.tokens == r["continuation"]
            rounds, tokens = rounds + len(sd.rounds), tokens + len(sd.tokens)
        assert summary["predicted_greedy_tar"][str(gamma)] == tokens / rounds
