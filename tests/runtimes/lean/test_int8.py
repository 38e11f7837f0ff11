"""The lean engine's int8 precision: the kernel's paths compute one function (bitwise, whatever the rows of a pass),
the int8 model's logits stay near fp32's, and a precision the machine cannot run gets one line. SD on it:
tests/sd/test_int8_sd.py."""

import pytest
import torch

from conftest import c_paths, tiny_config, tiny_model
from draftwise import specs
from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean import kernels, smoke
from draftwise.runtimes.lean.forward import LeanLM
from draftwise.runtimes.lean.int8 import Int8Weight, quantize_blocks, quantize_rows, reference_linear
from draftwise.runtimes.registry import load, load_drafter

PATHS = c_paths()  # the C paths this CPU runs


def lean8(config, seed, std=0.3):
    return LeanLM(config, tiny_model(config, seed=seed, std=std).state_dict(), precision="int8")


def test_weights_are_quantized_in_asymmetric_blocks_of_32():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(10, 70, generator=gen) * torch.linspace(0.1, 10, 10)[:, None]  # rows of very different ranges
    q = Int8Weight(w)
    assert q.q.shape == (4, 128 * 16) and q.q.dtype == torch.int8  # 64 rows (padded) in groups of 16, K padded to 128
    wq, s, z = q.unpacked()
    assert wq.shape == (64, 128) and s.shape == z.shape == (64, 4)
    step = s[:10].repeat_interleave(32, 1)[:, :70]
    assert ((q.dequantize() - w).abs() <= step * 0.51 + 1e-4 * w.abs().amax()).all()  # within half a step, per block
    assert torch.equal(q.rows([3, 7]).dequantize(), q.dequantize()[[3, 7]])


def test_a_q4_block_is_held_exactly():
    """16 levels d·i + m (a Q4_1 block using all of them) are 17·i − 128 steps of (15 d / 255): exact in int8 but for
    the fp16 rounding of the scale and offset (under 1 % of a Q4 step)."""
    d, m = 0.0123, -0.071
    levels = d * torch.arange(16.0) + m
    w = levels[torch.randint(0, 16, (4, 64), generator=torch.Generator().manual_seed(1))]
    w[:, 0], w[:, 1], w[:, 32], w[:, 33] = levels[0], levels[15], levels[0], levels[15]  # each block spans them all
    assert (Int8Weight(w).dequantize() - w).abs().max() < 0.01 * d  # fp16 scale and offset: all that is left


@pytest.mark.skipif(not PATHS, reason="no int8 C kernel on this machine")
@pytest.mark.parametrize("n,k", [(96, 40), (61, 130), (256, 576)])
@pytest.mark.parametrize("abits", [16, 8])
def test_kernel_paths_equal_the_torch_reference_bitwise(n, k, abits):
    """Exact integer sums per block, then the same fp32 operations in the same order: AVX-512, AVX2 and torch give the
    same bits, on any number of rows, with 16-bit activations per row or 8-bit ones per block."""
    gen = torch.Generator().manual_seed(n)
    w = Int8Weight(torch.randn(n, k, generator=gen))
    w.abits = abits
    for m in (1, 2, 3, 4, 5, 7, 9, 13):
        x = smoke.activations(m, k, gen)
        x[0, :4] = 0.0 if m > 1 else x[0, :4]
        ref = reference_linear(x, w)
        for isa in PATHS:
            assert torch.equal(kernels.int8_gemm(x, w, isa), ref), (m, isa)


@pytest.mark.skipif(not PATHS, reason="no int8 C kernel on this machine")
def test_a_zero_row_and_a_row_alone_give_their_pass_bits():
    gen = torch.Generator().manual_seed(3)
    w = Int8Weight(torch.randn(64, 96, generator=gen))
    x = torch.randn(5, 96, generator=gen)
    x[2] = 0.0  # scale 0: all zeros, not NaN
    together = kernels.int8_gemm(x, w)
    assert torch.equal(together[2], torch.zeros(64))
    for i in range(5):
        assert torch.equal(kernels.int8_gemm(x[i : i + 1].contiguous(), w)[0], together[i])


def test_activation_blocks_are_quantized_on_their_own():
    """Per block (abits 8) each block of 32 of a row has its own scale, at 8 bits (held as 256 v) unless it holds an
    outlier far above the row's typical size, then at 16: an outlier costs only its own block's resolution."""
    x = torch.full((2, 160), 0.5)
    x[0, 3] = 100.0  # row 0, block 0: an outlier; row 1 has none
    q, s = quantize_blocks(x, 192)
    assert q.shape == (2, 192) and s.shape == (2, 6)
    assert q[0, 3] == 32767 and q[0, 0] == 164 and s[0, 0] == torch.tensor(100.0) / 32767  # 16 bits
    at8 = torch.tensor(127.0 * 256)  # 0.5 at 8 bits, in 16-bit units
    assert torch.equal(q[0, 32:160], at8.repeat(128)) and torch.equal(q[1, :160], at8.repeat(160))
    assert s[0, 1] == torch.tensor(0.5) / 127 / 256 and torch.equal(s[1, :5], s[0, 1].repeat(5))
    assert torch.equal(q[:, 160:], torch.zeros(2, 32)) and torch.equal(s[:, 5], torch.zeros(2))
    y = quantize_blocks(torch.full((1, 40), 0.5).index_fill(1, torch.tensor([3]), 100.0), 64)[0]
    assert y[0, 3] == 127 * 256  # in a row of 40 one outlier is a fifth of its mean square: no block is far above


def test_activation_rows_are_quantized_on_their_own():
    x = torch.tensor([[1.0, -2.0, 0.5], [100.0, 50.0, -25.0]])
    q, s = quantize_rows(x)
    assert torch.equal(q, torch.tensor([[16384.0, -32767.0, 8192.0], [32767.0, 16384.0, -8192.0]]))
    assert torch.allclose(s, torch.tensor([2.0, 100.0]) / 32767)


def test_int8_logits_stay_near_fp32():
    """The stated tolerance on a tiny model (std 0.3 weights, 3 layers): an RMS logit error under 8 % of the logits'
    spread, and the argmax changed only at near-ties (fp32's margin between the two tokens under twice the largest
    logit error)."""
    config = tiny_config(vocab=64, layers=3)
    state = tiny_model(config, seed=11).state_dict()
    fp, q = LeanLM(config, state), LeanLM(config, state, precision="int8")
    ids = torch.randint(3, 64, (1, 48), generator=torch.Generator().manual_seed(0))
    fp.reset(1, 48), q.reset(1, 48)
    a, b = fp.forward(ids, 0)[0], q.forward(ids, 0)[0]  # [T, V]
    err = (a - b).abs()
    assert err.pow(2).mean().sqrt() < 0.08 * a.std()
    flips = (a.argmax(-1) != b.argmax(-1)).nonzero().flatten()
    assert len(flips) <= 0.15 * len(a)
    for t in flips:
        assert a[t].max() - a[t, b[t].argmax()] < 2 * err.max()


def test_a_verify_pass_gives_each_row_its_one_token_bits():
    config = tiny_config(vocab=64, layers=2)
    lm = lean8(config, seed=4)
    ids = torch.tensor([[1, 7, 9, 3, 22, 5, 8]])
    lm.reset(1, 16)
    lm.forward(ids[:, :3], 0)
    together = lm.forward(ids[:, 3:], 3)[0]  # a 4-token pass
    steps = [lm.forward(ids[:, 3 + i : 4 + i], 3 + i)[0, 0] for i in range(4)]
    assert all(torch.equal(together[i], s) for i, s in enumerate(steps))


def test_loading_at_int8(tiny_dir, tiny_drafter_dir):
    options = ModelOptions(dtype="int8")
    target = load(tiny_dir, options)
    assert isinstance(target.lm.head, Int8Weight) and target.backend == "lean"
    drafter = load_drafter(tiny_drafter_dir, target, options)
    assert isinstance(drafter.lm.layers[0].wd, Int8Weight)
    assert isinstance(specs.load("layers:0,3", target, options).model.lm.layers[1].wgu, Int8Weight)


@pytest.mark.parametrize(
    "options,message",
    [
        (ModelOptions(dtype="int8", backend="transformers"), "precision of the lean engine, not of backend"),
        (ModelOptions(dtype="int8", backend="llama.cpp"), "precision of the lean engine, not of backend"),
        (ModelOptions(dtype="int4"), "unknown dtype 'int4'"),
    ],
)
def test_a_precision_the_machine_cannot_run_gets_one_line(tiny_dir, options, message):
    with pytest.raises(DraftwiseError, match=message):
        load(tiny_dir, options)


def test_int8_on_a_gpu_is_refused_in_one_line(tiny_dir):
    with pytest.raises(DraftwiseError, match="no CUDA GPU|lean engine on the CPU"):
        load(tiny_dir, ModelOptions(dtype="int8", device="cuda"))
