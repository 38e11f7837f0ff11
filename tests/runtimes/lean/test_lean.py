import pytest
import torch

from conftest import ROPE_SCALINGS, tiny_config, tiny_model
from draftwise.runtimes.lean import kernels
from draftwise.runtimes.lean.forward import LeanLM, unsupported_reason
from draftwise.targets.layers import layer_subset

CONFIGS = {
    "llama-gqa-tied": dict(kind="llama"),
    "llama-mha-untied": dict(kind="llama", num_key_value_heads=4, tie_word_embeddings=False),
    "llama-bias": dict(kind="llama", attention_bias=True, mlp_bias=True),
    **ROPE_SCALINGS,
    "head-dim-not-hidden/heads": dict(kind="llama", head_dim=16),
    "mistral": dict(kind="mistral", sliding_window=None),
    "qwen2-qkv-bias": dict(kind="qwen2", tie_word_embeddings=False),
    # the other families, with windows shorter than the test's 11 tokens so that sliding layers mask something
    "mistral-window": dict(kind="mistral", sliding_window=4),
    "qwen3-qk-norm": dict(kind="qwen3", tie_word_embeddings=False),
    "qwen3-window": dict(kind="qwen3", layers=3, use_sliding_window=True, sliding_window=4, max_window_layers=1),
    "phi3-fused": dict(kind="phi3", tie_word_embeddings=False),
    "phi3-window": dict(kind="phi3", sliding_window=5),
    "gemma": dict(kind="gemma"),
    "gemma2-softcap-local-global": dict(kind="gemma2", layers=3),
    "gemma3-local-global-two-ropes": dict(
        kind="gemma3_text",
        layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        },
    ),
}


@pytest.fixture(params=["fast path", "torch path"])
def path(request, monkeypatch):
    """Run a test with the C kernels, then again with every op on torch (as on a GPU or without a compiler)."""
    if request.param == "torch path":
        monkeypatch.setattr(kernels, "_kernel", lambda: None)
    elif not kernels.kernel_available():
        pytest.skip("CPU kernel not available")
    return request.param


@pytest.mark.parametrize("name", CONFIGS)
def test_lean_logits_equal_transformers(name, path):
    config = tiny_config(**CONFIGS[name])
    hf = tiny_model(config, seed=3)
    lean = LeanLM(config, hf.state_dict())
    ids = torch.randint(0, config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids).logits
    lean.reset(2, 40)
    # prefill, a one-token step, a rejected 4-token draft, then 3-token "verify" passes over the real tokens from the
    # rolled-back position: the cache must stitch them together exactly (11 tokens: past the families' windows of 4-5)
    first = [lean(ids[:, :6], 0), lean(ids[:, 6:7], 6)]
    lean(torch.tensor([[7, 8, 9, 10]] * 2), 7)
    got = torch.cat(first + [lean(ids[:, 7:10], 7), lean(ids[:, 10:], 10)], dim=1)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=2e-4)


def test_n_logits_and_cache_errors():
    config = tiny_config()
    lean = LeanLM(config, tiny_model(config).state_dict())
    lean.reset(1, 8)
    assert lean(torch.tensor([[3, 4, 5]]), 0, n_logits=1).shape == (1, 1, config.vocab_size)
    with pytest.raises(ValueError, match="reset"):
        lean(torch.tensor([[3] * 6]), 3)


def test_unsupported_architectures_are_named():
    assert unsupported_reason(tiny_config()) is None
    assert unsupported_reason(tiny_config(kind="mistral", sliding_window=16)) is None  # windows run on the lean path
    assert "partial rotary" in unsupported_reason(
        tiny_config(
            kind="phi3", rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
        )
    )
    assert "activation 'gelu'" in unsupported_reason(tiny_config(kind="gemma2", hidden_activation="gelu"))
    assert "depends on sequence length" in unsupported_reason(
        tiny_config(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})
    )
    from transformers import GPT2Config

    assert "model_type" in unsupported_reason(GPT2Config())


def test_compiled_forward_matches_eager():
    """torch.compile'd layers (the GPU option) give the eager logits; on CPU they take the torch path."""
    config = tiny_config(layers=1)
    sd = tiny_model(config, seed=6).state_dict()
    eager, compiled = LeanLM(config, sd), LeanLM(config, sd, compile=True)
    ids = torch.tensor([[1, 5, 9, 13]])
    for m in (eager, compiled):
        m.reset(1, 8)
    torch.testing.assert_close(compiled(ids, 0), eager(ids, 0), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(compiled(torch.tensor([[7]]), 4), eager(torch.tensor([[7]]), 4), atol=1e-4, rtol=1e-4)


FAMILY_CASES = [
    "llama-gqa-tied",
    "mistral-window",
    "qwen3-window",
    "phi3-window",
    "gemma",
    "gemma2-softcap-local-global",
    "gemma3-local-global-two-ropes",
]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("name", FAMILY_CASES)
def test_every_family_verify_rows_equal_decoding_steps_bitwise(name, precision):
    """What makes greedy SD reproduce greedy AR exactly: a (γ+1)-token pass computes each row as a 1-token step does —
    with q/k norms, GeGLU, soft-caps and windows too (a context of 12 tokens against windows of 4-5), at either
    precision of the lean engine."""
    if not kernels.kernel_available():
        pytest.skip("CPU kernel not available")
    config = tiny_config(**CONFIGS[name])
    lean = LeanLM(config, tiny_model(config, seed=8).state_dict(), precision=precision)
    ids = torch.randint(0, config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    lean.reset(1, 16)
    lean(ids[:, :7], 0, 0)
    together = lean(ids[:, 7:], 7)
    steps = torch.cat([lean(ids[:, i : i + 1], i) for i in range(7, 12)], dim=1)
    assert torch.equal(together, steps)


@pytest.mark.parametrize("name", FAMILY_CASES)
def test_every_family_layer_subset_equals_transformers_subset(name):
    """`layers:` drafters: kept layers keep their window and RoPE table (a valid local/global pattern)."""
    config = tiny_config(**{**CONFIGS[name], "layers": 3})
    hf = tiny_model(config, seed=5)
    sd = hf.state_dict()
    sub_config, sub_sd = layer_subset(config, sd, [1, 2])
    lean = LeanLM(config, sd)
    sub = lean.subset([1, 2], sub_config)
    assert sub.layers[0].wqkv.data_ptr() == lean.layers[1].wqkv.data_ptr()  # shares the target's weights
    ref_model = tiny_model(sub_config)
    ref_model.load_state_dict(sub_sd, strict=False)
    if sub_config.tie_word_embeddings:
        ref_model.tie_weights()
    ids = torch.randint(0, config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(2))
    sub.reset(1, 16)
    with torch.no_grad():
        torch.testing.assert_close(sub(ids, 0), ref_model(ids).logits, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize(
    "name", ["llama-bias", "qwen3-qk-norm", "gemma2-softcap-local-global", "gemma3-local-global-two-ropes"]
)
def test_a_fused_layer_gives_the_bits_of_its_kernels_called_one_by_one(name, precision, monkeypatch):
    """`kernels.layer` (one C call per layer) is the unfused fast path without Python between the kernels: the same
    bits, for steps, verify passes and left-padded batches (biases, q/k norms, sandwich norms, windows, soft-caps)."""
    if not kernels.kernel_available():
        pytest.skip("CPU kernel not available")
    config = tiny_config(**CONFIGS[name])
    lean = LeanLM(config, tiny_model(config, seed=9).state_dict(), precision=precision)
    assert all(layer.fused() is not None for layer in lean.layers)
    ids = torch.randint(3, config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(4))

    def run():
        lean.reset(2, 16)
        return torch.cat(
            [lean(ids[:, :5], 0, start=[0, 2]), lean(ids[:, 5:6], 5, start=[0, 2]), lean(ids[:, 6:], 6, start=[0, 2])],
            dim=1,
        )

    stack = run()
    assert lean.stack(5) is not None  # the passes above ran every layer in one C call
    monkeypatch.setattr(LeanLM, "stack", lambda self, rows: None)
    assert torch.equal(run(), stack)  # one C call a layer
    monkeypatch.setattr(type(lean.layers[0]), "fused", lambda self: None)
    assert torch.equal(run(), stack)  # the kernels one by one


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_a_replaced_or_moved_weight_remakes_the_stacks_c_form(precision):
    """The stack's C call points into the layers' tensors: a weight replaced (a bank's) or moved (`_apply`) is read
    from where it is now, never from where it was (the old tensors are kept alive here, so a stale pointer would
    silently give the old weights' logits)."""
    if not kernels.kernel_available():
        pytest.skip("CPU kernel not available")
    config = tiny_config(**CONFIGS["llama-bias"])
    lean = LeanLM(config, tiny_model(config, seed=9).state_dict(), precision=precision)
    other = LeanLM(config, tiny_model(config, seed=10).state_dict(), precision=precision)
    ids = torch.randint(3, config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(4))

    def logits(lm):
        lm.reset(1, 8)
        return lm(ids, 0)

    before, old = logits(lean), lean.layers[1].wgu
    lean.layers[1].wgu = other.layers[1].wgu
    replaced = logits(lean)
    assert not torch.equal(replaced, before)
    reference = LeanLM(config, tiny_model(config, seed=9).state_dict(), precision=precision)
    reference.layers[1].wgu = other.layers[1].wgu
    assert torch.equal(replaced, logits(reference))  # made fresh: no C form before the weight was replaced
    kept = [layer.ln_mlp.data_ptr() for layer in lean.layers]
    lean.share_memory()  # every buffer moved to shared memory (`_apply`, as `.to()` moves them)
    assert all(layer.ln_mlp.data_ptr() != k for layer, k in zip(lean.layers, kept))
    assert torch.equal(logits(lean), replaced)
    assert old is not None


def test_weight_bytes_count_what_a_step_reads_once(tiny_dir):
    """A tied fp32 model reads every parameter once a step (the embedding as the head); the same weights as an f32
    GGUF read the same bytes in llama.cpp."""
    from draftwise.gguf.export import written
    from draftwise.runtimes.hf import model as hf
    from draftwise.runtimes.llamacpp import lm as llamacpp
    from draftwise.runtimes.registry import load

    fp32 = load(tiny_dir)
    params = sum(p.numel() for p in fp32.hf_model().parameters())  # tied: the embedding once
    assert fp32.weight_bytes() == hf.step_bytes(fp32.hf_model()) == 4 * params
    gguf = written(tiny_dir, tiny_dir, "f32")
    assert llamacpp.step_bytes(gguf) == 4 * params
