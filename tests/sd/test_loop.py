import itertools

import pytest
import torch
from chisquare import chisquare_pvalue

from conftest import tiny_config, tiny_model
from draftwise.errors import DraftwiseError
from draftwise.runtimes.hf.model import HFCausalLM
from draftwise.runtimes.lean.forward import LeanLM
from draftwise.runtimes.lean.reduced import ReducedHead
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams, probs
from draftwise.targets.vocab_map import slice_head

GREEDY = SamplingParams()


def lean(config, seed, std=0.3):
    return LeanLM(config, tiny_model(config, seed=seed, std=std).state_dict())


@pytest.fixture(scope="module")
def pair():
    config = tiny_config(vocab=64, layers=3)
    return lean(config, seed=11), lean(tiny_config(vocab=64, layers=1), seed=12)


PROMPTS = [[1, 5, 9], [1, 20, 21, 22, 23, 24, 25], [1]]


@pytest.mark.parametrize("gamma", [1, 2, 3, 5, 8])
def test_greedy_sd_is_identical_to_greedy_ar(pair, gamma):
    target, drafter = pair
    for prompt in PROMPTS:
        ar = generate(target, prompt, GREEDY, 40, torch.Generator())
        sd = generate(target, prompt, GREEDY, 40, torch.Generator(), drafter=drafter, gamma=gamma)
        assert sd.tokens == ar.tokens
        assert sum(r.emitted for r in sd.rounds) == len(sd.tokens) == 40
        assert all(r.drafted <= gamma and r.accepted <= r.drafted for r in sd.rounds)


def test_greedy_identity_with_a_drafter_made_of_target_layers():
    config = tiny_config(vocab=64, layers=4)
    target = lean(config, seed=13)
    from draftwise.targets.layers import layer_subset

    drafter = target.subset([0, 1, 3], layer_subset(config, {}, [0, 1, 3])[0])
    ar = generate(target, [1, 2, 3], GREEDY, 50, torch.Generator())
    sd = generate(target, [1, 2, 3], GREEDY, 50, torch.Generator(), drafter=drafter, gamma=4)
    assert sd.tokens == ar.tokens


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_identity_with_a_reduced_vocabulary_drafter(pair, gamma):
    target, drafter = pair
    small = reduced_head(drafter, ids=range(0, 64, 3))
    for prompt in PROMPTS:
        ar = generate(target, prompt, GREEDY, 24, torch.Generator())
        sd = generate(target, prompt, GREEDY, 24, torch.Generator(), drafter=small, gamma=gamma)
        assert sd.tokens == ar.tokens
    small.reset(1, 4)
    logits = small.forward(torch.tensor([[1, 5, 9]]), 0)  # [1, 3, V]
    assert torch.isinf(logits[..., [i for i in range(64) if i % 3]]).all() and torch.isfinite(logits[..., ::3]).all()


@pytest.mark.parametrize("gamma", [2, 6])
def test_greedy_identity_with_adaptive_lookahead(pair, gamma):
    target, drafter = pair
    rounds = []
    for prompt in PROMPTS:
        ar = generate(target, prompt, GREEDY, 24, torch.Generator())
        sd = generate(target, prompt, GREEDY, 24, torch.Generator(), drafter=drafter, gamma=gamma, stop_below=0.6)
        assert sd.tokens == ar.tokens
        rounds += sd.rounds
    assert any(0 < r.drafted < gamma for r in rounds)  # some rounds stopped drafting early


def test_drafter_equal_to_target_is_always_accepted(pair):
    target, _ = pair
    twin = LeanLM(
        target.config,
        {"model.embed_tokens.weight": target.embed, "model.norm.weight": target.norm_weight},
        layers=list(target.layers),
    )
    sd = generate(target, [1, 4, 7], GREEDY, 41, torch.Generator(), drafter=twin, gamma=4)
    assert [r.accepted for r in sd.rounds] == [4] * 8 + [0]  # the last round has no room to draft
    assert [r.emitted for r in sd.rounds] == [5] * 8 + [1]


def test_transformers_backend_is_lossless_too(pair):
    config = tiny_config(vocab=64, layers=3)
    target = HFCausalLM(tiny_model(config, seed=11))
    drafter = HFCausalLM(tiny_model(tiny_config(vocab=64, layers=1), seed=12))
    ar = generate(pair[0], [1, 5, 9], GREEDY, 30, torch.Generator())
    sd = generate(target, [1, 5, 9], GREEDY, 30, torch.Generator(), drafter=drafter, gamma=3)
    assert sd.tokens == ar.tokens


def test_stops_at_eos_and_max_new_tokens(pair):
    target, drafter = pair
    ar = generate(target, [1, 5, 9], GREEDY, 30, torch.Generator())
    eos = ar.tokens[7]
    cut = ar.tokens.index(eos) + 1
    for d, g in ((None, 0), (drafter, 4)):
        out = generate(target, [1, 5, 9], GREEDY, 30, torch.Generator(), drafter=d, gamma=g, eos=frozenset({eos}))
        assert out.tokens == ar.tokens[:cut]
        out = generate(target, [1, 5, 9], GREEDY, 3, torch.Generator(), drafter=d, gamma=g)
        assert out.tokens == ar.tokens[:3]


def test_bad_inputs(pair):
    target, drafter = pair
    with pytest.raises(DraftwiseError, match="empty prompt"):
        generate(target, [], GREEDY, 5, torch.Generator())
    with pytest.raises(DraftwiseError, match="gamma"):
        generate(target, [1], GREEDY, 5, torch.Generator(), drafter=drafter, gamma=0)


class Tweaked:
    """A drafter whose logits are transformed (to give it zero mass on some tokens, or a flat distribution)."""

    def __init__(self, lm, fn):
        self.lm, self.fn, self.vocab_size, self.device = lm, fn, lm.vocab_size, lm.device

    def reset(self, batch, max_len):
        self.lm.reset(batch, max_len)

    def forward(self, ids, pos, n_logits=None):
        return self.fn(self.lm.forward(ids, pos, n_logits))


def exact_first_three(target, prompt, params):
    """The target's exact distribution of (t1, t2) [V, V] and of t3 [V] after `prompt`, by enumeration."""
    V = target.vocab_size
    seqs = torch.tensor([prompt + [a, b] for a, b in itertools.product(range(V), repeat=2)])
    target.reset(len(seqs), len(prompt) + 3)
    p = probs(target.forward(seqs, 0), params)  # [V*V, T, V]
    n = len(prompt)
    p1 = p[0, n - 1]  # [V]
    p2 = p[:, n].view(V, V, V)[:, 0]  # [V(t1), V(t2)] (t2's distribution depends on t1 only)
    p3 = p[:, n + 1].view(V, V, V)  # [t1, t2, t3]
    joint12 = p1[:, None] * p2
    marg3 = (joint12[..., None] * p3).sum((0, 1))
    return joint12, marg3


def sampled_first_three(target, prompt, params, drafter, V: int, runs: int = 2000, **kw):
    """Counts of (token 1, token 2) pairs and of token 3 over `runs` sampled SD generations (γ = 2), and their
    rounds."""
    gen = torch.Generator().manual_seed(0)
    c12, c3, rounds = torch.zeros(V, V), torch.zeros(V), []
    for _ in range(runs):
        out = generate(target, prompt, params, 3, gen, drafter=drafter, gamma=2, **kw)
        c12[out.tokens[0], out.tokens[1]] += 1
        c3[out.tokens[2]] += 1
        rounds += out.rounds
    return c12, c3, rounds


def reduced_head(d, ids=(0, 2, 3, 5, 7)):
    """`d` with its LM head cut to some tokens (q = 0 on the rest, which the target can emit)."""
    sd = {"model.embed_tokens.weight": d.embed, "model.norm.weight": d.norm_weight}
    sub, sd = slice_head(d.config, sd, list(ids))
    return ReducedHead(LeanLM(sub, sd, layers=list(d.layers)), list(ids), d.vocab_size)


DRAFTERS = {  # (temperature, top_p, drafter, adaptive-lookahead threshold)
    "independent drafter, T=1": (1.0, 1.0, lambda d: d, 0.0),
    "reduced-vocabulary drafter head (5 of 8 tokens), T=1": (1.0, 1.0, reduced_head, 0.0),
    "adaptive lookahead (stop below q = 0.3), T=1": (1.0, 1.0, lambda d: d, 0.3),
    "drafter with zero mass on tokens the target can emit, T=0.7": (0.7, 1.0, lambda d: Tweaked(d, ban_tokens), 0.0),
    "drafter wider than the target's top-p set, T=1, top_p=0.8": (
        1.0,
        0.8,
        lambda d: Tweaked(d, lambda x: 0.05 * x),
        0.0,
    ),
}


def ban_tokens(logits):
    out = logits.clone()
    out[..., :4] = float("-inf")
    return out


@pytest.mark.parametrize("case", DRAFTERS)
def test_sampled_sd_follows_the_target_distribution(case):
    temperature, top_p, make, stop = DRAFTERS[case]
    params = SamplingParams(temperature, top_p)
    V = 8
    # flatter weights than elsewhere: every token has enough probability for the chi-square cells to fill
    target = lean(tiny_config(vocab=V, layers=2), seed=21, std=0.12)
    drafter = make(lean(tiny_config(vocab=V, layers=1), seed=22, std=0.12))
    prompt = [1, 3, 5]
    joint12, marg3 = exact_first_three(target, prompt, params)
    c12, c3, rounds = sampled_first_three(target, prompt, params, drafter, V, stop_below=stop)
    # the run exercised rejections (recovered tokens) as well as acceptances
    assert any(r.accepted < r.drafted for r in rounds) and any(r.accepted > 0 for r in rounds)
    assert chisquare_pvalue(c12, joint12) > 1e-3
    assert chisquare_pvalue(c3, marg3) > 1e-3


@pytest.mark.parametrize("kind", ["qwen3", "phi3", "gemma2", "gemma3_text"])
def test_greedy_sd_is_identical_to_greedy_ar_in_every_family(kind):
    """Prompts and outputs run past the sliding windows (4) of the Gemma configs."""
    target = lean(tiny_config(kind, vocab=64, layers=3), seed=11)
    drafter = lean(tiny_config(kind, vocab=64, layers=1), seed=12)
    for prompt in PROMPTS:
        ar = generate(target, prompt, GREEDY, 24, torch.Generator())
        sd = generate(target, prompt, GREEDY, 24, torch.Generator(), drafter=drafter, gamma=3)
        assert sd.tokens == ar.tokens
        small = generate(
            target, prompt, GREEDY, 24, torch.Generator(), drafter=reduced_head(drafter, range(0, 64, 2)), gamma=3
        )  # a reduced draft head (with Gemma 2's final soft-cap on the kept rows)
        assert small.tokens == ar.tokens
