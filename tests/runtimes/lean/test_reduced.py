"""Reduced-vocabulary draft heads: the hot vocabulary, the id map and the checkpoint that carries it."""

from __future__ import annotations

import json

import pytest
import torch

from draftwise.config import GenDataConfig
from draftwise.errors import DraftwiseError
from draftwise.runtimes.registry import load, load_drafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.stages import gen_data
from draftwise.stages.draft_vocab import write_reduced
from draftwise.targets import vocab_map as vocab


def test_hot_vocab_ranks_by_the_targets_expected_emissions_and_keeps_special_tokens():
    rows = [
        {"topk_ids": torch.tensor([[5, 7], [5, 9]]), "topk_probs": torch.tensor([[0.6, 0.4], [0.7, 0.3]])},
        {"topk_ids": torch.tensor([[9, 3]]), "topk_probs": torch.tensor([[0.9, 0.1]])},
    ]
    # mass: 5 → 1.3, 9 → 1.2, 7 → 0.4, 3 → 0.1, the rest 0 (ties: smaller id first); padded to 8 ids
    assert vocab.hot_vocab(rows, 2, 16, special_ids=[2]) == [0, 1, 2, 3, 4, 5, 7, 9]
    assert vocab.hot_vocab(rows, 9, 16, special_ids=[15]) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    assert vocab.hot_vocab(rows, 9, 10) == list(range(10))  # never more than the vocabulary
    with pytest.raises(DraftwiseError):
        vocab.hot_vocab(rows, 0, 16)


@pytest.fixture(scope="module")
def data_dir(tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab-data")
    gen_data.run(
        GenDataConfig(target=tiny_dir, limit=6, max_new_tokens=12, temperatures=(0.0, 1.0), topk=8, threads=1), out
    )
    return out


def test_reduced_checkpoint_round_trips_and_stays_lossless(tiny_dir, tiny_drafter_dir, data_dir, tmp_path):
    out = write_reduced(tiny_drafter_dir, data_dir, 20, tmp_path / "reduced")
    ids, size = vocab.read_map(out)
    assert size == 64 and len(ids) >= 20 and ids == sorted(set(ids))
    assert 2 in ids  # the EOS token is always kept
    target = load(tiny_dir)
    drafter = load_drafter(str(out), target)
    assert drafter.vocab_size == 64
    drafter.lm.reset(1, 4)
    logits = drafter.lm.forward(torch.tensor([[1, 5, 9]]), 0)  # [1, 3, 64]
    outside = [i for i in range(64) if i not in ids]
    assert torch.isinf(logits[..., outside]).all() and torch.isfinite(logits[..., ids]).all()
    full = load_drafter(tiny_drafter_dir, target)  # the kept ids score exactly as in the full head
    full.lm.reset(1, 4)
    assert torch.allclose(full.lm.forward(torch.tensor([[1, 5, 9]]), 0)[..., ids], logits[..., ids], atol=1e-5)
    ar = generate(target.lm, [1, 5, 9], SamplingParams(), 20, torch.Generator())
    sd = generate(target.lm, [1, 5, 9], SamplingParams(), 20, torch.Generator(), drafter=drafter.lm, gamma=3)
    assert sd.tokens == ar.tokens
    with pytest.raises(DraftwiseError, match="reduced-vocabulary head"):
        drafter.hf_model()
    with pytest.raises(DraftwiseError, match="already has a reduced head"):
        write_reduced(out, data_dir, 10, tmp_path / "again")


def test_bad_id_map_and_bad_data_are_refused(tiny_drafter_dir, data_dir, tmp_path):
    out = write_reduced(tiny_drafter_dir, data_dir, 10, tmp_path / "r")
    m = json.loads((out / vocab.MAP_FILE).read_text())
    (out / vocab.MAP_FILE).write_text(json.dumps({**m, "ids": m["ids"][::-1]}))
    with pytest.raises(DraftwiseError, match="sorted"):
        vocab.read_map(out)
    with pytest.raises(DraftwiseError, match="not a gen-data run folder"):
        write_reduced(tiny_drafter_dir, tmp_path, 10, tmp_path / "x")
    with pytest.raises(DraftwiseError, match="not smaller"):
        write_reduced(tiny_drafter_dir, data_dir, 64, tmp_path / "y")


def test_hot_vocabulary_is_never_counted_on_eval_prompts(tiny_dir, tiny_drafter_dir, tmp_path):
    """The only data it reads is a gen-data folder (train prompts only); eval continuations (agree) are refused."""
    from draftwise.config import AgreeConfig
    from draftwise.stages import agree

    folder = agree.run(
        AgreeConfig(target=tiny_dir, drafter=tiny_drafter_dir, limit=2, max_new_tokens=4, threads=1), tmp_path / "agree"
    )
    with pytest.raises(DraftwiseError, match="not a gen-data run folder"):
        write_reduced(tiny_drafter_dir, folder, 10, tmp_path / "x")


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_cut_qwen2_sibling_with_a_reduced_head_is_lossless(tmp_path_factory, dtype):
    """The paper's recipe on a qwen2-shaped pair (q/k/v biases, a tied head), as the design applies it to
    Qwen2.5-Coder-1.5B and its 0.5B sibling: the sibling, of the target's vocabulary, cut to fewer of its layers
    (width kept), its head reduced to the target's most emitted tokens; greedy SD is the target's AR token for
    token, on the lean engine at fp32 and int8."""
    from transformers import AutoModelForCausalLM

    from conftest import save_checkpoint, tiny_config, tiny_model, tiny_tokenizer
    from draftwise.runtimes.base import ModelOptions
    from draftwise.targets.layers import layer_subset

    tmp = tmp_path_factory.mktemp("qwen2-pair")
    target_dir = save_checkpoint(tmp / "target", tiny_model(tiny_config("qwen2", layers=4), seed=3), tiny_tokenizer())
    sibling = tiny_model(tiny_config("qwen2", layers=3), seed=4)
    config, weights = layer_subset(sibling.config, sibling.state_dict(), [0, 2])  # the cut: 2 of its 3 layers
    cut = AutoModelForCausalLM.from_config(config)
    cut.load_state_dict(weights)
    cut_dir = save_checkpoint(tmp / "cut", cut, tiny_tokenizer())
    data = tmp / "data"
    gen_data.run(GenDataConfig(target=target_dir, limit=6, max_new_tokens=12, temperatures=(0.0,), topk=8), data)
    reduced = write_reduced(cut_dir, data, 24, tmp / "reduced")
    ids, _ = vocab.read_map(reduced)
    assert len(ids) < 64
    options = ModelOptions(dtype=dtype)
    target = load(target_dir, options)
    drafter = load_drafter(str(reduced), target, options)
    assert drafter.lm.config.num_hidden_layers == 2
    drafted = 0
    for prompt in ([1, 5, 9], [1, 20, 21, 22, 20, 21], [1, 40]):
        ar = generate(target.lm, prompt, SamplingParams(), 24, torch.Generator())
        sd = generate(target.lm, prompt, SamplingParams(), 24, torch.Generator(), drafter=drafter.lm, gamma=3)
        assert sd.tokens == ar.tokens
        drafted += sum(r.drafted for r in sd.rounds)
    assert drafted > 0
