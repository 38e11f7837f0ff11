"""Tiny random models and checkpoints, so the suite runs in minutes on 2 CPU cores.

Weights are drawn wider than transformers' init (std 0.3 instead of 0.02) so that next-token distributions are
neither uniform nor one-hot: acceptance tests then exercise accepted, recovered and bonus tokens alike.
"""

from __future__ import annotations

import json
import mmap
import os
import time

import numpy as np
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

WORDS = [f"w{i}" for i in range(60)]


def c_paths() -> list[int]:
    """The int8 kernel's exact paths this CPU runs (codes, `ladder.NAMES`; AMX only where the OS grants it): tests hold
    them to the same bits."""
    from draftwise.runtimes.lean import kernels, ladder

    if not kernels.kernel_available():
        return []
    best = kernels._kernel().draftwise_int8_isa()
    return [code for code in ladder.NAMES if code and ladder.RUNS_ON[code] <= best]


@pytest.fixture(scope="session", autouse=True)
def session_cache(tmp_path_factory):
    """One draftwise cache per test session, under pytest's own temporary folders (it keeps the last three). Tests
    write models into temporary paths and the cache is keyed by path, so in the user's cache their conversions, packs
    and GGUF files would pile up run after run (~1 GB a CI run: it filled a disk). Compiled kernels and the verdicts
    of their timed ladder are keyed by source and CPU, not by path: those are shared."""
    from draftwise.paths import cache_dir

    kernels = cache_dir("kernels")  # the user's, before the variable below points elsewhere
    root = tmp_path_factory.mktemp("draftwise-cache")
    (root / "kernels").symlink_to(kernels, target_is_directory=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DRAFTWISE_CACHE", str(root))
        yield root


def pytest_collection_modifyitems(config, items):
    """Tests marked `cuda` skip cleanly on machines without a CUDA GPU (CI has none)."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


def tiny_config(kind: str = "llama", vocab: int = 64, layers: int = 2, **overrides):
    import transformers

    cls = getattr(transformers, FAMILY_CONFIGS[kind])
    kw = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    if kind in ("qwen3", "gemma", "gemma2", "gemma3_text"):
        kw["head_dim"] = 8  # their configs default to a head_dim of their own, not hidden/heads
    if kind in ("gemma2", "gemma3_text"):
        kw.update(query_pre_attn_scalar=8, sliding_window=4)
    kw.update(overrides)
    return cls(**kw)


# the RoPE scalings the lean forward and the GGUF export both cover (llama3, linear, yarn), as tiny_config overrides
ROPE_SCALINGS = {
    "llama3-rope": dict(
        kind="llama",
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 10000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
    ),
    "linear-rope": dict(kind="llama", rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}),
    "yarn-rope": dict(
        kind="llama",
        rope_parameters={
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
}


# the transformers config class of each family the lean forward runs
FAMILY_CONFIGS = {
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "phi3": "Phi3Config",
    "gemma": "GemmaConfig",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",
}


def tiny_model(config, seed: int = 0, std: float = 0.3):
    """A transformers causal LM of `config` with every weight (biases and norms included) drawn from a seeded normal."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # around 1 as a norm's scale (Gemma stores scale - 1: around 0 there)
                center = 0.0 if config.model_type.startswith("gemma") else 1.0
                p.copy_(center + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
    return model


def tiny_tokenizer(vocab: int = 64, chat_template: bool = True):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    names = ["<unk>", "<s>", "</s>"] + WORDS
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(names[:vocab])}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", pad_token="</s>"
    )
    if chat_template:
        fast.chat_template = "{% for m in messages %}<s> {{ m['content'] }} {% endfor %}"
    return fast


def save_checkpoint(path, model, tokenizer) -> str:
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A 4-layer tiny Llama checkpoint directory (safetensors + tokenizer with a chat template)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    return save_checkpoint(path, tiny_model(tiny_config(layers=4), seed=1), tiny_tokenizer())


@pytest.fixture(scope="session")
def tiny_gemma_dir(tmp_path_factory):
    """A 4-layer tiny Gemma 3 checkpoint (local, global, local, global layers; window 4) with the same tokenizer."""
    path = tmp_path_factory.mktemp("tiny-gemma3")
    config = tiny_config("gemma3_text", layers=4, layer_types=["sliding_attention", "full_attention"] * 2)
    return save_checkpoint(path, tiny_model(config, seed=1), tiny_tokenizer())


@pytest.fixture(scope="session")
def tiny_drafter_dir(tmp_path_factory):
    """A 1-layer tiny Llama with the same tokenizer: an independent drafter for `tiny_dir`."""
    path = tmp_path_factory.mktemp("tiny-drafter")
    return save_checkpoint(path, tiny_model(tiny_config(layers=1), seed=2), tiny_tokenizer())


@pytest.fixture(scope="session")
def tiny_gguf(tiny_dir, tmp_path_factory):
    """`tiny_dir` (the 4-layer tiny Llama) exported as GGUF at f32, tokenizer built from its own: the .gguf path."""
    from draftwise.gguf.export import export

    return str(export(tiny_dir, tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf", "f32", target=tiny_dir))


@pytest.fixture(scope="session")
def tiny_drafter_gguf(tiny_dir, tiny_drafter_dir, tmp_path_factory):
    """`tiny_drafter_dir` exported as GGUF at f32 with `tiny_gguf`'s tokenizer metadata: the .gguf path."""
    from draftwise.gguf.export import export

    return str(
        export(
            tiny_drafter_dir, tmp_path_factory.mktemp("tiny-drafter-gguf") / "tiny-drafter.gguf", "f32", target=tiny_dir
        )
    )


def held(mb: int, seconds: float = 0.3) -> None:
    """`mb` MB resident for `seconds` (the memory tests' stage): fresh pages, as a malloc may reuse pages a process
    freed but still holds; long enough by default for a sampler on the slowest machine to see them."""
    block = mmap.mmap(-1, mb * 2**20)
    np.frombuffer(block, np.uint8)[:] = 1  # touched: resident
    time.sleep(seconds)
    block.close()


def raw_rows(qtype: str, n: int, k: int, seed: int):
    """n rows of k weights as random blocks of GGUF type `qtype`, with finite fp16 scales (and mins) in every block
    (where each type keeps them: Q6_K's d ends its block, the others' lead it)."""
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype]]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    halves = 2 if qtype in ("Q4_0", "Q5_0", "Q8_0", "Q6_K") else 4  # bytes of d (and m or dmin)
    at = slice(size - 2, size) if qtype == "Q6_K" else slice(0, halves)
    raw[..., at] = (rng.standard_normal((n, k // block, halves // 2)) * 0.05).astype(np.float16).view(np.uint8)
    return raw.reshape(n, -1)


def small_gguf(out, quant: str) -> str:
    """A 2-layer Llama with the default target's tokenizer (49,152 tokens; transformers reads it back) whose
    matrices all block (d 64, ffn 96), written at `quant` by the project's GGUF writer, marked as random weights."""
    from draftwise.errors import DraftwiseError
    from draftwise.gguf.write import write_gguf
    from draftwise.targets.source import default_gguf

    try:
        tokenizer = default_gguf()
    except DraftwiseError as e:
        pytest.skip(str(e))
    config = tiny_config(vocab=49152, layers=2, hidden_size=64, intermediate_size=96)
    state = tiny_model(config, seed=5, std=0.3).state_dict()
    return str(
        write_gguf(
            config, state, None, out / f"small-{quant}.gguf", quant=quant, tokenizer_gguf=tokenizer, random_weights=True
        )
    )


@pytest.fixture(scope="session")
def small_q4_gguf(tmp_path_factory):
    """`small_gguf` at Q4_1: a target whose file has 4-bit blocks (the lean engine's q4, the design's lean-q4 row)."""
    return small_gguf(tmp_path_factory.mktemp("q4-gguf"), "q4_1")


def write_json(path, obj) -> None:
    path.write_text(json.dumps(obj))
