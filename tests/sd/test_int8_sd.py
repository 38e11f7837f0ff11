"""SD on the lean engine's int8 precision: greedy SD reproduces int8 AR with every drafter kind (each row of a verify
pass has its one-token bits), and sampled SD follows the int8 target's distribution."""

import pytest
import torch
from chisquare import chisquare_pvalue
from test_loop import exact_first_three, sampled_first_three

from conftest import tiny_config, tiny_model
from draftwise.runtimes.lean.forward import LeanLM
from draftwise.runtimes.lean.int8 import Int8Weight
from draftwise.sd.drafters import HybridDrafter, ModelDrafter
from draftwise.sd.lookup import NgramDrafter, SuffixDrafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.sd.suffix import SuffixTrie
from draftwise.targets.layers import layer_subset

GREEDY = SamplingParams()


def lean8(config, seed, std=0.3):
    return LeanLM(config, tiny_model(config, seed=seed, std=std).state_dict(), precision="int8")


@pytest.fixture(scope="module")
def pair():
    return lean8(tiny_config(vocab=64, layers=3), seed=11), lean8(tiny_config(vocab=64, layers=1), seed=12)


PROMPTS = [[1, 5, 9, 5, 9, 5], [1, 20, 21, 22, 20, 21], [1]]


def drafters(target, model):
    trie = SuffixTrie(depth=12)
    for p in PROMPTS[:2]:
        trie.add(generate(target, p, GREEDY, 30, torch.Generator()).tokens)
    layers = target.subset([0, 2], layer_subset(target.config, {}, [0, 2])[0])
    return {
        "model": ModelDrafter(model),
        "layers": ModelDrafter(layers),
        "ngram": NgramDrafter(1, 3),
        "suffix": SuffixDrafter(trie, factor=2.0, min_prob=0.05),
        "hybrid": HybridDrafter(ModelDrafter(model), NgramDrafter(1, 3)),
    }


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_sd_on_int8_is_identical_to_int8_ar_with_every_drafter_kind(pair, gamma):
    target, model = pair
    assert all(isinstance(layer.wqkv, Int8Weight) for layer in model.layers)  # the drafter runs at int8 too
    for name, drafter in drafters(target, model).items():
        for prompt in PROMPTS:
            ar = generate(target, prompt, GREEDY, 40, torch.Generator())
            sd = generate(target, prompt, GREEDY, 40, torch.Generator(), drafter=drafter, gamma=gamma)
            assert sd.tokens == ar.tokens, name


@pytest.mark.parametrize("kind", ["model", "suffix"])
def test_sampled_sd_on_int8_follows_the_int8_target(kind):
    V, params = 8, SamplingParams(1.0)
    target = lean8(tiny_config(vocab=V, layers=2), seed=21, std=0.12)
    trie = SuffixTrie(depth=6)
    trie.add([3, 5, 3, 5, 2, 4])
    drafter = {
        "model": ModelDrafter(lean8(tiny_config(vocab=V, layers=1), seed=22, std=0.12)),
        "suffix": SuffixDrafter(trie, factor=2.0, min_prob=0.0),
    }[kind]
    prompt = [1, 3, 5, 3]
    joint12, marg3 = exact_first_three(target, prompt, params)
    c12, c3, rounds = sampled_first_three(target, prompt, params, drafter, V)
    assert any(r.accepted < r.drafted for r in rounds) and any(r.accepted > 0 for r in rounds)
    assert chisquare_pvalue(c12, joint12) > 1e-3
    assert chisquare_pvalue(c3, marg3) > 1e-3
