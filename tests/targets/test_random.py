import pytest
import torch

from draftwise.errors import DraftwiseError
from draftwise.runtimes.registry import load, load_drafter
from draftwise.shapes import Shape
from draftwise.targets import random

TINY = "random:layers=3,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=300"


def test_random_target_and_drafter_shapes():
    target = load(TINY)
    assert Shape.of(target.config) == Shape(3, 64, 4, 2, 16, 96, 300, False)
    drafter = load_drafter("random:layers=1,hidden=32,heads=2,kv_heads=1,seed=1", target)
    assert Shape.of(drafter.config) == Shape(1, 32, 2, 1, 16, 96, 300, False)  # ffn, vocab from the target
    assert target.eos_ids == frozenset()  # random weights: a generation runs to its length
    assert all(3 <= i < 300 for i in target.encode("héllo"))
    target.lm.reset(1, 8)
    logits = target.lm.forward(torch.tensor([target.encode("abc")]), 0, 1)  # [1, 1, V]
    assert logits.shape == (1, 1, 300) and torch.isfinite(logits).all()


def test_default_random_is_llama_7b_shaped():
    shape = random.parse("random:")
    assert (shape["layers"], shape["hidden"], shape["heads"], shape["ffn"], shape["vocab"]) == (
        32,
        4096,
        32,
        11008,
        32000,
    )
    assert Shape.of(random.llama_config(shape)).params()["non_embedding"] == pytest.approx(6.48e9, rel=0.01)


def test_random_drafter_of_a_real_target_speaks_its_vocabulary(tiny_dir):
    target = load(tiny_dir)
    drafter = load_drafter("random:layers=1", target)
    assert drafter.tokenizer is target.tokenizer and drafter.config.vocab_size == target.config.vocab_size


@pytest.mark.parametrize(
    "spec,message",
    [
        ("random:layers=x", "key=integer"),
        ("random:depth=3", "key=integer"),
        ("random:heads=5,kv_heads=2", "multiple"),
        ("random:layers=0", ">= 1"),
    ],
)
def test_bad_random_specs(spec, message):
    with pytest.raises(DraftwiseError, match=message):
        random.parse(spec)


def test_random_models_have_no_transformers_twin():
    with pytest.raises(DraftwiseError, match="lean engine only"):
        load(TINY).hf_model()


@pytest.mark.parametrize("kind", ["qwen3", "phi3", "gemma2", "gemma3_text"])
def test_random_shapes_of_a_family_target_are_that_family(kind):
    """The sweep measures shapes of the target's family: its norms, q/k norms and local/global layers."""
    from conftest import tiny_config
    from draftwise.runtimes.checkpoint import random_lm
    from draftwise.targets.random import llama_config

    target = tiny_config(
        kind,
        layers=3,
        **(
            {"layer_types": ["sliding_attention", "full_attention", "full_attention"]}
            if kind.startswith("gemma")
            else {}
        ),
    )
    config = llama_config(
        {"layers": 5, "hidden": 64, "heads": 8, "kv_heads": 2, "head_dim": 8, "ffn": 96, "vocab": 64, "tied": True},
        target,
    )
    lm = random_lm(config, torch.float32, "cpu")
    assert config.model_type == kind and len(lm.layers) == 5
    if kind.startswith("gemma"):
        assert config.layer_types == [
            "sliding_attention",
            "full_attention",
            "full_attention",
            "sliding_attention",
            "full_attention",
        ]
        assert [layer.window for layer in lm.layers] == [config.sliding_window, None, None, config.sliding_window, None]
    lm.reset(1, 8)
    assert torch.isfinite(lm(torch.tensor([[1, 2, 3]]), 0)).all()
    hf_params = sum(p.numel() for p in __import__("transformers").AutoModelForCausalLM.from_config(config).parameters())
    assert Shape.of(config).params()["total"] == hf_params  # the cost model counts this family's norms
