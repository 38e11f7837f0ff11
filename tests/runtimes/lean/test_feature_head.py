"""The feature head (`models.feature_head`): shapes, the draft vocabulary, a checkpoint that round-trips without a copy
of the target's matrices, and the one-line refusals of a head that is not the target's."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean import feature_head as fh
from draftwise.runtimes.registry import load
from draftwise.targets.fingerprint import fingerprint


def make(target, d2t=(0, 3, 7, 9, 12, 40), blocks=2, seed=0) -> fh.FeatureHead:
    s = target.lm.shape
    config = fh.FeatureHeadConfig(s.hidden_size, 24, blocks, len(d2t), target.lm.vocab_size, s.rms_eps)
    return fh.FeatureHead(config, torch.tensor(d2t), seed).attach(target.lm)


@pytest.fixture(scope="module")
def target(tiny_dir):
    return load(tiny_dir)


def test_forward_maps_a_feature_and_a_token_to_draft_logits_and_the_next_feature(target):
    head = make(target)
    features, tokens = torch.randn(5, 32), torch.tensor([1, 4, 9, 9, 60])
    logits, feature = head(features, tokens)
    assert logits.shape == (5, 6) and feature.shape == (5, 32)
    # the logits are the target's head rows d2t applied to the returned feature
    torch.testing.assert_close(logits, feature @ target.lm.head[head.d2t].T)
    # positions are independent (a batch of positions trains like one position at a time)
    torch.testing.assert_close(head(features[2:3], tokens[2:3])[0], logits[2:3])
    assert head.parameter_count() == 3 * 32 + 32 * 64 + 2 * (32 + 2 * 24 * 32 + 32 * 24)


def test_draft_vocab_keeps_the_most_emitted_ids():
    ids = torch.tensor([[5, 7, 2], [5, 9, 2]])
    rows = [{"topk_ids": ids, "topk_probs": torch.tensor([[0.6, 0.3, 0.1], [0.5, 0.4, 0.0]])}]
    assert fh.draft_vocab(rows, 2).tolist() == [5, 9]  # mass 1.1 and 0.4 (7 has 0.3), sorted by id
    assert fh.draft_vocab(rows, 100).tolist() == [2, 5, 7, 9]  # fewer than asked: every id with mass
    with pytest.raises(DraftwiseError, match=">= 1"):
        fh.draft_vocab(rows, 0)


def test_a_checkpoint_round_trips_without_the_targets_matrices(target, tmp_path):
    head = make(target)
    with torch.no_grad():
        head.fc.mul_(1.5)  # not the seed's weights: the loaded head must read them from the file
    head.save(tmp_path / "h", fingerprint(target.tokenizer))
    stored = load_file(tmp_path / "h" / fh.WEIGHTS)
    assert "d2t" in stored and max(v.numel() for v in stored.values()) == 32 * 64  # fc: no [V, D] matrix
    again = fh.load(tmp_path / "h", target)
    features, tokens = torch.randn(3, 32), torch.tensor([3, 8, 50])
    for a, b in zip(head(features, tokens), again(features, tokens)):
        torch.testing.assert_close(a, b)


def test_a_head_of_another_tokenizer_or_width_is_refused_in_one_line(target, tmp_path):
    make(target).save(tmp_path / "h", "0123456789abcdef")
    with pytest.raises(DraftwiseError, match="another tokenizer") as e:
        fh.load(tmp_path / "h", target)
    assert "\n" not in str(e.value)
    make(target).save(tmp_path / "w", fingerprint(target.tokenizer))
    meta = json.loads((tmp_path / "w" / "config.json").read_text())
    (tmp_path / "w" / "config.json").write_text(json.dumps({**meta, "hidden": 64}))
    with pytest.raises(DraftwiseError, match="features of size 64"):
        fh.load(tmp_path / "w", target)
    with pytest.raises(DraftwiseError, match="holds no feature head"):
        fh.load(tmp_path, target)


def test_an_int8_target_lends_its_dequantized_head_rows(tiny_dir, target):
    int8 = load(tiny_dir, ModelOptions(dtype="int8"))
    a, b = make(target), make(int8)
    assert b.head.dtype == torch.float32 and b.head.shape == a.head.shape
    torch.testing.assert_close(b.head, a.head, atol=0.02, rtol=0)  # blocks of 32 at 8 bits: close, not equal
    assert not torch.equal(b.head, a.head)
