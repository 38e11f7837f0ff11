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

Which weights: `bank.py` finds each matrix's rows among the file's blocks (4-bit, and the 5-, 6- and 8-bit blocks of
a K-quant mix beside them: `q56.py`, `blocks8`) and holds it as the narrowest of them that holds every row exactly.
"""

from __future__ import annotations

import numpy as np
import torch

from ...errors import DraftwiseError
from .int8 import BLOCK, GROUP, Int8Weight, _up, fp16_exact, padded

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


def blocks5(data: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q5_0 or Q5_1 tensor's raw rows [N, bytes] -> (q [N, K] uint8 in 0..31, s [N, K/32], z [N, K/32]): Q5_0
    s = d, z = -16·d; Q5_1 s = d, z = m (`q56.Q5Weight` holds them)."""
    n = data.shape[0]
    at = 2 if qtype == "Q5_0" else 4  # Q5_0 (22 bytes): d, 4 bytes of fifth bits, 16 of nibbles; Q5_1: d, m, ...
    b = data.reshape(n, -1, at + 20)
    high = np.ascontiguousarray(b[..., at : at + 4]).view("<u4") >> np.arange(32, dtype=np.uint32) & 1
    qs = b[..., at + 4 :]  # elements 0..15 in the low nibbles, 16..31 in the high
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1) | (high.astype(np.uint8) << 4)
    d = _fp16(b[..., 0:2])
    z = d * np.float32(-16) if qtype == "Q5_0" else _fp16(b[..., 2:4])
    return q.reshape(n, -1), d.reshape(n, -1), z.reshape(n, -1)


def blocks8(data: np.ndarray, qtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tensor's raw rows [N, bytes] of GGUF type `qtype` (TYPES8) -> (q [N, K] int8, s [N, K/32], z [N, K/32]):
    Q8_0 q = the file's bytes, s = d, z = 0; Q5_0 q = its 5-bit value - 16, s = d, z = 0; Q5_1 q = its 5-bit value,
    s = d, z = m. Each is exact at int8 with fp16 s and z, so the int8 kernel runs the file's weights bit for bit."""
    if qtype not in TYPES8:
        raise DraftwiseError(f"int8 holds {', '.join(TYPES8)} blocks as they are, not {qtype}")
    n = data.shape[0]
    if qtype == "Q8_0":  # 34 bytes: d, 32 signed bytes
        b = data.reshape(n, -1, 34)
        q, d = np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(n, -1), _fp16(b[..., 0:2])
        return q, d, np.zeros_like(d)
    q5, d, z = blocks5(data, qtype)
    q = (q5.astype(np.int16) - (16 if qtype == "Q5_0" else 0)).astype(np.int8)
    return q, d, np.zeros_like(d) if qtype == "Q5_0" else z


def k_factors(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A Q4_K tensor's raw rows [N, bytes] -> its blocks' 6-bit scales and mins (sc, mn [N, K/32] as fp32 in 0..63)
    and its super-blocks' d and m = -dmin (fp32 [N, K/256]): s = sc·d and z = mn·m, each product exact in fp32."""
    from gguf.quants import Q4_K

    n = data.shape[0]
    b = data.reshape(n, -1, 144)
    sc, mn = (t.reshape(n, -1).astype(np.float32) for t in Q4_K.get_scale_min(b[..., 4:16].reshape(-1, 12)))
    return sc, mn, _fp16(b[..., 0:2]), -_fp16(b[..., 2:4])


def dequantize(q: np.ndarray, s: np.ndarray, z: np.ndarray) -> np.ndarray:
    """w = s·q + z per block (of 32, or of 16 where s has a column per 16 inputs), in fp32: [N, K]."""
    n = q.shape[0]
    w = q.reshape(n, s.shape[1], -1).astype(np.float32) * s[..., None] + z[..., None]
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
            self._pack(q, sc.to(torch.uint8), mn.to(torch.uint8), n, k, per8=(d, m))  # 6-bit values, a byte each
            return
        if fp16_exact(s, z):
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
