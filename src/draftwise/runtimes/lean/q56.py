"""A GGUF file's 5- and 6-bit blocks (Q5_0, Q5_1, Q6_K), run by the q4 precision as the file holds them.

  Q5_0  w = d·(q - 16)          per block of 32, q in [0, 31]:  s = d, z = -16·d (fp16)
  Q5_1  w = d·q + m             per block of 32:                s = d, z = m (fp16)
  Q6_K  w = (d·sc)·(q - 32)     per sub-block of 16, q in [0, 63], sc a signed byte, d an fp16 per 256:
                                s = sc·d, z = sc·(-32·d), held as the file holds them (sc, d)
Every product is exact in fp32 (at most 11 + 7 + 6 significant bits), so `dequantize` is gguf-py's values bit for
bit (tests compare them). The kernel (`cpu_int8.h`) reads q as the q4 precision's nibbles with q's bit 4 (and 5) in
masks of 64 bits per 4 inputs of 16 rows after each block's nibbles: 5.5 bits a weight for Q5 (the file's 5.5 plus
an fp16 offset, 6), 6.75 for Q6_K (the file's 6.5625). Before, these tensors ran at int8 (a byte a weight and fp16
scale and offset: 9 bits); a step of Qwen2.5-Coder-0.5B Q4_K_M (its layers mostly Q5_0) read 556 MB where the file
holds 392.
"""

from __future__ import annotations

import numpy as np
import torch

from ...errors import DraftwiseError
from .int8 import GROUP, _up, fp16_exact, padded
from .q4 import Q4Weight, _fp16

SUPER = 256  # Q6_K's super-block: one d per 256 inputs


def blocks6(data: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A Q6_K tensor's raw rows [N, bytes] -> (q [N, K] uint8 in 0..63, sc [N, K/16] int8, d [N, K/256] fp32), in
    gguf-py's element order (`gguf.quants.Q6_K`: 128 bytes of low nibbles, 64 of high pairs, 16 scales, d)."""
    n = data.shape[0]
    b = data.reshape(n, -1, 210)
    nb = b.shape[1]
    ql = b[..., :128].reshape(n, nb, 2, 1, 64) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 1, 2, 1)
    qh = b[..., 128:192].reshape(n, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 1, 4, 1)
    q = (ql & 0x0F).reshape(n, nb, 8, 32) | ((qh & 0x03).reshape(n, nb, 8, 32) << 4)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8)
    return q.reshape(n, -1), sc.reshape(n, -1), _fp16(b[..., 208:210]).reshape(n, -1)


class Q5Weight(Q4Weight):
    """A weight [N, K] as a file's 5-bit blocks: q in [0, 31] (nibbles and a mask of bit 4), s and z fp16 per block
    of 32."""

    BITS = 5
    SCALES = torch.float16

    def __init__(self, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor):
        torch.nn.Module.__init__(self)
        if not fp16_exact(s, z):
            raise DraftwiseError("q5: a file's block scales and offsets must be fp16 values")
        n, k = q.shape
        pad = lambda t, cols: padded(t, _up(n), cols)  # noqa: E731
        self._pack(pad(q.to(torch.int8), _up(k)), pad(s, _up(k) // 32), pad(z, _up(k) // 32), n, k)

    @classmethod
    def _packed(cls, q: torch.Tensor) -> torch.Tensor:
        """q [G, 16, Kp] -> [G, Kp·2·BITS]: per block of 32 inputs its 256 bytes of nibbles (`Q4Weight._packed`),
        then per 4 inputs a mask of bit 4 (and one of bit 5) of their 64 values, bit (n % 16)·4 + k % 4."""
        groups, _, cols = q.shape
        u = q.to(torch.uint8)
        nibbles = Q4Weight._packed(u & 0x0F).view(groups, cols // 32, 256)
        planes = [(u >> bit) & 1 for bit in range(4, cls.BITS)]  # [G, 16, Kp] each
        weights = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8)
        masks = [
            (p.view(groups, GROUP, cols // 4, 4).permute(0, 2, 1, 3).reshape(groups, cols // 4, 8, 8) * weights).sum(
                -1, dtype=torch.uint8
            )  # [G, Kp/4, 8]: 64 bits a mask
            for p in planes
        ]
        masks = torch.stack(masks, dim=2).view(groups, cols // 32, 8 * 8 * len(planes))  # per block: step, plane
        return torch.cat([nibbles, masks], dim=2).reshape(groups, -1).contiguous()

    @classmethod
    def _unpacked(cls, q: torch.Tensor, cols: int) -> torch.Tensor:
        groups, extra = q.shape[0], cls.BITS - 4
        blocks = q.view(torch.uint8).view(groups, cols // 32, 256 + 64 * extra)
        u = Q4Weight._unpacked(blocks[..., :256].reshape(groups, -1), cols).view(torch.uint8).view(groups, GROUP, cols)
        masks = blocks[..., 256:].reshape(groups, cols // 32, 8, extra, 8)  # [G, B, step, plane, byte]
        for plane in range(extra):
            bits = (masks[:, :, :, plane, :, None] >> torch.arange(8, dtype=torch.uint8)) & 1  # [G, B, step, 8, 8]
            bits = bits.reshape(groups, cols // 4, GROUP, 4).permute(0, 2, 1, 3).reshape(groups, GROUP, cols)
            u = u | (bits << (4 + plane))
        return u.reshape(groups * GROUP, cols).to(torch.int8)

    def extra_repr(self) -> str:
        return f"{self.out_features}x{self.in_features}, a GGUF file's {self.BITS}-bit blocks of {self.SUB}"


class Q6Weight(Q5Weight):
    """A weight [N, K] as a Q6_K tensor's blocks (`blocks6`): q in [0, 63] (nibbles and masks of bits 4 and 5), a
    signed byte sc per 16 inputs and the fp16 d per 256 (held as fp32, d and -32·d): s = sc·d, z = sc·(-32·d)."""

    BITS = 6
    SUB = 16

    def __init__(self, q: torch.Tensor, sc: torch.Tensor, d: torch.Tensor):
        torch.nn.Module.__init__(self)
        n, k = q.shape
        if k % SUPER:
            raise DraftwiseError(f"q6: a row of {k} inputs is not whole super-blocks of {SUPER}")
        pad = lambda t: padded(t, _up(n), t.shape[1])  # noqa: E731 (k is whole super-blocks: no column padding)
        sc, d = pad(sc.to(torch.int8)), pad(d.float())
        self._pack(pad(q.to(torch.int8)), sc, None, n, k, per8=(d, -32 * d))
