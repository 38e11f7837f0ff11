"""A GGUF file's blocks found for the lean model's matrices, so that the q4 precision runs the file's own weights:
each matrix as the narrowest blocks that hold all its rows exactly.

  rows all from 4-bit tensors (Q4_0, Q4_1, Q4_K)   `q4.Q4Weight`
  rows all from 5-bit tensors (Q5_0, Q5_1)         `q56.Q5Weight`
  rows all from Q6_K tensors                        `q56.Q6Weight`
  rows from Q8_0 (and 5-bit) tensors                int8 as the file holds them (`q4.blocks8`, `Int8Weight.of_blocks`)
  any other mix (Q4_K and Q6_K rows fused in one    int8 requantized from the file's values, as lean-int8 runs it
  q/k/v matrix), or rows of no such tensor

The lean engine fuses and reorders rows (q/k/v, gate/up, RoPE's pairing), so its rows are matched to the file's by
their dequantized values (each type's `dequantize` is gguf-py's, bit for bit): no table of names and permutations to
keep in step with it.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ...errors import DraftwiseError
from ...targets.family import FAMILIES, Shape, layer_tensors, rope_keys, windows
from .int8 import Int8Weight, fp16_exact
from .q4 import NAME, TYPES, Q4Weight, blocks, blocks5, blocks8, dequantize, k_factors
from .q56 import Q5Weight, Q6Weight, blocks6

KINDS = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q6_K": 6, "Q8_0": 8}  # the bits q is held at


def _digest(row: np.ndarray) -> bytes:
    """A row's values as a key; + 0 makes -0 +0 (gguf-py's (q - 32)·s is -0 where s < 0, s·q + z here +0)."""
    return hashlib.blake2b((np.asarray(row, dtype=np.float32) + np.float32(0)).tobytes(), digest_size=16).digest()


def has_blocks(path: Path) -> bool:
    """Whether the GGUF file `path` holds a tensor of a type q4 runs."""
    return path.is_file() and _has_blocks(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _has_blocks(path: str, stamp: int) -> bool:
    """`has_blocks`, once per version (`stamp`) of a file: the design asks for each row plan."""
    import gguf

    return any(t.tensor_type.name in TYPES for t in gguf.GGUFReader(path).tensors)


class Bank:
    """The rows of a GGUF file's tensors of the types in `KINDS`, found by their dequantized values (`weight`)."""

    def __init__(self, path: Path):
        import gguf

        self._tensors = [t for t in gguf.GGUFReader(str(path)).tensors if t.tensor_type.name in KINDS]
        self._where: dict[bytes, tuple[int, int]] = {}  # a row's digest -> (tensor, row)
        for i in range(len(self._tensors)):
            for r, row in enumerate(self._values(i)):
                self._where.setdefault(_digest(row), (i, r))
        self._blocks.cache_clear()

    def _qtype(self, i: int) -> str:
        return self._tensors[i].tensor_type.name

    @lru_cache(maxsize=4)  # noqa: B019 (a bank lives as long as one load)
    def _blocks(self, i: int, eight: bool = False) -> tuple[np.ndarray, ...]:
        """Tensor i's blocks as its kind holds them (`eight`: at int8, `blocks8`): 4 bits (q, s, z) and Q4_K's
        factors after them (`k_factors`); 5 bits (q, s, z); Q6_K (q, sc, d); int8 (q, s, z)."""
        data, qtype = np.asarray(self._tensors[i].data), self._qtype(i)
        if eight or KINDS[qtype] == 8:
            return blocks8(data, qtype)
        if KINDS[qtype] == 5:
            return blocks5(data, qtype)
        if KINDS[qtype] == 6:
            return blocks6(data)
        return blocks(data, qtype) + (k_factors(data) if qtype == "Q4_K" else ())

    def _values(self, i: int) -> np.ndarray:
        """Tensor i's weights [N, K] in fp32, gguf-py's values."""
        if KINDS[self._qtype(i)] == 6:
            q, sc, d = self._blocks(i)
            s = sc.astype(np.float32) * np.repeat(d, 16, axis=1)
            return dequantize(q, s, -32 * s)
        return dequantize(*self._blocks(i)[:3])

    def __len__(self) -> int:
        return sum(self._qtype(i) in TYPES for i in range(len(self._tensors)))  # the 4-bit tensors: what q4 is for

    def weight(self, w: torch.Tensor) -> Int8Weight | None:
        """`w` [N, K] (fp32) as the file's blocks (the module docstring's table), or None."""
        found = [self._where.get(_digest(row)) for row in w.detach().float().numpy()]
        if not found or None in found:
            return None
        kinds = {KINDS[self._qtype(i)] for i, _ in found}
        if len(kinds) > 1 and not kinds <= {5, 8}:
            return None
        kind = kinds.pop() if len(kinds) == 1 else 8
        cols = self._rows(found, kind == 8)
        if kind == 5 and not fp16_exact(*cols[1:]):  # Q5_0's -16·d beyond fp16: at int8, exact
            kind, cols = 8, self._rows(found, True)
        if kind == 8:
            return Int8Weight.of_blocks(*cols)
        if kind == 6:
            return Q6Weight(*cols)
        if kind == 5:
            return Q5Weight(*cols)
        q, s, z, *factors = cols
        return Q4Weight(q, s, z, tuple(factors) if factors else None)

    def _rows(self, found: list[tuple[int, int]], eight: bool) -> list[torch.Tensor]:
        """The found rows' blocks, each part stacked (zip: Q4_K's factors where every row has them)."""
        parts = [[t[r] for t in self._blocks(i, eight)] for i, r in found]
        return [torch.from_numpy(np.stack(col)) for col in zip(*parts)]


def build(config, state: dict[str, torch.Tensor], path: Path, compile: bool = False):
    """The lean model of `config` on the GGUF file `path`'s blocks, from `state` (its fp32 weights, read from that
    file): each matrix as `Bank.weight` finds it, int8 requantized where it finds none. Built a layer at a time, each
    layer's fp32 weights taken out of `state` once it holds them: never a full fp32 copy of the model beside the one
    read (1.7B: 6.8 GB)."""
    from .forward import LINEARS, Layer, LeanLM

    bank = Bank(path)
    if not len(bank):
        raise DraftwiseError(f"--dtype q4 runs a GGUF file's 4-bit blocks ({', '.join(TYPES)}); {path} has none")
    shape, family = Shape.of(config), FAMILIES[config.model_type]
    layers, held = [], 0
    for i, (window, key) in enumerate(zip(windows(config), rope_keys(config))):
        prefix = f"model.layers.{i}."
        layer = Layer(layer_tensors(state, prefix, family, shape), shape, family, window, key)
        for k in [k for k in state if k.startswith(prefix)]:
            del state[k]  # the layer's fused copies hold them now, until its matrices are replaced below
        for name in LINEARS:
            setattr(layer, name, bank.weight(getattr(layer, name)) or Int8Weight(getattr(layer, name)))
            held += isinstance(getattr(layer, name), Q4Weight)
        layers.append(layer)
    if not held:
        raise DraftwiseError(f"--dtype q4: no layer matrix of the model matches {path}'s blocks")
    lm = LeanLM(config, state, layers=layers, compile=compile, precision=NAME)
    lm.head = bank.weight(lm.head) or Int8Weight(lm.head)
    return lm  # at 16-bit activations: the loader sets them (`activations.chosen`)
