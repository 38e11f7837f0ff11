"""Which rows of its own the lean engine gets in a design: one per precision beside the design's (float) one.

  lean-int8   int8 weights, activations quantized per token: a lossy choice, on the CPU, for any target
  lean-q4     the target file's own 4-bit blocks (Q4_0, Q4_1, Q4_K), activations as at int8: only where the target
              is a GGUF file that has them (`runtimes.lean.q4`)

Both the plan (`costs`, which prices rows before any exists) and the rows themselves (`rows.LeanRow`) ask here, so
they never disagree on which lean rows a design has.
"""

from __future__ import annotations

from ..runtimes.lean import q4
from ..runtimes.lean.int8 import NAME as INT8
from .target import has_q4_blocks

LEAN_INT8 = "lean-int8"
LEAN_Q4 = "lean-q4"
PRECISIONS = {LEAN_INT8: INT8, LEAN_Q4: q4.NAME}  # the lean rows by name, in planning order: their precisions


def planned(config) -> dict[str, str]:
    """The lean rows a design config asks for that its target can have, by name: their precisions (the study's own
    precision is no row of its own: the study is that row)."""
    if config.device != "cpu":  # int8 and q4 are CPU precisions
        return {}
    return {
        name: dtype
        for name, dtype in PRECISIONS.items()
        if name in config.rows and dtype != config.dtype and (dtype != q4.NAME or has_q4_blocks(config))
    }
