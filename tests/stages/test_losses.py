import pytest
import torch

from draftwise.stages import losses


def dists(seed=0, n=5, v=7):
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(3 * torch.randn(n, v, generator=gen), -1), torch.randn(n, v, generator=gen)


@pytest.mark.parametrize("name", losses.LOSSES)
def test_each_loss_equals_its_definition_on_full_support(name):
    p, logits = dists()
    q = torch.softmax(logits, -1)
    ids = torch.arange(7).expand(5, 7)  # top-k = the whole vocabulary: the rest bin is empty
    got = losses.divergence(name, *losses.binned(ids, p, logits))
    m = (p + q) / 2
    expected = {
        "fkl": (p * (p / q).log()).sum(-1),
        "rkl": (q * (q / p).log()).sum(-1),
        "tvd": 1 - torch.minimum(p, q).sum(-1),
        "jsd": 0.5 * (p * (p / m).log()).sum(-1) + 0.5 * (q * (q / m).log()).sum(-1),
    }[name]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_tvd_is_one_minus_overlap_and_zero_at_equality():
    p, _ = dists(1)
    ids = torch.arange(7).expand(5, 7)
    assert losses.divergence("tvd", *losses.binned(ids, p, p.log())).abs().max() < 1e-6


def test_topk_binning_keeps_the_rest_mass():
    p = torch.tensor([[0.5, 0.3, 0.1, 0.05, 0.05]])
    logits = torch.log(torch.tensor([[0.2, 0.2, 0.2, 0.2, 0.2]]))
    pb, qb = losses.binned(torch.tensor([[0, 1]]), p[:, :2], logits)
    torch.testing.assert_close(pb, torch.tensor([[0.5, 0.3, 0.2]]))
    torch.testing.assert_close(qb, torch.tensor([[0.2, 0.2, 0.6]]))


def test_a_reduced_head_gives_the_target_tokens_it_lacks_no_mass():
    """A drafter deploying a head of some target ids: its softmax is over those rows, and a target token outside them
    keeps its p with q = 0 (SD never proposes it), so no loss can be lowered by it."""
    p = torch.tensor([[0.5, 0.3, 0.1, 0.05, 0.05]])
    to_draft = torch.tensor([0, -1, 1, 2, -1])  # the head holds target ids 0, 2, 3
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))  # over the head's rows
    pb, qb = losses.binned(torch.tensor([[0, 1, 2]]), p[:, :3], logits, to_draft)
    torch.testing.assert_close(pb, torch.tensor([[0.5, 0.3, 0.1, 0.1]]))
    torch.testing.assert_close(qb, torch.tensor([[0.5, 0.0, 0.25, 0.25]]))
    full = losses.binned(torch.tensor([[0, 2, 3]]), p[:, [0, 2, 3]], torch.log(torch.tensor([[0.5, 0.1, 0.25, 0.15]])))
    same = losses.binned(torch.tensor([[0, 2, 3]]), p[:, [0, 2, 3]], logits, torch.tensor([0, -1, 1, 2]))
    assert not torch.allclose(full[1], same[1])  # the head's own softmax, not the full one's rows
