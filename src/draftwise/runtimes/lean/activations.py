"""Which activation bits a q4 model multiplies its matrices with, on a given GGUF file.

`cpu_int8.c` takes activations at 16 bits (a scale per row, two vpdpbusd per 4 products) or at 8, per block of 32
with a scale each (one vpdpbusd), a block holding an outlier channel at 16 bits (`int8.WIDE_C2`). 8 is faster on passes
of several rows (verify, prefill) but rounds more, and whether it keeps the quality bar — teacher-forced agreement
with fp32 >= 0.99 and ΔNLL <= +0.005 (docs/results.md, "Activations per block") — depends on the model:
Qwen2.5-Coder-1.5B 0.997 / -0.001 (16: 0.999 / +0.000), its 0.5B sibling 0.993 / +0.002, the default target 0.977 /
-0.012 (16: 1.000). So, for a file, in this order:
  1. DRAFTWISE_ACTIVATION_BITS (8 or 16), for every file;
  2. this machine's own measurement of that file: `draftwise quality --runtimes lean:q4-a8` keeps its verdict here
     (`keep`), as the ladder keeps a kernel path's, so a user's own GGUF runs per block once measured to keep the bar;
  3. what a named model records (`targets.named`: measured by us);
  4. 16.
The engine's name says which ran (`-a8`, `runtime.py`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ...errors import DraftwiseError
from ...paths import cache_dir
from ...rundir import write_atomic
from ...targets import named
from ...targets.source import key_of, stamp_of
from .int8 import Int8Weight

ACTIVATION_BITS = 16
ACTIVATION_ENV = "DRAFTWISE_ACTIVATION_BITS"
AGREEMENT_MIN, NLL_DELTA_MAX = 0.99, 0.005  # the quality bar 8-bit activations must keep


def chosen(gguf: Path) -> int:
    """The activation bits of a q4 model on the GGUF file `gguf` (the module docstring's order)."""
    env = os.environ.get(ACTIVATION_ENV)
    if env:
        if env not in ("8", "16"):
            raise DraftwiseError(f"{ACTIVATION_ENV} must be 8 (per block) or 16 (per row), got {env!r}")
        return int(env)
    verdict = kept(gguf)
    if verdict is not None:
        return verdict
    model = named.of_file(gguf)
    return model.activations if model is not None else ACTIVATION_BITS


def keeps_bar(agreement: float, nll_delta: float) -> bool:
    return agreement >= AGREEMENT_MIN and nll_delta <= NLL_DELTA_MAX


def keep(gguf: Path, bits: int, agreement: float, nll_delta: float) -> bool:
    """Keep this machine's measurement of `gguf` at `bits`-bit activations; whether 8 bits kept the bar (a
    measurement at 16 says nothing about 8 and changes nothing). The record is keyed by the file's path, size and
    modification time (`stamp_of`): a changed file is measured again."""
    if bits != 8:
        return False
    ok = keeps_bar(agreement, nll_delta)
    record = {"file": str(gguf), "bits": 8 if ok else ACTIVATION_BITS, "agreement": agreement, "nll_delta": nll_delta}
    write_atomic(_record(gguf), json.dumps(record))  # a reader sees the old verdict or the new one
    return ok


def kept(gguf: Path) -> int | None:
    """The bits this machine measured `gguf` to keep the bar at (`keep`), or None where it has not measured it."""
    try:
        return int(json.loads(_record(gguf).read_text())["bits"])
    except (OSError, ValueError, KeyError):
        return None


def _record(gguf: Path) -> Path:
    path = Path(gguf).resolve()
    return cache_dir("activations") / f"{key_of(stamp_of(path))}.json"


def bits_of(lm) -> int:
    """The activation bits a q4 model's matrices run at (its head's: `with_activations` sets them all alike)."""
    return getattr(getattr(lm, "head", None), "abits", ACTIVATION_BITS)


def with_activations(lm, bits: int):
    """`lm` (a q4 model, built or read from its pack) with each matrix's activation bits set to `bits` (16 or 8)."""
    for layer in lm.layers:
        layer.with_activations(bits)
    if isinstance(lm.head, Int8Weight):
        lm.head.abits = bits
    return lm
