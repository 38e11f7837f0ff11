"""How fast one matrix path runs here: the timing half of the ladder's child (`smoke.py`, `ladder.py`).

A path is timed on matrices of the shapes a 1.5B model runs (Qwen2.5-1.5B's: an FFN's down projection and the fused
q/k/v; its up projection, as many weights as the down one, only doubled the ladder's time), with random weights in
every format the kernel reads at both activation bits, at each pass size the ladder's bands hold (`ladder.ROWS`).
Each timed call finds its weights in memory, not in the caches, as a model's pass does (a model's layers are far
larger than the last-level cache; one matrix is not): a step's or a verify pass's runs over copies of the matrix one
after another, past twice that cache (`streamed`: memory streaming as a model's pass streams it), a longer pass's
after a buffer twice that cache's size is read, outside the timing (`seconds`: it is the products' time). The bf16
prompt path is timed as `prompt.py` runs it: the activations cast to bf16, torch's product against the weight
dequantized once to bf16, the result cast back.
"""

from __future__ import annotations

import copy
import os
import statistics
import time
from pathlib import Path

import torch

from . import kernels, ladder, prompt
from .int8 import Int8Weight
from .q4 import Q4Weight
from .q56 import Q5Weight, Q6Weight

SHAPES = {"ffn down": (1536, 8960), "qkv": (2048, 1536)}  # [N, K] of a 1.5B model
SMALL = {"ffn down": (192, 1280), "qkv": (256, 256)}  # the tests' (K whole super-blocks)
REPEATS = 3  # timed calls a pass size at least (after one to warm up): the median is kept
SHAPES_ENV = "DRAFTWISE_LADDER_SHAPES"  # "small": SMALL's matrices (tests of the child itself)


def shapes() -> list[tuple[int, int]]:
    return list((SMALL if os.environ.get(SHAPES_ENV) == "small" else SHAPES).values())


def last_level_cache() -> int:
    """Bytes of this CPU's largest cache (sysfs), 32 MiB where it does not say."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip()
        unit = {"K": 2**10, "M": 2**20}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KM")) * unit)
    return max(sizes, default=32 * 2**20)


_EVICT: list[torch.Tensor] = []


def evict() -> None:
    """Read a buffer twice the last-level cache's size: what the timed call reads next comes from memory."""
    if not _EVICT:
        _EVICT.append(torch.ones(min(2 * last_level_cache(), 512 * 2**20) // 4))
    _EVICT[0].sum()


def weights(n: int, k: int, gen: torch.Generator) -> dict[str, Int8Weight]:
    """One random weight [n, k] in each of the kernel's formats (`ladder.FORMATS`)."""
    q = torch.randint(0, 64, (n, k), generator=gen, dtype=torch.uint8)
    s = torch.rand(n, k // 32, generator=gen) * 0.01
    h = s.half().float()
    d = torch.rand(n, k // 256, generator=gen) * 1e-3
    factors = (q[:, : k // 32] & 63, q[:, k // 32 : k // 16] & 63, d, -d)  # Q4_K's sc, mn, d and m
    return {
        "q8": Int8Weight(torch.randn(n, k, generator=gen)),
        "q4": Q4Weight(q & 15, s, -8 * s),
        "q4h": Q4Weight(q & 15, h, -8 * h),
        "q4k": Q4Weight(q & 15, s, s, tuple(t.float() for t in factors)),
        "q5h": Q5Weight(q & 31, h, -16 * h),
        "q6k": Q6Weight(q, torch.randint(-128, 128, (n, k // 16), generator=gen, dtype=torch.int8), factors[2]),
    }


STREAMED_ROWS = 15  # passes up to this many rows read their weights as a model's pass does, one matrix after another


def streamed(call, w: Int8Weight, repeats: int = REPEATS) -> float:
    """Seconds of `call(w)` as a model's decoding step or verify pass runs it: over copies of `w` whose bytes pass
    twice the last-level cache, one after another (the memory streaming, its prefetchers warm), the median of
    `repeats` such rounds divided by the copies. One call after a cache eviction (`seconds`) started cold: on an AMD
    EPYC Zen 5 it ranked the one-row tilings the other way round from a 1.5B model's step (25.8 ms on the tiling it
    chose, 18.6 on the other)."""
    size = sum(t.numel() * t.element_size() for t in w.buffers())
    copies = [w] + [copy.deepcopy(w) for _ in range(max(1, -(-2 * last_level_cache() // size)) - 1)]
    for c in copies:
        call(c)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for c in copies:
            call(c)
        times.append((time.perf_counter() - start) / len(copies))
    return statistics.median(times)


def seconds(fn) -> float:
    """The median of timed calls of `fn`, each finding its weights in memory (`evict`): REPEATS, or more where a call
    is short (at least ~10 ms of calls, at most 25), so that a path's choice is not the noise's."""
    start = time.perf_counter()
    fn()
    repeats = min(25, max(REPEATS, int(0.01 / max(time.perf_counter() - start, 1e-6))))
    times = []
    for _ in range(repeats):
        evict()
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def products() -> dict[str, int]:
    """Products of one pass of each timed size, over every shape."""
    per_row = sum(n * k for n, k in shapes())
    return {str(r): r * per_row for rows in ladder.ROWS for r in rows}


def exact(isa: int) -> dict:
    """Path `isa`'s seconds for a pass of each size over every shape, by format and activation bits."""
    gen = torch.Generator().manual_seed(0)
    out: dict[str, dict[str, float]] = {}
    for n, k in shapes():
        xs = {r: torch.randn(r, k, generator=gen) for rows in ladder.ROWS for r in rows}
        for fmt, w in weights(n, k, gen).items():
            for abits in ladder.ABITS:
                w.abits = abits
                got = out.setdefault(ladder.key(fmt, abits), {})
                for r, x in xs.items():
                    t = (
                        streamed(lambda c, x=x: kernels.int8_gemm(x, c, isa), w)
                        if r <= STREAMED_ROWS
                        else seconds(lambda x=x: kernels.int8_gemm(x, w, isa))
                    )
                    got[str(r)] = got.get(str(r), 0.0) + t
    return {"seconds": out, "products": products()}


def bf16() -> dict:
    """torch's bf16 product's seconds for a pass of each prompt-band size over every shape (any format: the weight
    is held dequantized)."""
    gen = torch.Generator().manual_seed(0)
    sizes = [r for b in ladder.PROMPT_BANDS for r in ladder.ROWS[b]]
    got: dict[str, float] = {}
    for n, k in shapes():
        w = torch.randn(n, k, generator=gen).bfloat16()
        for r in sizes:
            x = torch.randn(r, k, generator=gen)
            got[str(r)] = got.get(str(r), 0.0) + seconds(lambda: torch.nn.functional.linear(x.bfloat16(), w).float())
    names = [ladder.key(f, a) for f in ladder.FORMATS for a in ladder.ABITS]
    return {"seconds": {name: dict(got) for name in names}, "products": products()}


def q8k() -> dict:
    """The Q8_K prompt path's seconds for a pass of each prompt-band size over every shape, on its formats (Q4_K and
    Q6_K: the same time at either activation bits, which it does not read)."""
    gen = torch.Generator().manual_seed(0)
    sizes = [r for b in ladder.PROMPT_BANDS for r in ladder.ROWS[b]]
    out: dict[str, dict[str, float]] = {}
    for n, k in shapes():
        held = weights(n, k, gen)
        for fmt in ("q4k", "q6k"):
            got = out.setdefault(fmt, {})
            for r in sizes:
                x = torch.randn(r, k, generator=gen)
                got[str(r)] = got.get(str(r), 0.0) + seconds(lambda: prompt.q8k_gemm(x, held[fmt]))
    named = {ladder.key(fmt, a): dict(got) for fmt, got in out.items() for a in ladder.ABITS}
    return {"seconds": named, "products": products()}
