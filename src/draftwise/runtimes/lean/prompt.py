"""Prompt passes at the matrix units' rate: rows whose logits nobody reads (a prefill, `LeanLM.forward` with n_logits
0) may take a lossy path where the ladder timed it at least 15 % faster than every exact path for that size of pass,
weight format and activation bits (`ladder.py`):
  q8k   llama.cpp's numerics on K-quant weights (Q4_K, Q6_K): 8-bit activations per 256 inputs, so a super-block's
        integer block scales fold in integers and the floating-point work is once a super-block (`cpu_int8_q8k.c`,
        inside the one C call of the stack: `reference_q8k` is its torch twin);
  bf16  torch's bf16 product (oneDNN: AMX-BF16 or AVX512-BF16 where the CPU has them), on each matrix dequantized to
        bf16 once, at the first prompt pass that takes it, and held beside its packed form: 2 bytes a weight (about
        2.6 GB for a 1.5B model, said once); where all of them would take more than half the memory available, the
        model keeps the exact path (said once too). The int8 kernel's own AMX tiles lost to AVX-512 on an Intel Xeon;
        where oneDNN loses too (an AMD EPYC whose int8 kernel outruns it) the ladder does not take it.

Not the one-token step's bits: the prompt's keys and values round as the path does. SD and AR prefill a prompt alike,
so greedy SD still reproduces greedy AR; verify passes and steps keep the exact path; each row's result is its own,
so a prompt's cache is the same whole or in chunks on q8k. `draftwise quality` measures what it costs (the next
tokens after a prefilled cache, agreement with fp32 >= 0.99 and ΔNLL <= +0.005); a GGUF file measured to miss the
bar keeps the exact path for its prompts on this machine (`keep`: the verdict is kept per file, as activation bits
are).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from ... import machine
from ...paths import cache_dir
from ...rundir import write_atomic
from ...targets.source import key_of, stamp_of
from . import kernels, ladder
from .activations import keeps_bar
from .int8 import LINEARS, Int8Weight

MEMORY_SHARE = 0.5  # the copies may take at most this share of the available memory
Q8K_E = 3  # cpu_int8_q8k.c's E: a block's activation scale at most 2^E times finer than its super-block's


def _routed(w, rows: int) -> bool:
    return isinstance(w, Int8Weight) and (kernels.band(rows), w.abits, w.route_format) in kernels.route().bf16


def lossy(lm, rows: int) -> list[str]:
    """The lossy paths a prompt pass of `rows` rows through `lm` takes (`ladder.LOSSY`, empty: the exact ones)."""
    if not getattr(lm, "prompt_lossy", True) or not kernels.fast_path(lm.embed):
        return []
    route, band = kernels.route(), kernels.band(rows)
    taken = {route.lossy(band, w.abits, w.route_format) for w in matrices(lm)} - {None}
    if ladder.BF16 in taken and not takes_bf16(lm, rows):
        taken.remove(ladder.BF16)
    return [p for p in ladder.LOSSY if p in taken]


def matrices(lm) -> list[Int8Weight]:
    """The integer matrices of `lm`'s layers (the head never serves a prompt pass: it has no logits)."""
    mats = [getattr(layer, name) for layer in lm.layers for name in LINEARS]
    return [w for w in mats if isinstance(w, Int8Weight)]


def takes_bf16(lm, rows: int) -> bool:
    """Whether a prompt pass of `rows` rows through `lm` takes the bf16 product for any of its matrices."""
    if not kernels.route().bf16 or not getattr(lm, "prompt_lossy", True) or not kernels.fast_path(lm.embed):
        return False
    mats = matrices(lm)
    return any(_routed(w, rows) for w in mats) and _copies_fit(lm, mats)


def _copies_fit(lm, mats: list[Int8Weight]) -> bool:
    """Whether every matrix's bf16 copy fits in memory (decided once a model)."""
    fits = lm.__dict__.get("_bf16_fits")
    if fits is None:
        need = sum(2 * w.out_features * w.in_features for w in mats)
        free = machine.memory().get("available_gib")
        fits = free is None or need <= MEMORY_SHARE * free * 2**30
        print(
            f"draftwise: prompt passes take torch's bf16 product where the ladder timed it faster here: "
            f"{need / 1e9:.1f} GB of bf16 weight copies"
            if fits
            else f"draftwise: prompt passes keep the exact path: bf16 weight copies would take {need / 1e9:.1f} GB, "
            f"more than {MEMORY_SHARE:.0%} of the {free:.1f} GiB available",
            file=sys.stderr,
            flush=True,
        )
        lm.__dict__["_bf16_fits"] = fits
    return fits


def copies_bytes(lm) -> int:
    """Bytes of the bf16 copies `lm` holds now."""
    return sum(w.__dict__["_bf16"].numel() * 2 for w in matrices(lm) if "_bf16" in w.__dict__)


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """A prompt pass's x [..., K] @ w^T (+ b) -> [..., N] fp32: torch's bf16 product where the route takes it for
    this many rows, else `kernels.linear` (on the prompt passes' table)."""
    rows = x.numel() // x.shape[-1]
    if not _routed(w, rows):
        return kernels.linear(x, w, b, prompt=True)
    copy = w.__dict__.get("_bf16")
    if copy is None:  # not a buffer: it is not the weight, and `weight_bytes` must not count it
        copy = w.__dict__["_bf16"] = w.dequantize().to(torch.bfloat16).contiguous()
    y = F.linear(x.to(torch.bfloat16), copy).float()
    return y if b is None else y + b


def keep(gguf: Path, agreement: float, nll_delta: float) -> bool:
    """Keep this machine's measurement of the next tokens after a prefill on `gguf`'s lossy prompt paths (q8k, bf16;
    `draftwise quality`): whether it kept the bar; where it did not, prompt passes on that file keep the exact path
    from its next load (`allowed`). Keyed by the file's path, size and modification time, as `activations.keep` is."""
    ok = keeps_bar(agreement, nll_delta)
    write_atomic(
        _record(gguf), json.dumps({"file": str(gguf), "lossy": ok, "agreement": agreement, "nll_delta": nll_delta})
    )
    return ok


def allowed(gguf: Path) -> bool:
    """Whether prompt passes on `gguf` may take a lossy path: unless this machine measured it to miss the bar (a
    record from before the key was named for every lossy path reads as it was written, under "bf16")."""
    try:
        record = json.loads(_record(gguf).read_text())
        return bool(record["lossy"] if "lossy" in record else record["bf16"])
    except (OSError, ValueError, KeyError):
        return True


def _record(gguf: Path) -> Path:
    return cache_dir("prompt-path") / f"{key_of(stamp_of(Path(gguf).resolve()))}.json"


def q8k_gemm(x: torch.Tensor, w, lib=None) -> torch.Tensor:
    """x [M, K] fp32 contiguous times a Q4_K or Q6_K weight at Q8_K activations (`cpu_int8_q8k.c`: the lossy prompt
    path, `prompt.py`) -> [M, N] fp32 (`lib`: another build of the kernel, `kernels.int8_gemm`'s)."""
    y = torch.empty(x.shape[0], w.out_features, dtype=torch.float32)
    (lib or kernels._kernel()).draftwise_q8k_gemm(
        x.data_ptr(), *kernels.blocks(w), y.data_ptr(), *kernels.sizes(x, w), w.BITS
    )
    return y


def reference_q8k(x2: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """`cpu_int8_q8k.c` in torch, the same bits: x2 [M, K] fp32 quantized to 8 bits per super-block of 256 (sA =
    amax / 127), each block of 32 2^e finer where its values allow (e <= E), integer sums per block folded with the
    block's integer scale, shifted by E - e, over the super-block, then acc = acc + ((I1·d + I2·m)·sA/2^E) in fp32,
    super-block after super-block (Q6_K: I1·d alone, its offsets folded)."""
    m, k, cols, sub, top_e = x2.shape[0], w.in_features, w.padded_in, w.SUB, Q8K_E
    xb = torch.nn.functional.pad(x2.float(), (0, cols - k)).view(m, -1, 8, 32)  # [M, NS, 8 blocks, 32]
    amax = xb.abs().amax((-1, -2))  # [M, NS]
    top = xb.abs().amax(-1)  # [M, NS, 8]
    e = sum((top * 2.0**j <= amax[..., None]).int() for j in range(1, top_e + 1))  # the most that keeps |v| <= 127
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    v = torch.round(xb * (inv[..., None] * 2.0 ** e.float())[..., None]).view(m, -1, sub).double()  # [M, NB, sub]
    shift = (2.0 ** (top_e - e)).double().view(m, -1).repeat_interleave(32 // sub, dim=1)  # [M, NB]
    t = v.sum(-1)  # [M, NB]
    q, _, _ = w.unpacked()
    sc, mn, d, dm = w.raw_rows()  # the blocks' integer scales (and mins) as held, the super-blocks' d and m
    ds = torch.einsum("mbk,nbk->mnb", v, q.double().view(q.shape[0], -1, sub))  # [M, Np, NB], exact
    per, ns = 256 // sub, cols // 256
    if w.scale_format == 3:  # Q6_K: z = -32 s
        i1 = ((ds - 32 * t[:, None, :]) * sc.double() * shift[:, None, :]).view(m, -1, ns, per).sum(-1)
        i2 = None
    else:
        i1 = (ds * sc.double() * shift[:, None, :]).view(m, -1, ns, per).sum(-1)
        i2 = ((t * shift)[:, None, :] * mn.double()).view(m, -1, ns, per).sum(-1)
    acc = torch.zeros(m, q.shape[0])
    sa = amax / 127.0 * (1.0 / 2**top_e)
    for s in range(ns):
        term = i1[:, :, s].float() * d[:, s]
        if i2 is not None:
            term = term + i2[:, :, s].float() * dm[:, s]
        acc = acc + term * sa[:, s, None]
    return acc[:, : w.out_features]
