"""A GGUF file's 5- and 6-bit blocks (Q5_0, Q5_1, Q6_K) held as the file holds them: dequantized bit for bit as
gguf-py reads them, packed into nibbles and bit masks and back, and the kernel's product on them the torch
reference's bits on every path, at both activation precisions, a row alone as in a pass."""

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from conftest import c_paths, raw_rows
from draftwise.runtimes.lean import kernels, smoke
from draftwise.runtimes.lean.int8 import reference_linear
from draftwise.runtimes.lean.q4 import blocks5
from draftwise.runtimes.lean.q56 import Q5Weight, Q6Weight, blocks6

PATHS = c_paths()


def held(qtype: str, n: int, k: int, seed: int):
    raw = raw_rows(qtype, n, k, seed)
    parts = blocks6(raw) if qtype == "Q6_K" else blocks5(raw, qtype)
    cls = Q6Weight if qtype == "Q6_K" else Q5Weight
    return raw, cls(*(torch.from_numpy(t) for t in parts))


@pytest.mark.parametrize("qtype", ["Q5_0", "Q5_1", "Q6_K"])
def test_the_files_blocks_dequantize_bit_for_bit_as_gguf_reads_them(qtype):
    raw, w = held(qtype, 8, 512, seed=3)
    want = torch.from_numpy(gguf_dequantize(raw, GGMLQuantizationType[qtype]))
    assert torch.equal(w.dequantize(), want)
    bits = 6 if qtype == "Q6_K" else 5
    assert w.q.numel() == 64 * 512 * bits // 8  # rows padded to 64, `bits` a weight
    q = w.unpacked()[0][:8, :512]
    assert q.min() >= 0 and q.max() == 2**bits - 1  # every bit plane is used (random blocks)
    if qtype == "Q6_K":  # a signed byte per 16 weights and two fp32 per 256: 6.75 bits a weight, the file's 6.56
        assert w.scale_format == 3 and w.s.dtype == torch.int8 and w.z.numel() == 0
        assert w.s.numel() == 64 * 512 // 16 and w.sd.numel() == w.zd.numel() == 64 * 512 // 256
    else:
        assert w.scale_format == 1 and w.s.numel() == w.z.numel() == 64 * 512 // 32
    rows = w.rows([5, 1])
    assert torch.equal(rows.dequantize(), want[[5, 1]]) and rows.scale_format == w.scale_format


@pytest.mark.skipif(not PATHS, reason="no int8 C kernel on this machine")
@pytest.mark.parametrize("qtype,n,k", [("Q5_0", 61, 160), ("Q5_1", 96, 512), ("Q6_K", 61, 256), ("Q6_K", 128, 768)])
@pytest.mark.parametrize("abits", [16, 8])
def test_kernel_paths_equal_the_torch_reference_bitwise(qtype, n, k, abits):
    gen = torch.Generator().manual_seed(n)
    _, w = held(qtype, n, k, seed=n)
    w.abits = abits
    for m in (1, 2, 3, 4, 5, 9):
        x = smoke.activations(m, k, gen)
        ref = reference_linear(x, w)
        assert torch.allclose(ref, x @ w.dequantize().T, rtol=0.05, atol=0.05 * ref.abs().max().item())
        for isa in PATHS:
            got = kernels.int8_gemm(x, w, isa)
            assert torch.equal(got, ref), (m, isa)
            for i in range(m):  # a row alone: its bits in the pass
                assert torch.equal(kernels.int8_gemm(x[i : i + 1].contiguous(), w, isa)[0], got[i])


def test_q5_refuses_scales_fp16_cannot_hold():
    q = torch.zeros(4, 64, dtype=torch.uint8)
    s = torch.full((4, 2), 1e-3)  # not an fp16 value
    with pytest.raises(Exception, match="fp16"):
        Q5Weight(q, s, -16 * s)
