"""The feature family (`sd.families.feature`): lossless in the loop (greedy identity, sampled SD following p), the
feature each round drafts from pinned against a brute-force teacher-forced pass, its spec and its refusals."""

from __future__ import annotations

import json

import pytest
import torch
from chisquare import chisquare_pvalue
from test_loop import GREEDY, exact_first_three, lean, sampled_first_three

from conftest import tiny_config
from draftwise import specs
from draftwise.config import BenchConfig, TrainFeatureConfig
from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean.feature_head import FeatureHead, FeatureHeadConfig, draft_vocab
from draftwise.runtimes.registry import load
from draftwise.sd.families import drafter_kind, family_of
from draftwise.sd.families.feature import FeatureDrafter, FeatureSession, target_features
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.stages.feature import Positions, _step
from draftwise.targets.fingerprint import fingerprint


def head_for(lm, d2t, seed=0) -> FeatureHead:
    s = lm.shape
    config = FeatureHeadConfig(s.hidden_size, 48, 1, len(d2t), lm.vocab_size, s.rms_eps)
    return FeatureHead(config, torch.as_tensor(d2t), seed).attach(lm)


def teacher_rows(lm, n=24, length=40, seed=0) -> list[dict]:
    """The target's own sampled text, teacher-forced: rows as a teacher folder holds them (prompt_len 1)."""
    gen, rows = torch.Generator().manual_seed(seed), []
    for i in range(n):
        prompt = [1, 3 + i % (lm.vocab_size - 3)]
        tokens = prompt + generate(lm, prompt, SamplingParams(1.0), length, gen).tokens
        lm.reset(1, len(tokens))
        probs = torch.softmax(lm.forward(torch.tensor([tokens]), 0)[0, :-1].float(), -1)
        top = probs.topk(8)
        hidden = lm.features(lm.last_hidden[0, :-1]).clone()
        rows.append(
            {"tokens": torch.tensor(tokens), "prompt_len": 1, "topk_ids": top.indices, "topk_probs": top.values}
            | {"hidden": hidden}
        )
    return rows


@pytest.fixture(scope="module")
def trained():
    """A 3-layer random target and a head trained on its text for a few hundred steps (it drafts well enough that
    rounds accept some drafts and reject others)."""
    lm = lean(tiny_config(vocab=64, layers=3), seed=11)
    rows = teacher_rows(lm)
    head = head_for(lm, draft_vocab(rows, 48))
    config = TrainFeatureConfig(data="(rows)", tokens=1, batch_size=64, lr=1e-2)
    data = Positions(rows, head.d2t, lm.vocab_size, config.unroll)
    opt = torch.optim.AdamW(head.parameters(), lr=config.lr)
    for step in range(300):
        _step(head, opt, data, data.batch(step, config.batch_size, 0), config)
    return lm, head.eval()


PROMPTS = [[1, 5, 9], [1, 20, 21, 22, 23, 24, 25], [1], [1, 7]]


@pytest.mark.parametrize("gamma", [1, 2, 3, 5])
def test_greedy_sd_with_a_feature_drafter_is_identical_to_greedy_ar(trained, gamma):
    lm, head = trained
    drafter = FeatureDrafter(head, lm)
    accepted = rejected = 0
    for prompt in PROMPTS:
        ar = generate(lm, prompt, GREEDY, 40, torch.Generator())
        sd = generate(lm, prompt, GREEDY, 40, torch.Generator(), drafter=drafter, gamma=gamma)
        assert sd.tokens == ar.tokens
        assert all(r.drafted <= gamma for r in sd.rounds)
        # every round drafts but a one-token prompt's first (no feature yet) and a last round with no room
        assert sum(r.drafted == 0 for r in sd.rounds[:-1]) == (len(prompt) == 1)
        accepted += sum(r.accepted for r in sd.rounds)
        rejected += sum(r.accepted < r.drafted for r in sd.rounds)
    assert accepted > 0 and rejected > 0  # the runs exercised both sides of the test


def test_each_round_drafts_from_the_feature_of_the_last_emitted_token(trained, monkeypatch):
    """Brute force: the feature a round starts from is the target's teacher-forced feature at len(seq) − 2."""
    lm, head = trained
    seen = []
    real = FeatureSession.propose

    def spy(self, seqs, *args, **kw):
        seen.append((list(seqs[0]), None if self.feature is None else self.feature.clone()))
        return real(self, seqs, *args, **kw)

    monkeypatch.setattr(FeatureSession, "propose", spy)
    for prompt in PROMPTS:
        seen.clear()
        out = generate(lm, prompt, GREEDY, 30, torch.Generator(), drafter=FeatureDrafter(head, lm), gamma=3)
        full = target_features(lm, prompt + out.tokens)  # [T, D]
        assert len(seen) > 5
        for seq, feature in seen:
            assert (feature is None) == (len(seq) == 1)
            if feature is not None:
                torch.testing.assert_close(feature, full[len(seq) - 2], atol=1e-4, rtol=1e-4)


SAMPLED = {  # (temperature, top_p, draft vocabulary)
    "a draft vocabulary of 5 of 8 tokens (q = 0 where p is not), T=1": (1.0, 1.0, [0, 2, 3, 5, 7]),
    "the full vocabulary, T=0.7, top_p=0.8": (0.7, 0.8, list(range(8))),
}


@pytest.mark.parametrize("case", SAMPLED)
def test_sampled_sd_with_a_feature_drafter_follows_the_target_distribution(case):
    temperature, top_p, d2t = SAMPLED[case]
    params = SamplingParams(temperature, top_p)
    target = lean(tiny_config(vocab=8, layers=2), seed=21, std=0.12)
    drafter = FeatureDrafter(head_for(target, d2t, seed=3), target)
    prompt = [1, 3, 5]
    joint12, marg3 = exact_first_three(target, prompt, params)
    c12, c3, rounds = sampled_first_three(target, prompt, params, drafter, 8, runs=1500)
    assert any(r.accepted < r.drafted for r in rounds) and any(r.accepted > 0 for r in rounds)
    assert chisquare_pvalue(c12, joint12) > 1e-3
    assert chisquare_pvalue(c3, marg3) > 1e-3


def test_q_is_the_distribution_the_draft_was_sampled_from(trained):
    """Under sampling each q is the head's tempered softmax over the draft vocabulary, 0 on every other id."""
    lm, head = trained
    lm.reset(1, 64)
    lm.forward(torch.tensor([[1, 5]]), 0, 0)  # the loop's prefill, after which a session starts
    session = FeatureDrafter(head, lm).start([[1, 5, 9]], 64, lm.vocab_size)
    draft = session.propose({0: [1, 5, 9]}, 3, SamplingParams(0.8), torch.Generator().manual_seed(0))[0]
    assert len(draft.tokens) == len(draft.qs) == 3
    off = torch.ones(lm.vocab_size, dtype=torch.bool)
    off[head.d2t] = False
    feature, token = session.feature[None], torch.tensor([9])
    for tok, q in zip(draft.tokens, draft.qs):
        logits, feature = head(feature, token)
        torch.testing.assert_close(q[head.d2t], torch.softmax(logits[0] / 0.8, -1))
        assert q[off].sum() == 0 and q[tok] > 0
        token = torch.tensor([tok])


@pytest.fixture(scope="module")
def saved(tiny_dir, tmp_path_factory):
    """A head for the tiny Llama saved as a train-feature run folder's checkpoint/."""
    target = load(tiny_dir)
    run = tmp_path_factory.mktemp("feature-run")
    head_for(target.lm, list(range(0, 64, 2))).save(run / "checkpoint", fingerprint(target.tokenizer))
    return target, run


def test_the_spec_loads_a_run_folder_or_its_checkpoint(saved):
    target, run = saved
    assert drafter_kind(f"feature:{run}") == "feature" and not family_of(f"feature:{run}").batched
    for spec in (f"feature:{run}", f"feature:{run / 'checkpoint'}"):
        loaded = specs.load(spec, target)
        assert loaded.kind == "feature" and loaded.model is None and loaded.lookup is None
        assert loaded.loop_drafter.head.d2t.tolist() == list(range(0, 64, 2))
    assert loaded.describe() == {"spec": f"feature:{run / 'checkpoint'}", "kind": "feature"}
    with pytest.raises(DraftwiseError, match="no feature head in"):
        specs.load(f"feature:{run}/nowhere", target)


def test_engines_without_hidden_states_are_refused_in_one_line(saved, tiny_dir):
    _, run = saved
    hf = load(tiny_dir, ModelOptions(backend="transformers"))
    with pytest.raises(DraftwiseError, match="only the lean engine .fp32, bf16, int8. exposes") as e:
        specs.load(f"feature:{run}", hf)
    assert "\n" not in str(e.value)


def test_no_export_and_no_batch_rows(saved):
    _, run = saved
    family = family_of(f"feature:{run}")
    with pytest.raises(DraftwiseError, match="no vLLM export"):
        family.vllm(f"feature:{run}", 3)
    with pytest.raises(DraftwiseError, match="no llama-server counterpart"):
        family.llama_server(f"feature:{run}", 3, lambda m: m)
    with pytest.raises(DraftwiseError, match="batch size 1"):
        specs.check(BenchConfig(drafter=f"feature:{run}", batch_size=2, baselines=("ar",)))
    with pytest.raises(DraftwiseError, match="hf-assisted needs a model drafter"):
        specs.check(BenchConfig(drafter=f"feature:{run}", baselines=("hf-assisted",)))
    assert json.loads((run / "checkpoint" / "config.json").read_text())["format"] == "draftwise-feature-head"


def test_the_design_exports_a_feature_head_with_a_command_that_loads_it(saved, tmp_path):
    """The export copies the head's checkpoint beside a README that says where it runs; serve.json's spec, with the
    placeholder resolved, loads the same head."""
    from draftwise.config.serve import PLACEHOLDER
    from draftwise.design import deploy, export

    target, run = saved
    assert export.export_parts(None, target, tmp_path, f"feature:{run}", "feature", 3) is None
    assert (tmp_path / "drafter" / "config.json").exists() and "draftwise serve" in (tmp_path / "README.md").read_text()
    local = deploy.local_drafter(f"feature:{run}", tmp_path)
    assert local == f"feature:{PLACEHOLDER}/drafter"
    loaded = specs.load(local.replace(PLACEHOLDER, str(tmp_path)), target)
    assert loaded.loop_drafter.head.d2t.tolist() == list(range(0, 64, 2))


def test_a_hybrid_of_a_feature_head_and_a_lookup_loads_drafts_losslessly_and_exports(saved, tmp_path):
    from draftwise.config.serve import PLACEHOLDER
    from draftwise.design import deploy, export
    from draftwise.sd.loop import generate
    from draftwise.sd.sampling import SamplingParams

    target, run = saved
    spec = f"hybrid:feature:{run}+ngram:max=3"
    loaded = specs.load(spec, target)
    assert loaded.kind == "hybrid" and loaded.model is None
    prompt = [1, 5, 9, 5, 9, 5, 9, 2, 7]
    gen = torch.Generator()
    ar = generate(target.lm, prompt, SamplingParams(), 24, gen)
    sd = generate(target.lm, prompt, SamplingParams(), 24, gen, loaded.loop_drafter, 3)
    assert sd.tokens == ar.tokens and any(r.drafted for r in sd.rounds)
    assert export.export_parts(None, target, tmp_path, spec, "hybrid", 3) is None
    assert (tmp_path / "drafter" / "config.json").exists()
    assert "This is a hybrid" in (tmp_path / "README.md").read_text()
    local = deploy.local_drafter(spec, tmp_path)
    assert local.startswith(f"hybrid:feature:{PLACEHOLDER}/drafter+ngram")
    assert specs.load(local.replace(PLACEHOLDER, str(tmp_path)), target).kind == "hybrid"


def test_the_reports_export_section_describes_a_feature_head_without_a_vllm_config(saved, tmp_path):
    """A design whose chosen drafter is the feature head, recommended or not: the report says no vLLM config exists
    rather than reading one (found by CI: a feature head chosen but not recommended)."""
    from types import SimpleNamespace

    from draftwise.design import export
    from draftwise.design.report import _export_section
    from draftwise.report.doc import Doc

    target, run = saved
    for recommend in (True, False):
        top = tmp_path / str(recommend) / "export"
        folder = top if recommend else top / "not-recommended-feature"
        folder.mkdir(parents=True)
        export.export_parts(None, target, folder, f"feature:{run}", "feature", 2)
        doc = Doc()
        _export_section(doc, SimpleNamespace(path=top.parent, done={"verdict": {"recommend": recommend}}))
        text = doc.markdown(top.parent)
        assert "No vLLM config" in text and "`drafter/`" in text
