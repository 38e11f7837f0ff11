"""The lean engine's q4 precision: a GGUF file's own 4-bit blocks (Q4_0, Q4_1, Q4_K), run as the file defines them.

Each of these types is, per block of 32 inputs of a row, w = s·q + z with q in [0, 15]:
  Q4_0  s = d,     z = -8·d          (ggml: (q - 8)·d)
  Q4_1  s = d,     z = m             (ggml: q·d + m)
  Q4_K  s = d·sc,  z = -(dmin·mn)    (ggml: (d·sc)·q - dmin·mn; sc, mn a sub-block's 6-bit scale and min)
with d, m, dmin the file's fp16 values. s and z are computed in fp32, so every product above is exact and each formula
rounds once, where ggml's does: `Q4Weight.dequantize` is the file's weights bit for bit (tests compare it with
gguf-py's `dequantize` on every type). The user's own weights, not a requantization of them.

The matrix product is the int8 precision's (`cpu_int8.c`: int16 activations per token, exact integer sums per block,
the same floating-point operations in the same order), reading q as nibbles: 20 bytes a block of 32 (16 of nibbles,
4 of fp16 s and z: a Q4_0 or Q4_1 file's own size; Q4_K as the file holds its scales, a byte each for sc and mn and
fp32 d and m per 8 blocks: 19 bytes, the file's 18) against int8's 38, and a verify pass's rows bit-for-bit its
one-token step's. Why through that kernel rather than llama.cpp's: llama.cpp's
verify pass costs about a step per token on a CPU; the int8 kernel's stays close to one step (`cpu_int8.c`), which is
what SD needs.

Which weights: a matrix whose rows all come from 4-bit tensors of the file runs at 4 bits (the head too, where the
file holds it, or the embedding it is tied to, at 4 bits); one whose rows all come from Q8_0, Q5_0 or Q5_1 tensors
runs at int8 as the file holds them (`blocks8`: q a byte, the file's fp16 d and m; bit for bit gguf-py's values);
the rest (a Q6_K head or ffn_down of a Q4_K_M file: a scale per 16 weights, which blocks of 32 cannot hold) runs at
int8 requantized from the file's dequantized values, as lean-int8 runs them. The lean engine fuses and
reorders rows (q/k/v, gate/up, RoPE's pairing), so its rows are matched to the file's by their dequantized values: no
table of names and permutations to keep in step with it.
"""

from __future__ import annotations

import hashlib
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ...errors import DraftwiseError
from ...targets.family import FAMILIES, Shape, layer_tensors, rope_keys, windows
from .int8 import BLOCK, GROUP, Int8Weight, _up, padded

NAME = "q4"
TYPES = ("Q4_0", "Q4_1", "Q4_K")
TYPES8 = ("Q8_0", "Q5_0", "Q5_1")  # blocks held at int8 as the file holds them: w = d·q (+ m), q a byte


def _fp16(b: np.ndarray) -> np.ndarray:
    """Two bytes per block [..., 2] -> fp32 [...]."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def blocks(data: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tensor's raw rows [N, bytes] of GGUF type `qtype` -> (q [N, K] uint8 in 0..15, s [N, K/32], z [N, K/32])."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if qtype not in TYPES:
        raise DraftwiseError(f"q4 runs {', '.join(TYPES)} blocks, not {qtype}")
    n = data.shape[0]
    b = data.reshape(n, -1, GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][1])  # [N, blocks, bytes of a block]
    d = _fp16(b[..., 0:2])
    if qtype == "Q4_K":  # 144 bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 of nibbles
        nb = b.shape[1]
        sc, mn, _, _ = k_factors(data)
        s, z = d[..., None] * sc.reshape(n, nb, 8), -(_fp16(b[..., 2:4])[..., None] * mn.reshape(n, nb, 8))
        qs = b[..., 16:].reshape(n, nb, 4, 1, 32)  # 32 bytes: sub-block 2j in the low nibbles, 2j + 1 in the high
    else:  # Q4_0: d, 16 bytes of nibbles; Q4_1: d, m, 16 bytes (elements 0..15 low nibbles, 16..31 high)
        s = d
        z = d * np.float32(-8) if qtype == "Q4_0" else _fp16(b[..., 2:4])
        qs = b[..., 2 if qtype == "Q4_0" else 4 :].reshape(n, -1, 1, 16)
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-2)
    return q.reshape(n, -1), s.reshape(n, -1).astype(np.float32), z.reshape(n, -1).astype(np.float32)


def blocks8(data: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tensor's raw rows [N, bytes] of GGUF type `qtype` (TYPES8) -> (q [N, K] int8, s [N, K/32], z [N, K/32]):
    Q8_0 q = the file's bytes, s = d, z = 0; Q5_0 q = its 5-bit value - 16, s = d, z = 0; Q5_1 q = its 5-bit value,
    s = d, z = m. Each is exact at int8 with fp16 s and z, so the int8 kernel runs the file's weights bit for bit."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if qtype not in TYPES8:
        raise DraftwiseError(f"int8 holds {', '.join(TYPES8)} blocks as they are, not {qtype}")
    n = data.shape[0]
    b = data.reshape(n, -1, GGML_QUANT_SIZES[GGMLQuantizationType[qtype]][1])
    d, z = _fp16(b[..., 0:2]), np.zeros(b.shape[:2], dtype=np.float32)
    if qtype == "Q8_0":  # 34 bytes: d, 32 signed bytes
        q = np.ascontiguousarray(b[..., 2:]).view(np.int8)
    else:  # Q5_0 (22 bytes): d, 4 bytes of fifth bits, 16 of nibbles (elements 0..15 low, 16..31 high); Q5_1: d, m, ...
        at = 2 if qtype == "Q5_0" else 4
        high = np.ascontiguousarray(b[..., at : at + 4]).view("<u4") >> np.arange(32, dtype=np.uint32) & 1
        qs = b[..., at + 4 :]
        q5 = np.concatenate([qs & 0x0F, qs >> 4], axis=-1) | (high.astype(np.uint8) << 4)
        q = (q5.astype(np.int16) - (16 if qtype == "Q5_0" else 0)).astype(np.int8)
        z = z if qtype == "Q5_0" else _fp16(b[..., 2:4])
    return q.reshape(n, -1), d.reshape(n, -1), z.reshape(n, -1)


def k_factors(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_K tensor's raw rows [N, bytes] -> its blocks' 6-bit scales and mins (sc, mn [N, K/32] as fp32 in 0..63)
    and its super-blocks' d and m = -dmin (fp32 [N, K/256]): s = sc·d and z = mn·m, each product exact in fp32."""
    from gguf.quants import Q4_K

    n = data.shape[0]
    b = data.reshape(n, -1, 144)
    sc, mn = (t.reshape(n, -1).astype(np.float32) for t in Q4_K.get_scale_min(b[..., 4:16].reshape(-1, 12)))
    return sc, mn, _fp16(b[..., 0:2]), -_fp16(b[..., 2:4])


def dequantize(q: np.ndarray, s: np.ndarray, z: np.ndarray) -> np.ndarray:
    """w = s·q + z per block of 32, in fp32: [N, K]."""
    n = q.shape[0]
    w = q.reshape(n, -1, BLOCK).astype(np.float32) * s[..., None] + z[..., None]
    return w.reshape(n, -1)


class Q4Weight(Int8Weight):
    """A weight [N, K] as a GGUF file's 4-bit blocks: q in [0, 15] two to a byte; s and z in fp16 where every value
    is one (Q4_0, Q4_1: the file's own), as Q4_K holds them where `factors` (sc, mn, d, m: `k_factors`) are given,
    else fp32 (see module docstring). Everything but how q, s and z are stored is `Int8Weight`'s (the kernel takes
    `BITS` and the scales' format)."""

    BITS = 4
    SCALES = torch.float32

    def __init__(self, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, factors: tuple | None = None):
        torch.nn.Module.__init__(self)
        n, k = q.shape
        if k % BLOCK:
            raise DraftwiseError(f"q4: a row of {k} inputs is not whole blocks of {BLOCK}")
        pad = lambda t, cols: padded(t, _up(n), cols)  # noqa: E731
        q = pad(q.to(torch.int8), _up(k))
        if factors is not None and k % (8 * BLOCK) == 0:  # 19 bytes a block of 32 against fp32's 24
            sc, mn, d, m = (pad(t, t.shape[1]) for t in factors)
            self._pack(q, sc, mn, n, k, per8=(d, m))
            return
        if all(torch.equal(t.half().float(), t) for t in (s, z)):
            self.SCALES = torch.float16  # half the scales' bytes, the same values
        self._pack(q, pad(s, _up(k) // BLOCK), pad(z, _up(k) // BLOCK), n, k)

    @staticmethod
    def _packed(q: torch.Tensor) -> torch.Tensor:
        """q [G, 16, Kp] in 0..15 -> [G, Kp*8]: 64 bytes hold 8 consecutive k of 16 rows, k..k+3 in the low nibbles
        (the int8 layout), k+4..k+7 in the high ones."""
        groups, _, cols = q.shape
        t = q.to(torch.uint8).view(groups, GROUP, cols // 8, 2, 4).permute(0, 2, 1, 3, 4)  # [G, Kp/8, 16, 2, 4]
        return (t[..., 0, :] | (t[..., 1, :] << 4)).reshape(groups, -1).contiguous()

    @staticmethod
    def _unpacked(q: torch.Tensor, cols: int) -> torch.Tensor:
        groups = q.shape[0]
        t = q.view(torch.uint8).view(groups, cols // 8, GROUP, 1, 4)
        t = torch.cat([t & 0x0F, t >> 4], dim=3)  # [G, Kp/8, 16, 2, 4]
        return t.permute(0, 2, 1, 3, 4).reshape(groups * GROUP, cols).to(torch.int8)

    @property
    def dtype(self) -> torch.dtype:
        return torch.uint8

    def extra_repr(self) -> str:
        return f"{self.out_features}x{self.in_features}, a GGUF file's 4-bit blocks of {BLOCK}"


def _digest(row: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(row, dtype=np.float32).tobytes(), digest_size=16).digest()


def has_blocks(path: Path) -> bool:
    """Whether the GGUF file `path` holds a tensor of a type q4 runs."""
    return path.is_file() and _has_blocks(str(path.resolve()), path.stat().st_mtime_ns)


@lru_cache(maxsize=64)
def _has_blocks(path: str, stamp: int) -> bool:
    """`has_blocks`, once per version (`stamp`) of a file: the design asks for each row plan."""
    import gguf

    return any(t.tensor_type.name in TYPES for t in gguf.GGUFReader(path).tensors)


class Bank:
    """The rows of a GGUF file's 4-bit tensors and of those int8 holds exactly (TYPES8), found by their dequantized
    values (`weight`)."""

    def __init__(self, path: Path):
        import gguf

        kept = TYPES + TYPES8
        self._tensors = [t for t in gguf.GGUFReader(str(path)).tensors if t.tensor_type.name in kept]
        self._where: dict[bytes, tuple[int, int]] = {}  # a row's digest -> (tensor, row)
        for i in range(len(self._tensors)):
            for r, row in enumerate(dequantize(*self._blocks(i)[:3])):
                self._where.setdefault(_digest(row), (i, r))
        self._blocks.cache_clear()

    @lru_cache(maxsize=4)  # noqa: B019 (a bank lives as long as one load)
    def _blocks(self, i: int) -> tuple[np.ndarray, ...]:
        """Tensor i's (q, s, z), and Q4_K's factors after them (`k_factors`)."""
        t = self._tensors[i]
        data, qtype = np.asarray(t.data), t.tensor_type.name
        if qtype in TYPES8:
            return blocks8(data, qtype)
        return blocks(data, qtype) + (k_factors(data) if qtype == "Q4_K" else ())

    def __len__(self) -> int:
        return sum(t.tensor_type.name in TYPES for t in self._tensors)  # the 4-bit tensors: what q4 is for

    def weight(self, w: torch.Tensor) -> Int8Weight | None:
        """`w` [N, K] (fp32) as the file's blocks — 4-bit where every row is in a 4-bit tensor, int8 where every row
        is in a tensor int8 holds exactly — or None (rows of neither, or of both kinds)."""
        found = [self._where.get(_digest(row)) for row in w.detach().float().numpy()]
        if not found or None in found:
            return None
        eight = {self._tensors[i].tensor_type.name in TYPES8 for i, _ in found}
        if len(eight) > 1:
            return None
        parts = [[t[r] for t in self._blocks(i)] for i, r in found]
        q, s, z, *factors = (torch.from_numpy(np.stack(col)) for col in zip(*parts))  # zip: factors where all have them
        if eight.pop():
            return Int8Weight.of_blocks(q, s, z)
        return Q4Weight(q, s, z, tuple(factors) if factors else None)


def build(config, state: dict[str, torch.Tensor], path: Path, compile: bool = False):
    """The lean model of `config` on the GGUF file `path`'s 4-bit blocks, from `state` (its fp32 weights, read from
    that file): each matrix all of whose rows are in 4-bit tensors of the file at 4 bits, int8 for the rest. Built a
    layer at a time, each layer's fp32 weights taken out of `state` once it holds them: never a full fp32 copy of the
    model beside the one read (1.7B: 6.8 GB)."""
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
        raise DraftwiseError(f"--dtype q4: no layer matrix of the model matches {path}'s 4-bit blocks")
    lm = LeanLM(config, state, layers=layers, compile=compile, precision=NAME)
    lm.head = bank.weight(lm.head) or Int8Weight(lm.head)
    return with_activations(lm)


# Bits of the activations each matrix is multiplied with (`cpu_int8.c`): 16 (a scale per row, two vpdpbusd per 4
# products) or 8 (a scale per block of 32, one). 8 bits everywhere missed the quality bar (teacher-forced agreement
# with fp32 >= 0.99, ΔNLL <= +0.005; docs/results.md, int8 activations): 0.979 / -0.006 on the default target (16:
# 1.000), 0.987 / +0.014 on Qwen2.5-Coder-1.5B (16: 0.997); no single matrix at 8 bits kept 0.99 on the default
# target. So 16 bits for every matrix; DRAFTWISE_ACTIVATION_BITS=8 runs 8 everywhere, an experiment labelled in the
# engine's name (`runtime.py`), its quality measured by `draftwise quality` like any precision's.
ACTIVATION_BITS = 16


def activation_bits() -> int:
    return 8 if os.environ.get("DRAFTWISE_ACTIVATION_BITS") == "8" else ACTIVATION_BITS


def with_activations(lm):
    """`lm` (a q4 model, built here or read from its pack) with each matrix's activation bits set."""
    from .forward import LINEARS

    for w in [getattr(layer, name) for layer in lm.layers for name in LINEARS] + [lm.head]:
        if isinstance(w, Int8Weight):
            w.abits = activation_bits()
    return lm
