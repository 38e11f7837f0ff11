"""The lean engine's int8 precision (W8A8): linear layers and the LM head hold int8 weights with one scale per output
row; each activation row (token) is quantized to int8 with its own scale when it enters a linear layer; norms,
attention, the KV cache and the residual stream stay fp32. A lossy choice the user makes (`--dtype int8`), labelled so
wherever its figures appear; `stages/quality.py` measures what it costs against fp32.

Why per row, not per tensor: a (γ+1)-token verify pass must give each row the bits its one-token step gives, or
greedy SD stops reproducing greedy AR on this precision. With a scale per row and exact int32 sums (see
`cpu_int8.c`), nothing a row computes depends on the other rows of the pass.

`kernels.linear` runs an `Int8Weight` on the C kernel (`draftwise_int8_gemm`, AVX-512 VNNI or AVX2) on x86 CPUs;
elsewhere on `reference_linear`, the same function in torch (exact integer sums in float64, the same fp32
epilogue): slower, never different.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import DraftwiseError

NAME = "int8"
ALIGN = 64  # K and N are padded with zeros to multiples of this (the kernel's 64-byte steps and 4-group tiles)
GROUP = 16  # rows packed together (`cpu_int8.c`): one 64-byte load holds 4 consecutive k of 16 rows


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


class Int8Weight(nn.Module):
    """A weight [N, K] as int8 with one scale per output row (weight ≈ matrix() · scale[:, None]), packed for the
    kernel (`cpu_int8.c`: groups of 16 rows, K and N zero-padded to multiples of 64), with its row sums (the VNNI
    path's correction for its unsigned inputs)."""

    def __init__(self, w: torch.Tensor):
        super().__init__()
        if w.dim() != 2 or not w.is_floating_point():
            raise DraftwiseError(f"int8: can only quantize a 2-D floating-point weight, got {tuple(w.shape)} {w.dtype}")
        w = w.detach().float()
        amax = w.abs().amax(dim=1)  # [N]
        inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
        q = torch.round(w * inv[:, None]).clamp(-127, 127).to(torch.int8)
        self._pack(q, amax / 127.0)

    @classmethod
    def of(cls, q: torch.Tensor, scale: torch.Tensor) -> "Int8Weight":
        """A weight from int8 rows q [N, K] and their scales [N], as they are."""
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out._pack(q, scale)
        return out

    def _pack(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        n, k = q.shape
        self.in_features, self.out_features = k, n
        rows, cols = _up(n), _up(k)
        padded = torch.zeros(rows, cols, dtype=torch.int8, device=q.device)
        padded[:n, :k] = q
        packed = padded.view(rows // GROUP, GROUP, cols // 4, 4).permute(0, 2, 1, 3).contiguous()
        self.register_buffer("q", packed.view(rows // GROUP, -1), persistent=False)  # [N/16, Kp*16]
        self.register_buffer("scale", torch.zeros(rows).index_copy_(0, torch.arange(n), scale.float()), persistent=False)
        self.register_buffer("row_sum", padded.sum(dim=1, dtype=torch.int32), persistent=False)

    @property
    def padded_in(self) -> int:
        return _up(self.in_features)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def dtype(self) -> torch.dtype:
        return torch.int8

    def matrix(self) -> torch.Tensor:
        """The int8 rows [N, K], unpacked."""
        rows, cols = self.q.shape[0] * GROUP, self.padded_in
        unpacked = self.q.view(rows // GROUP, cols // 4, GROUP, 4).permute(0, 2, 1, 3).reshape(rows, cols)
        return unpacked[: self.out_features, : self.in_features]

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight this int8 weight stands for, [N, K]."""
        return self.matrix().float() * self.scale[: self.out_features, None]

    def rows(self, ids) -> "Int8Weight":
        """The weight of some output rows (a reduced head), quantized as they are here (scales are per row)."""
        ids = torch.as_tensor(list(ids), dtype=torch.long)
        return Int8Weight.of(self.matrix()[ids], self.scale[ids])

    def extra_repr(self) -> str:
        return f"{self.out_features}x{self.in_features}, per-row scales"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8: x [M, K] fp32 -> (q [M, K] as float, scale [M]), as `cpu_int8.c`'s quantize_rows."""
    amax = x.abs().amax(dim=1)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))  # a true division
    q = torch.round(x * inv[:, None]).clamp(-127, 127)
    return q, amax / 127.0


def reference_linear(x2: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """`linear` in torch: x2 [M, K] fp32 -> [M, N]. Integer sums are exact in float64 (|Σ| < 2^53), converted to fp32
    as the kernel's int32 sums are (round to nearest even), then the same two fp32 products."""
    q, sx = quantize_rows(x2.float())
    acc = (q.double() @ w.matrix().double().T).float()  # [M, N]
    return (acc * w.scale[: w.out_features]) * sx[:, None]


def check_supported(device: str, backend: str) -> None:
    """The one-line refusal of an int8 model where this precision does not run."""
    if device != "cpu":
        raise DraftwiseError(f"--dtype int8 is a precision of the lean engine on the CPU; device {device!r} cannot "
                             "run it (use fp32, bf16 or fp16 there)")
    if backend not in ("auto", "lean"):
        raise DraftwiseError(f"--dtype int8 is a precision of the lean engine, not of backend {backend!r} (llama.cpp "
                             "runs a GGUF file at its own quantization: --gguf-quant)")
