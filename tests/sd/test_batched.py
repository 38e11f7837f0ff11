import pytest
import torch

from conftest import tiny_config, tiny_model
from draftwise.runtimes.hf.model import HFCausalLM
from draftwise.runtimes.lean import kernels
from draftwise.runtimes.lean.forward import LeanLM
from draftwise.sd.batched import choose, generate_batch
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams, probs, sample

PROMPTS = [[1, 5, 9], [1, 20, 21, 22, 23, 24, 25], [1], [1, 7, 7, 7, 7]]


@pytest.fixture(params=["fast path", "torch path", "transformers"])
def lm(request, monkeypatch):
    config = tiny_config(layers=3)
    model = tiny_model(config, seed=31)
    if request.param == "torch path":
        monkeypatch.setattr(kernels, "_kernel", lambda: None)
    if request.param == "transformers":
        return HFCausalLM(model)
    return LeanLM(config, model.state_dict())


def test_left_padded_batch_equals_one_prompt_at_a_time(lm):
    greedy = SamplingParams()
    batch = generate_batch(lm, PROMPTS, greedy, 12, torch.Generator(), topk=3)
    for prompt, cont in zip(PROMPTS, batch):
        alone = generate(lm, prompt, greedy, 12, torch.Generator())
        assert cont.tokens == alone.tokens
        assert len(cont.topk_ids) == 12 and cont.topk_ids[0][0] == cont.tokens[0]  # greedy: the top-1 is the token
        assert cont.topk_probs[0] == sorted(cont.topk_probs[0], reverse=True)


def test_rows_stop_at_eos():
    config = tiny_config(layers=2)
    lm = LeanLM(config, tiny_model(config, seed=32).state_dict())
    free = generate_batch(lm, PROMPTS, SamplingParams(), 10, torch.Generator())
    eos = free[1].tokens[3]
    stopped = generate_batch(lm, PROMPTS, SamplingParams(), 10, torch.Generator(), eos=frozenset({eos}))
    for f, s in zip(free, stopped):
        cut = f.tokens.index(eos) + 1 if eos in f.tokens else len(f.tokens)
        assert s.tokens == f.tokens[:cut]


def test_a_prompt_continued_several_ways_is_prefilled_once_and_each_way_is_its_own(lm, monkeypatch):
    """gen-data's temperatures: row b·n + j is prompt b at params[j]; its greedy rows equal the prompt alone, and a
    runtime that copies cache rows (the lean engine's `repeat_rows`) prefills each prompt once."""
    passes, forward = [], lm.forward
    monkeypatch.setattr(lm, "forward", lambda ids, *a, **k: passes.append(ids.shape) or forward(ids, *a, **k))
    ways = [SamplingParams(), SamplingParams(temperature=1.0), SamplingParams()]
    batch = generate_batch(lm, PROMPTS, ways, 8, torch.Generator().manual_seed(0), topk=3)
    shapes = list(passes)
    assert len(batch) == 3 * len(PROMPTS)
    for b, prompt in enumerate(PROMPTS):
        alone = generate(lm, prompt, SamplingParams(), 8, torch.Generator())
        assert batch[3 * b].tokens == batch[3 * b + 2].tokens == alone.tokens
    once = isinstance(lm, LeanLM)
    assert shapes[0] == (len(PROMPTS) if once else 3 * len(PROMPTS), max(map(len, PROMPTS)))
    assert all(s == (3 * len(PROMPTS), 1) for s in shapes[1:])


def test_each_row_is_chosen_by_its_own_way():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    ways = [SamplingParams(), SamplingParams(temperature=1.0)]
    got = choose(logits, ways, torch.Generator().manual_seed(2))
    assert got[0::2].tolist() == logits[0::2].argmax(-1).tolist()
    assert got[1::2].tolist() == sample(probs(logits[1::2], ways[1]), torch.Generator().manual_seed(2)).tolist()
