"""Lookup drafters: exact indexes (against brute force, through appends and rollbacks), lossless SD with them
(greedy identical to AR, sampled output following p), and hybrids that fall back to the model exactly where the
lookup has nothing."""

import random

import pytest
import torch
from chisquare import chisquare_pvalue
from test_loop import exact_first_three, lean, sampled_first_three

from conftest import tiny_config
from draftwise.errors import DraftwiseError
from draftwise.sd.batched_sd import generate_batch_sd
from draftwise.sd.drafters import HybridDrafter, ModelDrafter
from draftwise.sd.lookup import NgramDrafter, SuffixDrafter
from draftwise.sd.loop import generate
from draftwise.sd.ngram import NgramIndex
from draftwise.sd.sampling import SamplingParams
from draftwise.sd.suffix import SuffixTrie

GREEDY = SamplingParams()


def brute_match(tokens: list[int], min_n: int, max_n: int):
    """The longest final n-gram (max_n..min_n) that also ends earlier, and its latest earlier end, by scanning."""
    L = len(tokens)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        tail = tokens[L - n :]
        for e in range(L - 2, n - 2, -1):
            if tokens[e - n + 1 : e + 1] == tail:
                return n, e
    return None


@pytest.mark.parametrize("min_n,max_n", [(1, 4), (2, 3), (1, 1)])
def test_ngram_index_equals_brute_force_through_appends_and_rollbacks(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    index, shadow = NgramIndex(min_n, max_n), []
    for step in range(1500):
        if shadow and rng.random() < 0.25:
            keep = rng.randrange(len(shadow) + 1)
            index.truncate(keep)
            del shadow[keep:]
        else:
            t = rng.randrange(5)  # a small alphabet: many repeats
            index.append(t)
            shadow.append(t)
        assert index.tokens == shadow
        assert index.match() == brute_match(shadow, min_n, max_n), step
    fresh = NgramIndex(min_n, max_n)
    fresh.extend(shadow)
    assert fresh.ends == index.ends  # a rolled-back index is the index of what it holds


def test_ngram_proposal_copies_the_latest_occurrence_and_continues_periodically():
    index = NgramIndex(1, 4)
    index.extend([7, 1, 2, 3, 9, 1, 2, 3, 4, 1, 2])
    assert index.match() == (2, 6)  # "1 2" ends at 6 (latest earlier) and at 2
    assert index.propose(3) == [3, 4, 1]
    index = NgramIndex(1, 4)
    index.extend([5, 6, 5, 6])  # period 2: the copy runs into the end and continues with what it proposed
    assert index.propose(5) == [5, 6, 5, 6, 5]
    assert NgramIndex(2, 4).propose(3) == [] and NgramIndex(1, 2).propose(0) == []


def brute_counts(corpus: list[list[int]], depth: int) -> dict[tuple, int]:
    counts: dict[tuple, int] = {}
    for seq in corpus:
        for i in range(len(seq)):
            for n in range(1, min(depth, len(seq) - i) + 1):
                key = tuple(seq[i : i + n])
                counts[key] = counts.get(key, 0) + 1
    return counts


def trie_count(trie: SuffixTrie, pattern) -> int:
    node = trie.find(list(pattern))
    return 0 if node is None else node.count


def test_suffix_trie_counts_every_substring_through_adds_and_removes():
    rng = random.Random(3)
    trie, live = SuffixTrie(depth=6), {}
    for step in range(60):
        if live and rng.random() < 0.35:
            sid = rng.choice(sorted(live))
            trie.remove(sid)
            del live[sid]
        else:
            seq = [rng.randrange(4) for _ in range(rng.randrange(1, 15))]
            live[trie.add(seq)] = seq
        want = brute_counts(list(live.values()), 6)
        for key, n in want.items():
            assert trie_count(trie, key) == n, (step, key)
        for _ in range(30):  # absent patterns are absent
            key = tuple(rng.randrange(4) for _ in range(rng.randrange(1, 7)))
            assert trie_count(trie, key) == want.get(key, 0)


def test_suffix_trie_longest_match_and_most_frequent_continuation():
    trie = SuffixTrie(depth=8)
    for seq in ([1, 2, 3, 4], [1, 2, 3, 4], [1, 2, 3, 5], [9, 2, 3, 7]):
        trie.add(seq)
    m, node = trie.longest_match([8, 8, 1, 2, 3], max_match=6)
    assert m == 3 and node.count == 3
    assert trie.continuation(node, m, 4, min_prob=0.5) == ([4], pytest.approx(2 / 3))
    assert trie.continuation(node, m, 4, min_prob=0.7) == ([], 1.0)  # 2/3 is below 0.7
    m, node = trie.longest_match([6, 2, 3], max_match=6)
    assert m == 2 and trie.continuation(node, m, 1, 0.0)[0] == [4]  # "2 3" → 4 (twice), 5, 7
    assert trie.longest_match([6, 6], 6) == (0, None)


def test_suffix_drafter_prefers_the_longer_match_and_scales_the_proposal_by_it():
    trie = SuffixTrie(depth=16)
    trie.add([10, 11, 12, 13, 14, 15, 16])
    drafter = SuffixDrafter(trie, factor=1.0, min_prob=0.1)
    index = drafter.index()
    index.extend([5, 10, 11, 12])  # the corpus matches 3 tokens, the request nothing
    assert drafter.propose(index, 8)[0] == [13, 14, 15]  # at most factor · 3
    index = drafter.index()
    index.extend([5, 6, 7, 5, 6, 7, 5, 6])  # the request matches "5 6 7 5 6" (its own repetition), the corpus nothing
    assert drafter.propose(index, 8)[0] == [7, 5, 6, 7, 5]
    assert SuffixDrafter(trie, factor=0.5).propose(index, 8)[0] == [7, 5]  # floor(0.5 · 5)


@pytest.fixture(scope="module")
def pair():
    return lean(tiny_config(vocab=64, layers=3), seed=11), lean(tiny_config(vocab=64, layers=1), seed=12)


PROMPTS = [[1, 5, 9, 5, 9, 5], [1, 20, 21, 22, 20, 21], [1], [3, 3, 3, 3]]


def lookups(target, prompts):
    """An n-gram drafter and a suffix drafter whose corpus is the target's own greedy output (it will match)."""
    trie = SuffixTrie(depth=12)
    for p in prompts[:2]:
        trie.add(generate(target, p, GREEDY, 30, torch.Generator()).tokens)
    return {"ngram": NgramDrafter(1, 3), "suffix": SuffixDrafter(trie, factor=2.0, min_prob=0.05)}


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_sd_with_lookup_drafters_is_identical_to_ar(pair, gamma):
    target, model = pair
    for name, drafter in {
        **lookups(target, PROMPTS),
        "hybrid": HybridDrafter(ModelDrafter(model), NgramDrafter(1, 3)),
    }.items():
        rounds = []
        for prompt in PROMPTS:
            ar = generate(target, prompt, GREEDY, 40, torch.Generator())
            sd = generate(target, prompt, GREEDY, 40, torch.Generator(), drafter=drafter, gamma=gamma)
            assert sd.tokens == ar.tokens, name
            assert all(r.drafted <= gamma and r.accepted <= r.drafted for r in sd.rounds)
            rounds += sd.rounds
        assert any(r.source == "lookup" and r.accepted for r in rounds), name  # lookups proposed and were kept


def test_batched_greedy_with_lookup_drafters_equals_batch1_ar(pair):
    target, _ = pair
    want = [generate(target, p, GREEDY, 24, torch.Generator()).tokens for p in PROMPTS]
    for drafter in lookups(target, PROMPTS).values():
        outs, _ = generate_batch_sd(target, PROMPTS, GREEDY, 24, torch.Generator(), drafter=drafter, gamma=4)
        assert [o.tokens for o in outs] == want
        assert any(r.drafted == 0 for o in outs for r in o.rounds)  # rows without a match verified alone


def test_hybrid_falls_back_to_the_model_exactly_where_the_lookup_has_no_match(pair):
    target, model = pair
    lookup = NgramDrafter(2, 3)
    for prompt in PROMPTS:
        sd = generate(
            target, prompt, GREEDY, 40, torch.Generator(), drafter=HybridDrafter(ModelDrafter(model), lookup), gamma=3
        )
        seq = list(prompt)
        for r in sd.rounds:
            if r.drafted:  # the lookup, replayed on the sequence at the start of this round
                expect = "lookup" if brute_match(seq, 2, 3) else "model"
                assert r.source == expect
            seq += sd.tokens[len(seq) - len(prompt) :][: r.emitted]
        assert {r.source for r in sd.rounds} >= {"lookup", "model"}
    with pytest.raises(DraftwiseError, match="batch size 1"):
        generate_batch_sd(
            target, PROMPTS, GREEDY, 4, torch.Generator(), drafter=HybridDrafter(ModelDrafter(model), lookup), gamma=2
        )


@pytest.mark.parametrize("kind", ["ngram", "suffix", "hybrid"])
def test_sampled_sd_with_a_lookup_drafter_follows_the_target_distribution(kind):
    V, params = 8, SamplingParams(1.0)
    target = lean(tiny_config(vocab=V, layers=2), seed=21, std=0.12)
    # ends with a token (and, for the hybrid's 2-gram lookup, a bigram) seen before: the lookup proposes at once
    prompt = [3, 5, 1, 3, 5] if kind == "hybrid" else [1, 3, 5, 3]
    trie = SuffixTrie(depth=6)
    trie.add([3, 5, 3, 5, 2, 4])
    drafter = {
        "ngram": NgramDrafter(1, 2),
        "suffix": SuffixDrafter(trie, factor=2.0, min_prob=0.0),
        "hybrid": HybridDrafter(
            ModelDrafter(lean(tiny_config(vocab=V, layers=1), seed=22, std=0.12)), NgramDrafter(2, 2)
        ),
    }[kind]
    joint12, marg3 = exact_first_three(target, prompt, params)
    c12, c3, rounds = sampled_first_three(target, prompt, params, drafter, V)
    lookup = [r for r in rounds if r.source == "lookup"]
    assert kind != "hybrid" or any(r.source == "model" for r in rounds)
    assert any(r.accepted < r.drafted for r in lookup) and any(r.accepted > 0 for r in lookup)
    assert chisquare_pvalue(c12, joint12) > 1e-3
    assert chisquare_pvalue(c3, marg3) > 1e-3
