"""Batched SD: rows are independent — greedy equals per-row batch-1 AR, sampling follows p per row, EOS is per row."""

import pytest
import torch
from chisquare import chisquare_pvalue
from test_loop import exact_first_three, lean, reduced_head

from conftest import tiny_config
from draftwise.sd.batched_sd import generate_batch_sd
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams

GREEDY = SamplingParams()
PROMPTS = [[1, 5, 9], [1, 20, 21, 22, 23, 24, 25], [1], [1, 7, 7, 7, 30]]


@pytest.fixture(scope="module")
def pair():
    return lean(tiny_config(vocab=64, layers=3), seed=11), lean(tiny_config(vocab=64, layers=1), seed=12)


@pytest.mark.parametrize("gamma", [0, 1, 3])
def test_batched_greedy_equals_batch1_ar_row_by_row(pair, gamma):
    target, drafter = pair
    want = [generate(target, p, GREEDY, 20, torch.Generator()).tokens for p in PROMPTS]
    outs, seconds = generate_batch_sd(
        target, PROMPTS, GREEDY, 20, torch.Generator(), drafter=drafter if gamma else None, gamma=gamma
    )
    assert [o.tokens for o in outs] == want and seconds > 0
    if gamma:
        assert any(r.accepted for o in outs for r in o.rounds)  # drafts were accepted, not just recovered


def test_batched_greedy_with_a_reduced_vocabulary_drafter(pair):
    target, drafter = pair
    want = [generate(target, p, GREEDY, 16, torch.Generator()).tokens for p in PROMPTS]
    outs, _ = generate_batch_sd(
        target, PROMPTS, GREEDY, 16, torch.Generator(), drafter=reduced_head(drafter, range(0, 64, 2)), gamma=2
    )
    assert [o.tokens for o in outs] == want


def test_a_row_ending_early_does_not_disturb_the_others(pair):
    target, drafter = pair
    free = [generate(target, p, GREEDY, 20, torch.Generator()).tokens for p in PROMPTS]
    eos = frozenset({free[0][2]})  # row 0 emits this as its 3rd token
    want = [generate(target, p, GREEDY, 20, torch.Generator(), eos=eos).tokens for p in PROMPTS]
    outs, _ = generate_batch_sd(target, PROMPTS, GREEDY, 20, torch.Generator(), drafter=drafter, gamma=3, eos=eos)
    assert [o.tokens for o in outs] == want
    assert len(outs[0].tokens) <= 3 and outs[0].tokens[-1] in eos


def test_batched_sampling_follows_the_target_distribution_in_every_row():
    V, params = 8, SamplingParams(1.0)
    target = lean(tiny_config(vocab=V, layers=2), seed=21, std=0.12)
    drafter = lean(tiny_config(vocab=V, layers=1), seed=22, std=0.12)
    prompts = [[1, 3, 5], [1, 6], [2, 4, 4, 1]]
    exact = [exact_first_three(target, p, params)[0] for p in prompts]  # [V, V] joint of the first two tokens
    counts = torch.zeros(len(prompts), V, V)
    gen = torch.Generator().manual_seed(0)
    for _ in range(1500):
        outs, _ = generate_batch_sd(target, prompts, params, 2, gen, drafter=drafter, gamma=2)
        for b, o in enumerate(outs):
            counts[b, o.tokens[0], o.tokens[1]] += 1
    for b in range(len(prompts)):
        assert chisquare_pvalue(counts[b], exact[b]) > 1e-3


def test_batched_greedy_with_sliding_windows_equals_batch1_ar():
    """Rows accept different numbers of tokens, so slots and positions differ: windows count positions, not slots."""
    target = lean(tiny_config("gemma3_text", vocab=64, layers=3), seed=11)
    drafter = lean(tiny_config("gemma3_text", vocab=64, layers=1), seed=12)
    want = [generate(target, p, GREEDY, 16, torch.Generator()).tokens for p in PROMPTS]
    outs, _ = generate_batch_sd(target, PROMPTS, GREEDY, 16, torch.Generator(), drafter=drafter, gamma=3)
    assert [o.tokens for o in outs] == want
