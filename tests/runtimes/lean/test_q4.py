"""The lean engine's q4 precision: a GGUF file's own 4-bit blocks, dequantized bit for bit as gguf-py reads them, run
by the int8 kernel's function on nibbles (its paths equal the torch reference bitwise, a verify pass's rows their
one-token bits), loaded from a file with the rows matched whatever order the lean engine keeps them in, and greedy
SD on it token-identical to AR on it."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from conftest import c_paths, raw_rows, small_gguf
from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean import kernels, ladder, smoke
from draftwise.runtimes.lean import prompt as prompt_path
from draftwise.runtimes.lean.int8 import Int8Weight, reference_linear
from draftwise.runtimes.lean.q4 import (
    TYPES,
    TYPES8,
    Q4Weight,
    blocks,
    blocks8,
    dequantize,
    k_factors,
)
from draftwise.runtimes.registry import load, load_drafter
from draftwise.sd.drafters import ModelDrafter
from draftwise.sd.lookup import NgramDrafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams

PATHS = c_paths()


@pytest.mark.parametrize("qtype", TYPES)
def test_the_files_blocks_dequantize_bit_for_bit_as_gguf_reads_them(qtype):
    raw = raw_rows(qtype, 8, 512, seed=len(qtype))
    q, s, z = blocks(raw, qtype)
    assert q.dtype == np.uint8 and q.max() <= 15 and s.shape == z.shape == (8, 16)
    want = gguf_dequantize(raw, GGMLQuantizationType[qtype])
    assert np.array_equal(dequantize(q, s, z), want)  # exactly equal (Q4_0's d·(8 - 8) is +0 here, -0 in gguf-py)
    held = Q4Weight(*(torch.from_numpy(t) for t in (q, s, z)))
    assert torch.equal(held.dequantize(), torch.from_numpy(want))  # packed into nibbles and back
    assert held.q.numel() == 64 * 512 // 2 and held.qsum.numel() == 0  # two to a byte (rows padded to 64)
    assert held.scale_format == (0 if qtype == "Q4_K" else 1)  # a Q4_K scale d·sc needs fp32; the others are fp16
    rows = held.rows([5, 1])
    assert torch.equal(rows.dequantize(), torch.from_numpy(want[[5, 1]])) and rows.scale_format == held.scale_format
    if qtype == "Q4_K":  # held as the file holds them: sc and mn a byte each, d and -dmin per super-block
        factored = Q4Weight(*(torch.from_numpy(t) for t in (q, s, z)), tuple(map(torch.from_numpy, k_factors(raw))))
        assert factored.scale_format == 2 and factored.s.dtype == torch.uint8
        assert torch.equal(factored.dequantize(), torch.from_numpy(want))
        assert torch.equal(factored.rows([5, 1]).dequantize(), torch.from_numpy(want[[5, 1]]))


@pytest.mark.parametrize("qtype", TYPES8)
def test_a_files_8_bit_blocks_are_held_at_int8_bit_for_bit(qtype):
    """Q8_0, Q5_0 and Q5_1 rows at int8 as the file holds them (q a byte, fp16 d and m): gguf-py's values exactly,
    and the kernel's product on them the reference's."""
    raw = raw_rows(qtype, 8, 512, seed=len(qtype))
    q, s, z = blocks8(raw, qtype)
    assert q.dtype == np.int8 and s.shape == z.shape == (8, 16)
    assert q.min() >= (-128 if qtype == "Q8_0" else -16) and q.max() <= (127 if qtype == "Q8_0" else 31)
    want = gguf_dequantize(raw, GGMLQuantizationType[qtype])
    held = Int8Weight.of_blocks(*(torch.from_numpy(t) for t in (q, s, z)))
    assert torch.equal(held.dequantize(), torch.from_numpy(want))
    assert torch.equal(held.rows([5, 1]).dequantize(), torch.from_numpy(want[[5, 1]]))
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0))
    for isa in PATHS:
        assert torch.equal(kernels.int8_gemm(x, held, isa), reference_linear(x, held))


@pytest.mark.skipif(not PATHS, reason="no int8 C kernel on this machine")
@pytest.mark.parametrize(
    "qtype,n,k,fmt",
    [("Q4_1", 96, 64, 1), ("Q4_1", 61, 160, 1), ("Q4_0", 256, 576, 1), ("Q4_K", 61, 512, 0), ("Q4_K", 96, 768, 2)],
)
@pytest.mark.parametrize("abits", [16, 8])
def test_kernel_paths_equal_the_torch_reference_bitwise(qtype, n, k, fmt, abits):
    """Every format of the scales (fp32, fp16, Q4_K's bytes and super-blocks), at both activation precisions, on each
    path the CPU has."""
    gen = torch.Generator().manual_seed(n)
    raw = raw_rows(qtype, n, k, seed=n)
    factors = tuple(map(torch.from_numpy, k_factors(raw))) if fmt == 2 else None
    w = Q4Weight(*(torch.from_numpy(t) for t in blocks(raw, qtype)), factors)
    w.abits = abits
    assert w.scale_format == fmt
    for m in (1, 2, 3, 4, 5, 7, 9):
        x = smoke.activations(m, k, gen)
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
    assert q4.lm.precision == "q4" and isinstance(q4.lm.head, Q4Weight)  # the file's 4-bit embedding, tied
    assert torch.equal(q4.lm.head.dequantize(), fp.lm.head)
    for a, b in zip(q4.lm.layers, fp.lm.layers):
        for name in ("wqkv", "wo", "wgu", "wd"):
            held = getattr(a, name)
            assert isinstance(held, Q4Weight), name
            assert torch.equal(held.dequantize(), getattr(b, name)), name  # the rows, in the lean engine's order
    int8 = load(q4_gguf, ModelOptions(dtype="int8")).lm
    size = lambda lm: sum(t.numel() * t.element_size() for t in lm.layers.buffers())  # noqa: E731
    assert size(q4.lm) < 0.55 * size(int8)  # 20 bytes a block of 32 against 38


@pytest.mark.parametrize("path", ["best", *[f"isa{i}" for i in PATHS], "torch", "a8", "bf16-prompts"])
def test_greedy_sd_on_q4_is_identical_to_q4_ar(small_q4_gguf, path, monkeypatch):
    """On every matrix path this machine runs (the ladder's route, each path alone, torch's reference), at 8-bit
    activations, and with prompt passes through torch's bf16 product (a long prompt reaches its bands)."""
    if path.startswith("isa"):
        monkeypatch.setattr(kernels, "route", lambda: ladder.Route.one(int(path[3:])))
    elif path == "torch":
        monkeypatch.setattr(kernels, "route", lambda: ladder.Route.one(0))
    elif path == "a8":
        monkeypatch.setenv("DRAFTWISE_ACTIVATION_BITS", "8")
    elif path == "bf16-prompts":
        if not PATHS:
            pytest.skip("no int8 C kernel on this machine")
        bf16 = kernels.forced(f"{ladder.NAMES[PATHS[0]]},bf16")
        monkeypatch.setattr(kernels, "route", lambda: bf16)
    q4_gguf = small_q4_gguf
    model = load(q4_gguf, ModelOptions(dtype="q4"))
    target, drafter = model.lm, load_drafter("layers:0", model, ModelOptions(dtype="q4")).lm
    assert isinstance(drafter.layers[0].wqkv, Q4Weight)  # the target's own layers
    shaped = load_drafter("random:layers=1", model, ModelOptions(dtype="q4")).lm  # no file of blocks: int8
    assert shaped.precision == "int8" and type(shaped.layers[0].wqkv) is Int8Weight
    assert target.layers[0].wqkv.abits == (8 if path == "a8" else 16)
    greedy = SamplingParams()
    long = [1] + [20 + i % 7 for i in range(40)]  # a prefill of 40 rows: the chunk band
    for prompt in ([1, 5, 9, 5, 9, 5], [1, 20, 21, 22, 20, 21], long):
        ar = generate(target, prompt, greedy, 30, torch.Generator())
        for gamma in (1, 4):
            sd = generate(target, prompt, greedy, 30, torch.Generator(), drafter=NgramDrafter(1, 3), gamma=gamma)
            assert sd.tokens == ar.tokens
        sd = generate(target, prompt, greedy, 30, torch.Generator(), drafter=ModelDrafter(drafter), gamma=3)
        assert sd.tokens == ar.tokens
    if path == "bf16-prompts":
        assert prompt_path.copies_bytes(target) > 0  # the long prompt did take it


def test_q4_without_a_file_of_blocks_gets_one_line(tiny_dir, tmp_path):
    with pytest.raises(DraftwiseError, match="was not read from one"):
        load(tiny_dir, ModelOptions(dtype="q4"))
    with pytest.raises(DraftwiseError, match="has none"):
        load(small_gguf(tmp_path, "q8_0"), ModelOptions(dtype="q4"))
    with pytest.raises(DraftwiseError, match="random model has none"):
        load("random:layers=1", ModelOptions(dtype="q4"))
