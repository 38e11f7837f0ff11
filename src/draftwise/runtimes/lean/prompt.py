"""Prompt passes at the matrix units' rate: rows whose logits nobody reads (a prefill, `LeanLM.forward` with n_logits
0) take torch's bf16 product where the ladder timed it faster than every exact path for that size of pass, weight
format and activation bits (`ladder.py`). torch's product is oneDNN's, which drives AMX-BF16 or AVX512-BF16 where the
CPU has them; the int8 kernel's own AMX tiles lost to AVX-512 on an Intel Xeon, and where oneDNN loses too (an AMD
EPYC whose int8 kernel outruns it) the ladder keeps the exact path.

Not the one-token step's bits: the prompt's keys and values differ from the exact path's by bf16's rounding (8 bits
of each activation and weight, the products summed in fp32). SD and AR prefill a prompt alike, so greedy SD still
reproduces greedy AR; verify passes and steps keep the exact path; `draftwise quality` measures what it costs (the
next tokens after a prefilled cache, agreement with fp32 >= 0.99 and ΔNLL <= +0.005).

Each matrix is dequantized to bf16 once, at the first prompt pass that takes it, and held beside its packed form: 2
bytes a weight (about 2.6 GB for a 1.5B model, said once). Where all of them would take more than half the memory
available, the model keeps the exact path (said once too); so does a GGUF file that `draftwise quality` measured to
miss the bar after such a prefill on this machine (`keep`: the verdict is kept per file, as activation bits are).
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
from . import kernels
from .activations import keeps_bar
from .int8 import LINEARS, Int8Weight

MEMORY_SHARE = 0.5  # the copies may take at most this share of the available memory


def _routed(w, rows: int) -> bool:
    return isinstance(w, Int8Weight) and (kernels.band(rows), w.abits, w.route_format) in kernels.route().bf16


def matrices(lm) -> list[Int8Weight]:
    """The integer matrices of `lm`'s layers (the head never serves a prompt pass: it has no logits)."""
    mats = [getattr(layer, name) for layer in lm.layers for name in LINEARS]
    return [w for w in mats if isinstance(w, Int8Weight)]


def takes_bf16(lm, rows: int) -> bool:
    """Whether a prompt pass of `rows` rows through `lm` takes the bf16 product for any of its matrices."""
    if not kernels.route().bf16 or not getattr(lm, "prompt_bf16", True) or not kernels.fast_path(lm.embed):
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
    this many rows, else `kernels.linear`."""
    rows = x.numel() // x.shape[-1]
    if not _routed(w, rows):
        return kernels.linear(x, w, b)
    copy = w.__dict__.get("_bf16")
    if copy is None:  # not a buffer: it is not the weight, and `weight_bytes` must not count it
        copy = w.__dict__["_bf16"] = w.dequantize().to(torch.bfloat16).contiguous()
    y = F.linear(x.to(torch.bfloat16), copy).float()
    return y if b is None else y + b


def keep(gguf: Path, agreement: float, nll_delta: float) -> bool:
    """Keep this machine's measurement of the next tokens after a bf16 prefill on `gguf` (`draftwise quality`):
    whether it kept the bar; where it did not, prompt passes on that file keep the exact path from its next load
    (`allowed`). Keyed by the file's path, size and modification time, as `activations.keep` is."""
    ok = keeps_bar(agreement, nll_delta)
    write_atomic(
        _record(gguf), json.dumps({"file": str(gguf), "bf16": ok, "agreement": agreement, "nll_delta": nll_delta})
    )
    return ok


def allowed(gguf: Path) -> bool:
    """Whether prompt passes on `gguf` may take the bf16 product: unless this machine measured it to miss the bar."""
    try:
        return bool(json.loads(_record(gguf).read_text())["bf16"])
    except (OSError, ValueError, KeyError):
        return True


def _record(gguf: Path) -> Path:
    return cache_dir("prompt-path") / f"{key_of(stamp_of(Path(gguf).resolve()))}.json"
