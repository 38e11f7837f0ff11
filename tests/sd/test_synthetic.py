"""Synthetic acceptance: the real draft and verify work, with each draft kept with probability α."""

import pytest
import torch

from draftwise.runtimes.registry import load, load_drafter
from draftwise.sd.batched_sd import generate_batch_sd
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams

GREEDY = SamplingParams(0.0, 1.0)


@pytest.fixture(scope="module")
def pair():
    target = load("random:layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=100")
    return target, load_drafter("random:layers=1,seed=1", target)


def rounds(pair, alpha, gamma=4, n=400, seed=0):
    target, drafter = pair
    gen = generate(
        target.lm,
        [5, 6, 7],
        GREEDY,
        n,
        torch.Generator().manual_seed(seed),
        drafter=drafter.lm,
        gamma=gamma,
        synthetic_alpha=alpha,
    )
    assert len(gen.tokens) == n
    return [r for r in gen.rounds if r.drafted == gamma]  # full rounds (the last ones are cut by max_new_tokens)


def test_alpha_one_accepts_everything_and_zero_nothing(pair):
    assert all(r.accepted == 4 and r.emitted == 5 for r in rounds(pair, 1.0))
    assert all(r.accepted == 0 and r.emitted == 1 for r in rounds(pair, 0.0))


def test_mean_accepted_matches_iid_alpha(pair):
    alpha, gamma = 0.6, 4
    got = rounds(pair, alpha, gamma, n=3000)
    expected = sum(alpha**k for k in range(1, gamma + 1))  # E[accepted] = Σ_{k≤γ} α^k
    mean = sum(r.accepted for r in got) / len(got)
    var = sum((r.accepted - mean) ** 2 for r in got) / len(got)
    assert abs(mean - expected) < 4 * (var / len(got)) ** 0.5  # within 4 standard errors


def test_batched_synthetic_rows(pair):
    target, drafter = pair
    gens, _ = generate_batch_sd(
        target.lm,
        [[5, 6], [7, 8, 9]],
        GREEDY,
        40,
        torch.Generator().manual_seed(0),
        drafter=drafter.lm,
        gamma=3,
        synthetic_alpha=1.0,
    )
    assert all(len(g.tokens) == 40 for g in gens)
    assert all(r.accepted == r.drafted for g in gens for r in g.rounds)
