"""The lean engine's int8 precision: linear layers and the LM head hold int8 weights in blocks of 32 along the input,
each block of each row with its own scale and offset (w = s·q + z); each activation row (token) is quantized to int16
with its own scale when it enters a linear layer; norms, attention, the KV cache and the residual stream stay fp32.
A lossy choice the user makes (`--dtype int8`), labelled so wherever its figures appear; `stages/quality.py`
measures what it costs against fp32 (teacher-forced top-1 agreement and NLL).

Why these choices (measured on the default target, teacher-forced top-1 agreement with fp32 over 24 eval prompts):
per-row int8 weights with per-row int8 activations agreed on 0.84 of positions, the Q4_1 file in llama.cpp on
0.98. Both halves cost: a weight scale per row cannot keep the levels of rows whose blocks differ in range (a Q4_1
file's blocks do), and 8-bit activations lose their small channels beside outliers. Asymmetric blocks of 32 hold a
Q4_1 block's 16 levels exactly (and any other block's to 1/255 of its range), and 16-bit activations cost about
nothing in quality; the dot products stay exact integer sums per block.

Why per row, not per tensor: a (γ+1)-token verify pass must give each row the bits its one-token step gives, or
greedy SD stops reproducing greedy AR on this precision. With a scale per row and exact sums per block combined in a
fixed order (see `cpu_int8.c`), nothing a row computes depends on the other rows of the pass.

`kernels.linear` runs an `Int8Weight` on the C kernel (`draftwise_int8_gemm`, AVX-512 or AVX2) on x86 CPUs;
elsewhere on `reference_linear`, the same function in torch (exact integer sums in float64, the same fp32 operations
in the same order): slower, never different.
"""

from __future__ import annotations

import torch
from torch import nn

from ...errors import DraftwiseError

NAME = "int8"
LINEARS = ("wqkv", "wo", "wgu", "wd")  # a lean layer's matrices: int8 at this precision (norms and biases stay fp32)
BLOCK = 32  # weights: one scale and offset per block of 32 inputs of a row
ALIGN = 64  # K and N are padded with zeros to multiples of this (N: the kernel's tiles of 4 groups of 16 rows)
GROUP = 16  # rows packed together (`cpu_int8.c`): 64 bytes hold 4 consecutive k of 16 rows
QMAX = 32767.0  # activations: int16, symmetric, one scale per row
QMAX8 = 127.0  # or (`abits` 8) per block of 32 of a row: int8, symmetric, a scale each, or int16 where the block
WIDE_C2 = 64  # holds an outlier: its largest value squared > WIDE_C2 times the row's mean square (`cpu_int8.h`)


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def fp16_exact(*ts: torch.Tensor) -> bool:
    """Whether every value of these fp32 tensors is an fp16 value (fp16 then holds them exactly)."""
    return all(torch.equal(t.half().float(), t) for t in ts)


def padded(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """t [N, C] with zeros after it to [rows, cols]."""
    return nn.functional.pad(t, (0, cols - t.shape[1], 0, rows - t.shape[0]))


class Int8Weight(nn.Module):
    """A weight [N, K] as int8 in blocks of 32 along K: w ≈ s·q + z per (row, block), s and z in fp16 (`dequantize`),
    packed for the kernel (`cpu_int8.c`: groups of 16 rows, K and N zero-padded to multiples of 64), with each
    block's sum of q (the kernel's correction for its unsigned activation bytes)."""

    BITS = 8  # bits of q as stored (`q4.Q4Weight`: 4, `q56.py`: 5 and 6)
    SCALES = torch.float16  # how s and z are stored
    SUB = BLOCK  # inputs one s and z cover (Q6_K's: 16)
    abits = 16  # bits of the activations it is multiplied with: 16 (a scale per row) or 8 (per block: `q4.py`)

    def __init__(self, w: torch.Tensor):
        super().__init__()
        if w.dim() != 2 or not w.is_floating_point():
            raise DraftwiseError(f"int8: can only quantize a 2-D floating-point weight, got {tuple(w.shape)} {w.dtype}")
        n, k = w.shape
        blocks = torch.zeros(_up(n), _up(k), device=w.device)
        blocks[:n, :k] = w.detach().float()
        blocks = blocks.view(_up(n), -1, BLOCK)  # [Np, B, 32]
        lo, hi = blocks.amin(-1), blocks.amax(-1)
        s = ((hi - lo) / 255).half()  # the stored values: q is computed against what the kernel will read
        z = (lo + 128 * s.float()).half()
        q = torch.where(s[..., None] > 0, torch.round((blocks - z.float()[..., None]) / s.float()[..., None]), 0.0)
        self._pack(q.clamp(-128, 127).to(torch.int8).view(_up(n), -1), s, z, n, k)

    def _pack(
        self, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor, n: int, k: int, per8: tuple | None = None
    ) -> None:
        """q [Np, Kp] int8, s and z [Np, Kp / SUB] (stored as `SCALES`) -> the kernel's layout. `per8`: (sd, zd)
        [Np, Kp / 256] fp32, when s and z are bytes that scale them per super-block of 256 (Q4_K's, `q4.py`: unsigned,
        s·sd and z·zd; Q6_K's, `q56.py`: signed, z None: the offset is s·zd)."""
        self.in_features, self.out_features = k, n
        rows, cols = q.shape
        groups = rows // GROUP
        lay = lambda t: t.view(groups, GROUP, -1).permute(0, 2, 1).contiguous()  # noqa: E731 [G, B, 16]
        self.register_buffer("q", self._packed(q.view(groups, GROUP, cols)), persistent=False)
        held = s.dtype if per8 is not None else self.SCALES  # per8: the file's bytes, as they are
        qsum = q.view(rows, -1, BLOCK).sum(-1, dtype=torch.int16)  # |Σ| <= 32 * 128
        for name, t in (("s", s.to(held)), ("z", None if z is None else z.to(held)), ("qsum", qsum)):
            self.register_buffer(name, lay(t) if t is not None else s.new_empty(0, dtype=held), persistent=False)
        if self.BITS != 8:  # q >= 0: the kernel needs no sums of q (`cpu_int8.c`), so a step does not read them
            self.qsum = qsum.new_empty(0)
        for name, t in zip(("sd", "zd"), per8 or (None, None)):
            self.register_buffer(name, lay(t.float()) if t is not None else torch.empty(0), persistent=False)

    @classmethod
    def of_blocks(cls, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> Int8Weight:
        """A weight held as a file's own blocks (`q4.blocks8`): q [N, K] int8, s and z [N, K/32] fp32 values that fp16
        holds exactly; w = s·q + z as the file defines it, nothing requantized."""
        if not fp16_exact(s, z):
            raise DraftwiseError("int8: a file's block scales and offsets must be fp16 values")
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        n, k = q.shape
        pad = lambda t, cols: padded(t, _up(n), cols)  # noqa: E731
        out._pack(pad(q.to(torch.int8), _up(k)), pad(s, _up(k) // BLOCK).half(), pad(z, _up(k) // BLOCK).half(), n, k)
        return out

    BUFFERS = ("q", "s", "z", "qsum", "sd", "zd")  # what a packed weight is (`packed.py` keeps them as they are)

    @classmethod
    def of_buffers(cls, buffers: dict[str, torch.Tensor], out_features: int, in_features: int) -> Int8Weight:
        """A weight from the buffers `_pack` made (`BUFFERS`), packed already: nothing is computed."""
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.in_features, out.out_features = in_features, out_features
        for name in cls.BUFFERS:
            out.register_buffer(name, buffers[name], persistent=False)
        return out

    @property
    def scale_format(self) -> int:
        """How s and z are held (`cpu_int8.h`): 0 fp32, 1 fp16, 2 unsigned bytes times an fp32 per super-block,
        3 signed bytes so (the offset from s's bytes)."""
        if self.sd.numel():
            return 3 if self.s.dtype == torch.int8 else 2
        return int(self.s.dtype == torch.float16)

    @property
    def route_format(self) -> int:
        """Its format as the kernel's route indexes it (`ladder.FORMATS`: q8, q4, q4h, q4k, q5h, q6k)."""
        if self.BITS != 4:
            return {8: 0, 5: 4, 6: 5}[self.BITS]
        return {2: 3, 1: 2}.get(self.scale_format, 1)

    @staticmethod
    def _packed(q: torch.Tensor) -> torch.Tensor:
        """q [G, 16, Kp] -> [G, Kp*16]: 64 bytes hold 4 consecutive k of 16 rows."""
        groups, _, cols = q.shape
        return q.view(groups, GROUP, cols // 4, 4).permute(0, 2, 1, 3).reshape(groups, -1).contiguous()

    @staticmethod
    def _unpacked(q: torch.Tensor, cols: int) -> torch.Tensor:
        """`_packed`'s inverse: [G, Kp*16] -> [G*16, Kp]."""
        groups = q.shape[0]
        return q.view(groups, cols // 4, GROUP, 4).permute(0, 2, 1, 3).reshape(groups * GROUP, cols)

    @property
    def padded_in(self) -> int:
        return _up(self.in_features)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.out_features, self.in_features))

    @property
    def dtype(self) -> torch.dtype:
        return torch.int8

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q [Np, Kp] int8, s [Np, Kp / SUB], z [Np, Kp / SUB] as fp32), padding included."""
        q = self._unpacked(self.q, self.padded_in)
        s, z, sd, zd = self.raw_rows()
        s, z = s.float(), z.float()
        if sd is not None:  # s·sd, z·zd: exact products, the kernel's
            sd, zd = (t.repeat_interleave(s.shape[1] // t.shape[1], dim=1) for t in (sd, zd))
            s, z = s * sd, z * zd
        return q, s, z

    def raw_rows(self) -> tuple[torch.Tensor, ...]:
        """s, z [Np, Kp / SUB] and sd, zd [Np, Kp / 256] (None without them) as held, a row each."""
        rows = lambda t: t.permute(0, 2, 1).reshape(t.shape[0] * GROUP, -1)  # noqa: E731
        s = rows(self.s)
        z = rows(self.z) if self.z.numel() else s  # Q6_K's offsets: its scales' bytes (times zd)
        if not self.sd.numel():
            return s, z, None, None
        return s, z, rows(self.sd), rows(self.zd)

    def dequantize(self) -> torch.Tensor:
        """The fp32 weight this int8 weight stands for, [N, K]."""
        q, s, z = self.unpacked()
        w = q.float().view(q.shape[0], -1, self.SUB) * s[..., None] + z[..., None]
        return w.view(q.shape[0], -1)[: self.out_features, : self.in_features]

    def rows(self, ids) -> Int8Weight:
        """The weight of some output rows (a reduced head), held as they are here (blocks are per row)."""
        ids = torch.as_tensor(list(ids), dtype=torch.long)
        q = self._unpacked(self.q, self.padded_in)
        s, z, sd, zd = self.raw_rows()
        out = type(self).__new__(type(self))
        nn.Module.__init__(out)
        out.SCALES = self.s.dtype
        rows = _up(len(ids))
        pad = lambda t: torch.cat([t[ids], t.new_zeros(rows - len(ids), t.shape[1])])  # noqa: E731
        per8 = None if sd is None else (pad(sd), pad(zd))
        out._pack(pad(q), pad(s), pad(z) if self.z.numel() else None, len(ids), self.in_features, per8=per8)
        out.abits = self.abits
        return out

    def extra_repr(self) -> str:
        return f"{self.out_features}x{self.in_features}, blocks of {BLOCK} with scale and offset"


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int16: x [M, K] fp32 -> (q [M, K] as float, scale [M]), as `cpu_int8.c`'s quantize_rows."""
    amax = x.abs().amax(dim=1)
    inv = torch.where(amax > 0, torch.full_like(amax, QMAX) / amax, torch.zeros_like(amax))  # a true division
    q = torch.round(x * inv[:, None]).clamp(-QMAX, QMAX)
    return q, amax / QMAX


def quantize_blocks(x: torch.Tensor, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per block of 32 symmetric: x [M, K] fp32 -> (q [M, cols] as float, zero past K; scale [M, cols / 32]), as
    `cpu_int8.c`'s quantize_blocks: a block at 8 bits (held as 256 v, its scale / 256) unless it holds an outlier
    (`WIDE_C2`, judged on the row's int16 values in exact integers), then at 16."""
    m, k = x.shape
    pad = lambda t: torch.nn.functional.pad(t, (0, cols - k)).view(m, -1, BLOCK)  # noqa: E731
    r = quantize_rows(x)[0].double()
    top = pad(r.abs()).amax(-1)
    wide = top * top * k > WIDE_C2 * (r * r).sum(1, keepdim=True)  # exact in float64: every term < 2^53
    xb = pad(x)
    amax = xb.abs().amax(-1)
    qmax = torch.where(wide, QMAX, QMAX8)
    inv = torch.where(amax > 0, qmax / amax, torch.zeros_like(amax))
    q = torch.round(xb * inv[..., None])
    q = torch.minimum(torch.maximum(q, -qmax[..., None]), qmax[..., None])
    q = torch.where(wide[..., None], q, q * 256)
    return q.view(m, cols), torch.where(wide, amax / QMAX, amax / QMAX8 / 256)


def reference_linear(x2: torch.Tensor, w: Int8Weight) -> torch.Tensor:
    """`linear` in torch: x2 [M, K] fp32 -> [M, N], the kernel's operations in its order: per block an exact integer
    sum d (float64 here) and the activations' block sum t, acc = acc + (d·s + t·z) in fp32, then acc · sx; at
    `abits` 8, acc = acc + (d·s + t·z)·sa with the block's activation scale sa (and no sx)."""
    m, k, cols = x2.shape[0], w.in_features, w.padded_in
    xq = torch.zeros(m, cols, dtype=torch.float64)
    if w.abits == 8:
        q, sa = quantize_blocks(x2.float(), cols)
        xq[:] = q
    else:
        q, sx = quantize_rows(x2.float())
        xq[:, :k] = q
    wq, s, z = w.unpacked()
    sub = w.SUB  # inputs a weight scale covers: the sums d and t are per sub-block, the activations' scale per block
    xb, wb = xq.view(m, -1, sub), wq.double().view(wq.shape[0], -1, sub)  # [M, NB, sub], [Np, NB, sub]
    d = torch.einsum("mbk,nbk->mnb", xb, wb)  # exact in float64: |d| < 2^31
    t = xb.sum(-1)  # [M, NB]
    folded = w.scale_format == 3  # Q6_K's z = -32·s: the kernel takes (d - 32·t)·s, the integer exact
    d, t = (d - 32 * t[:, None, :]).float() if folded else d.float(), t.float()
    acc = torch.zeros(m, wq.shape[0])
    for b in range(xb.shape[1]):
        term = d[:, :, b] * s[:, b] if folded else d[:, :, b] * s[:, b] + t[:, b, None] * z[:, b]
        acc = acc + (term * sa[:, b * sub // BLOCK, None] if w.abits == 8 else term)
    return (acc if w.abits == 8 else acc * sx[:, None])[:, : w.out_features]


def check_supported(device: str, backend: str, name: str = NAME) -> None:
    """The one-line refusal of an int8 (or q4: `q4.py`) model where this precision does not run."""
    if device != "cpu":
        raise DraftwiseError(
            f"--dtype {name} is a precision of the lean engine on the CPU; device {device!r} cannot "
            "run it (use fp32, bf16 or fp16 there)"
        )
    if backend not in ("auto", "lean"):
        raise DraftwiseError(
            f"--dtype {name} is a precision of the lean engine, not of backend {backend!r} (llama.cpp "
            "runs a GGUF file at its own quantization: --gguf-quant)"
        )
