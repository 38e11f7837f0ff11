"""The integer kernel's smoke test and timing, run in a child process by `ladder.run_child` (`python -m
draftwise.runtimes.lean.smoke PATH`, a path's name): exit 0 when the path gives the torch reference's bits on every
weight format at both activation precisions, its timings (`rates.py`) as the last line of stdout (JSON); 1 when it
differs; a path that cannot run here kills only this process. The bf16 prompt path is not the reference's bits by
design: it must run and stay near fp32 (a sanity check; `draftwise quality` measures what it costs); the Q8_K prompt
path must give its own torch reference's bits (`prompt.reference_q8k`).

`DRAFTWISE_SMOKE_DIE` (a path's name, e.g. avx512): that path's child aborts before computing — how the tests show
a dying path falling to the next rung on a machine where every path runs.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from . import kernels, ladder, prompt, rates
from .int8 import Int8Weight, reference_linear
from .q4 import Q4Weight
from .q56 import Q5Weight, Q6Weight


def weights() -> list[Int8Weight]:
    """One small weight of each format the kernel reads: int8 (fp16 scales), q4 with fp16 and with fp32 scales, 5 bits,
    and Q6_K's 6 bits with signed byte scales per 16 (Q4_K's bytes are the tests', `test_q4.py`)."""
    gen = torch.Generator().manual_seed(0)
    n, k = 40, 256
    q = torch.randint(0, 64, (n, k), generator=gen, dtype=torch.uint8)
    s = torch.rand(n, k // 32, generator=gen) * 0.01
    return [
        Int8Weight(torch.randn(n, k, generator=gen)),
        Q4Weight(q & 15, s.half().float(), -8 * s.half().float()),
        Q4Weight(q & 15, s, -8 * s),
        Q5Weight(q & 31, s.half().float(), -16 * s.half().float()),
        Q6Weight(q, torch.randint(-128, 128, (n, k // 16), generator=gen, dtype=torch.int8), s[:, :1].half().float()),
    ]


def activations(m: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """m rows of k inputs, rows 1, 4, 7, ... with two outlier channels (as a model's activations have them): at abits 8
    their blocks are held at 16 bits in those rows only, so a pass mixes blocks at 8 bits, at 16, and at 8 in one row
    beside 16 in another (the first row of four among them)."""
    x = 3 * torch.randn(m, k, generator=gen)
    x[1::3, [1, k // 2 + 3]] *= 40
    return x


def passes(isa: int) -> bool:
    gen = torch.Generator().manual_seed(1)
    for w in weights():
        for abits in (16, 8):
            w.abits = abits
            for m in (1, 3, 9, 17):  # 17: a long pass, its 6-bit groups unpacked once
                x = activations(m, w.in_features, gen)
                if not torch.equal(kernels.int8_gemm(x, w, isa), reference_linear(x, w)):
                    return False
    return True


def bf16_runs() -> bool:
    """torch's bf16 product runs and lands near the fp32 one (bf16 keeps 8 bits of each value)."""
    gen = torch.Generator().manual_seed(2)
    w, x = torch.randn(64, 256, generator=gen), torch.randn(9, 256, generator=gen)
    got = torch.nn.functional.linear(x.bfloat16(), w.bfloat16()).float()
    return bool(torch.allclose(got, x @ w.T, rtol=0.05, atol=0.5))


def q8k_passes() -> bool:
    """The Q8_K prompt path gives its torch reference's bits (`prompt.reference_q8k`) on Q4_K and Q6_K weights."""
    gen = torch.Generator().manual_seed(3)
    held = rates.weights(64, 512, gen)
    for fmt in ("q4k", "q6k"):
        for m in (1, 5, 9):
            x = activations(m, 512, gen)
            if not torch.equal(prompt.q8k_gemm(x, held[fmt]), prompt.reference_q8k(x, held[fmt])):
                return False
    return True


def main(argv: list[str]) -> int:
    name = argv[0]
    if os.environ.get("DRAFTWISE_SMOKE_DIE") == name:
        os.abort()
    if name in ladder.LOSSY:
        if not (bf16_runs() if name == ladder.BF16 else q8k_passes()):
            return 1
        print(json.dumps(rates.bf16() if name == ladder.BF16 else rates.q8k()))
        return 0
    isa = ladder.CODES[name]
    if not passes(isa):
        return 1
    print(json.dumps(rates.exact(isa)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
