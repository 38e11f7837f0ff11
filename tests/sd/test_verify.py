"""The acceptance rule alone: with fixed p and q (no model), the first emitted token must follow p."""

import pytest
import torch
from chisquare import chisquare_pvalue

from draftwise.sd.sampling import sample
from draftwise.sd.verify import verify, verify_greedy

V = 6


def first_token_counts(p, q, trials, seed=0):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(V)
    for _ in range(trials):
        drafts = sample(q, gen)  # [γ]
        verdict = verify(drafts, q, p, gen)
        first = int(drafts[0]) if verdict.accepted > 0 else verdict.next_token
        counts[first] += 1
    return counts


P0 = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10, 0.00])
CASES = {
    "q differs": torch.tensor([0.10, 0.10, 0.40, 0.20, 0.10, 0.10]),
    "q has zero mass where p has mass": torch.tensor([0.0, 0.5, 0.0, 0.25, 0.25, 0.0]),
    "q wider than p's support": torch.full((V,), 1 / V),
    "q equals p": P0.clone(),
}


@pytest.mark.parametrize("case", CASES)
def test_first_token_follows_p(case):
    gamma = 2
    p = torch.stack([P0, torch.full((V,), 1 / V), torch.full((V,), 1 / V)])  # [γ+1, V]
    q = CASES[case].expand(gamma, V)  # [γ, V]
    counts = first_token_counts(p, q, trials=3000)
    assert counts[5] == 0  # p gives token 5 no mass: it is never emitted
    assert chisquare_pvalue(counts, P0) > 1e-3


def test_the_test_detects_a_biased_rule():
    """Guard on the test itself: emitting drafts without the p/q rule fails the chi-square."""
    counts = torch.zeros(V)
    gen = torch.Generator().manual_seed(0)
    q = CASES["q differs"]
    for _ in range(3000):
        counts[int(sample(q, gen))] += 1
    assert chisquare_pvalue(counts, P0) < 1e-6


def test_greedy_accepts_while_argmaxes_agree():
    p = torch.eye(V)[[1, 2, 3, 4]]  # target argmaxes 1, 2, 3 then 4 for the bonus position
    drafts = torch.tensor([1, 2, 0])
    q = torch.eye(V)[drafts]
    verdict = verify(drafts, q, p, torch.Generator().manual_seed(0))
    assert (verdict.accepted, verdict.next_token) == (2, 3)  # recovered = the target's argmax
    verdict = verify(torch.tensor([1, 2, 3]), torch.eye(V)[[1, 2, 3]], p, torch.Generator())
    assert (verdict.accepted, verdict.next_token) == (3, 4)  # all accepted: bonus from position γ+1


def test_greedy_verification_is_the_one_hot_limit_of_the_rule():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        targets = torch.randint(0, V, (4,), generator=gen)
        drafts = torch.where(torch.rand(3, generator=gen) < 0.7, targets[:3], torch.randint(0, V, (3,), generator=gen))
        one_hot = verify(drafts, torch.eye(V)[drafts], torch.eye(V)[targets], gen)
        assert verify_greedy(drafts.tolist(), targets.tolist()) == one_hot
