"""The lean engine's q4 precision: a GGUF file's own 4-bit blocks, dequantized bit for bit as gguf-py reads them, run
by the int8 kernel's function on nibbles (its paths equal the torch reference bitwise, a verify pass's rows their
one-token bits), loaded from a file with the rows matched whatever order the lean engine keeps them in, and greedy
SD on it token-identical to AR on it."""

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from conftest import small_gguf
from draftwise.errors import DraftwiseError
from draftwise.models import ModelOptions, kernels, load, load_drafter
from draftwise.models.int8 import Int8Weight, reference_linear
from draftwise.models.q4 import TYPES, Q4Weight, blocks, dequantize
from draftwise.sd.drafters import ModelDrafter
from draftwise.sd.lookup import NgramDrafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams

PATHS = [isa for isa in (1, 2) if isa <= kernels.int8_isa()]


def raw_rows(qtype: str, n: int, k: int, seed: int) -> np.ndarray:
    """n rows of k weights as random blocks of `qtype`, with finite fp16 scales (and mins) in every block."""
    t = GGMLQuantizationType[qtype]
    block, size = GGML_QUANT_SIZES[t]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (n, k // block, size), dtype=np.uint8)
    halves = 2 if qtype == "Q4_0" else 4  # d (and m or dmin) lead each block
    raw[..., :halves] = (rng.standard_normal((n, k // block, halves // 2)) * 0.05).astype(np.float16).view(np.uint8)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype", TYPES)
def test_the_files_blocks_dequantize_bit_for_bit_as_gguf_reads_them(qtype):
    raw = raw_rows(qtype, 8, 512, seed=len(qtype))
    q, s, z = blocks(raw, qtype)
    assert q.dtype == np.uint8 and q.max() <= 15 and s.shape == z.shape == (8, 16)
    want = gguf_dequantize(raw, GGMLQuantizationType[qtype])
    assert np.array_equal(dequantize(q, s, z), want)  # exactly equal (Q4_0's d·(8 - 8) is +0 here, -0 in gguf-py)
    held = Q4Weight(*(torch.from_numpy(t) for t in (q, s, z)))
    assert torch.equal(held.dequantize(), torch.from_numpy(want))  # packed into nibbles and back
    assert held.q.numel() == 64 * 512 // 2  # two to a byte (rows padded to 64)
    assert torch.equal(held.rows([5, 1]).dequantize(), torch.from_numpy(want[[5, 1]]))


@pytest.mark.skipif(not PATHS, reason="no int8 C kernel on this machine")
@pytest.mark.parametrize("n,k", [(96, 64), (61, 160), (256, 576)])
def test_kernel_paths_equal_the_torch_reference_bitwise(n, k):
    gen = torch.Generator().manual_seed(n)
    w = Q4Weight(*(torch.from_numpy(t) for t in blocks(raw_rows("Q4_1", n, k, seed=n), "Q4_1")))
    for m in (1, 2, 3, 4, 5, 7, 9):
        x = 3 * torch.randn(m, k, generator=gen)
        ref = reference_linear(x, w)
        for isa in PATHS:
            got = kernels.int8_gemm(x, w, isa)
            assert torch.equal(got, ref), (m, isa)
            for i in range(m):  # a row alone: its bits in the pass
                assert torch.equal(kernels.int8_gemm(x[i : i + 1].contiguous(), w, isa)[0], got[i])


def test_loading_a_gguf_at_q4_runs_its_blocks(small_q4_gguf):
    q4_gguf = small_q4_gguf
    q4 = load(q4_gguf, ModelOptions(dtype="q4"))
    fp = load(q4_gguf, ModelOptions(dtype="fp32"))
    assert q4.lm.precision == "q4" and isinstance(q4.lm.head, Int8Weight) and not isinstance(q4.lm.head, Q4Weight)
    for a, b in zip(q4.lm.layers, fp.lm.layers):
        for name in ("wqkv", "wo", "wgu", "wd"):
            held = getattr(a, name)
            assert isinstance(held, Q4Weight), name
            assert torch.equal(held.dequantize(), getattr(b, name)), name  # the rows, in the lean engine's order
    int8 = load(q4_gguf, ModelOptions(dtype="int8")).lm
    size = lambda lm: sum(t.numel() * t.element_size() for t in lm.layers.buffers())  # noqa: E731
    assert size(q4.lm) < 0.72 * size(int8)  # 26 bytes a block of 32 against 38


def test_greedy_sd_on_q4_is_identical_to_q4_ar(small_q4_gguf):
    q4_gguf = small_q4_gguf
    model = load(q4_gguf, ModelOptions(dtype="q4"))
    target, drafter = model.lm, load_drafter("layers:0", model, ModelOptions(dtype="q4")).lm
    assert isinstance(drafter.layers[0].wqkv, Q4Weight)  # the target's own layers
    shaped = load_drafter("random:layers=1", model, ModelOptions(dtype="q4")).lm  # no file of blocks: int8
    assert shaped.precision == "int8" and type(shaped.layers[0].wqkv) is Int8Weight
    greedy = SamplingParams()
    for prompt in ([1, 5, 9, 5, 9, 5], [1, 20, 21, 22, 20, 21]):
        ar = generate(target, prompt, greedy, 30, torch.Generator())
        for gamma in (1, 4):
            sd = generate(target, prompt, greedy, 30, torch.Generator(), drafter=NgramDrafter(1, 3), gamma=gamma)
            assert sd.tokens == ar.tokens
        sd = generate(target, prompt, greedy, 30, torch.Generator(), drafter=ModelDrafter(drafter), gamma=3)
        assert sd.tokens == ar.tokens


def test_q4_without_a_file_of_blocks_gets_one_line(tiny_dir, tmp_path):
    with pytest.raises(DraftwiseError, match="was not read from one"):
        load(tiny_dir, ModelOptions(dtype="q4"))
    with pytest.raises(DraftwiseError, match="has none"):
        load(small_gguf(tmp_path, "q8_0"), ModelOptions(dtype="q4"))
    with pytest.raises(DraftwiseError, match="random model has none"):
        load("random:layers=1", ModelOptions(dtype="q4"))
