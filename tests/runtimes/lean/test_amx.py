"""The AMX path's tiling (`cpu_int8_amx.c`), checked on any CPU: built with the tile instructions emulated in plain C
from their definition, it gives the torch reference's bits on every weight format at both activation precisions,
for passes of 2 to 33 rows (a tile holds 16). On a CPU with AMX the ladder proves the real instructions the same way
before they are used (`ladder.py`); a machine without them never reaches this path."""

import pytest
import torch

from conftest import raw_rows
from draftwise.runtimes.lean import kernels, library, smoke
from draftwise.runtimes.lean.int8 import reference_linear
from draftwise.runtimes.lean.q4 import Q4Weight, blocks, k_factors

AMX = 3
EMULATED = library.load(("DRAFTWISE_AMX_EMULATE",)) if kernels.int8_isa() >= 2 else None


def formats() -> list:
    raw = raw_rows("Q4_K", 40, 512, seed=7)
    q4k = Q4Weight(*(torch.from_numpy(t) for t in blocks(raw, "Q4_K")), tuple(map(torch.from_numpy, k_factors(raw))))
    return [*smoke.weights(), q4k]  # int8, 4 bits (fp16 and fp32 scales), 5 bits, Q6_K, Q4_K's bytes


@pytest.mark.skipif(EMULATED is None, reason="the AMX path is built beside AVX-512, which this machine lacks")
@pytest.mark.parametrize("abits", [16, 8])
def test_the_emulated_tiles_give_the_references_bits(abits):
    gen = torch.Generator().manual_seed(abits)
    for w in formats():
        w.abits = abits
        for m in (2, 5, 16, 17, 33):
            x = smoke.activations(m, w.in_features, gen)
            got = kernels.int8_gemm(x, w, AMX, lib=EMULATED)
            assert torch.equal(got, reference_linear(x, w)), (type(w).__name__, w.scale_format, m)
            step = kernels.int8_gemm(x[:1].contiguous(), w, AMX, lib=EMULATED)  # one row: the AVX-512 path
            assert torch.equal(step[0], got[0])
