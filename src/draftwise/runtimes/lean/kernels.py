"""The lean forward's kernels with a CPU fast path for decoding: `linear`, `rms_norm`, `attention`, `silu_mul`,
`gelu_tanh_mul`, `softcap`, `int8_gemm` (the int8 precision's linear layers, see `int8.py`), and `layers`: whole
decoder layers in one call (`cpu_layer.c`, the same kernels in the same order, without a Python call between them).

On CPU in fp32 with a few rows (a decoding step, or a (γ+1)-token verify pass) they call `cpu_kernels.c`, compiled
once with the system C compiler into the draftwise cache and loaded with ctypes: at batch 1 a torch op costs
5-60 us of dispatch, and a layer needs ~25 of them. Everything else (GPU, bf16, long prefill at fp32, autograd, no
compiler, no AVX2) goes to torch, so results never depend on whether the fast path is available, only speed does.
The library links the same OpenMP runtime as torch (soname libgomp.so.1, already loaded), so both share one thread
pool (`library.py` builds and loads it).
"""

from __future__ import annotations

import ctypes
import os
from functools import lru_cache
from pathlib import Path

import torch
import torch.nn.functional as F

from ...paths import cache_dir
from . import ladder, library
from .int8 import Int8Weight, reference_linear
from .library import LayerStruct, Matrix

MAX_ROWS = 64  # above this (long prefill) fp32 layers go to torch's BLAS and SDPA (int8/q4: `Layer.rows_fused`)


def _kernel():
    return library.load()


def kernel_available() -> bool:
    return _kernel() is not None


PATH_ENV = "DRAFTWISE_MATRIX_PATH"  # a test-only switch: one path in every band (`forced`)


@lru_cache(maxsize=1)
def route() -> ladder.Route:
    """Which path the int8 kernel takes for each size of pass here (`ladder.py`: every path the CPU reports proven
    and timed in a child, once a machine), or the one DRAFTWISE_MATRIX_PATH names (`forced`); torch's reference where
    there is no kernel."""
    if _kernel() is None:
        return ladder.Route.one(0)
    if os.environ.get(PATH_ENV):
        return forced(os.environ[PATH_ENV])
    return ladder.proven(_kernel().draftwise_int8_isa(), Path(_kernel()._name).stem, cache_dir("kernels"))


def forced(spec: str) -> ladder.Route:
    """`ladder.forced` on this CPU (DRAFTWISE_MATRIX_PATH's value: 'avx2', 'avx512,q8k'); a path it does not run is
    one line."""
    return ladder.forced(spec, _kernel().draftwise_int8_isa(), PATH_ENV)


def band(rows: int) -> int:
    """The ladder's band of a pass of `rows` rows (`draftwise_int8_band`: 0 a step ... 4 a long prefill)."""
    return _kernel().draftwise_int8_band(rows) if _kernel() is not None else 0


def table(prompt: bool = False) -> bytes:
    """The route's table the C kernel reads: every pass's, or a prompt pass's (`prompt.py`)."""
    return route().prompt if prompt else route().table


def int8_isa() -> int:
    """The best exact path the route takes anywhere, as the CPU ranks them (`draftwise_int8_isa`: 3 AMX, 2 AVX-512,
    1 AVX2; 0: none, torch computes the same function)."""
    return max(ladder.RUNS_ON.get(c, 0) for c in route().table)


def int8_available() -> bool:
    return int8_isa() > 0 and not torch.compiler.is_compiling()


def int8_gemm(x: torch.Tensor, w, isa: int | None = None, lib=None, prompt: bool = False) -> torch.Tensor:
    """x [M, K] fp32 contiguous (CPU) times the int8 weight `w` (`int8.Int8Weight`) -> [M, N] fp32, each row of x
    quantized with its own scale, or each of its blocks of 32 at `w.abits` 8 (`cpu_int8.c`), on the route's path
    for M rows (`prompt`: a prompt pass's, which may be lossy: `prompt.py`). `isa`: that path at every size instead
    (tests compare them; the ladder's child times one); `lib`: another build of the library (`library.load`: the AMX
    emulation)."""
    y = torch.empty(x.shape[0], w.out_features, dtype=torch.float32)
    route = table(prompt) if isa is None else ladder.Route.one(isa).table
    (lib or _kernel()).draftwise_int8_gemm(
        x.data_ptr(), *blocks(w), w.qsum.data_ptr(), y.data_ptr(), *sizes(x, w), route, w.BITS, w.scale_format, w.abits
    )
    return y


def blocks(w) -> tuple[int, ...]:
    """An `Int8Weight`'s packed q, its scales and offsets and their super-blocks' factors, as the C kernels take
    them (addresses)."""
    return tuple(t.data_ptr() for t in (w.q, w.s, w.z, w.sd, w.zd))


def sizes(x: torch.Tensor, w) -> tuple[int, ...]:
    """M, N, K, Kp and the threads of a product of x [M, K] with `w`, as the C kernels take them."""
    return x.shape[0], w.out_features, w.in_features, w.padded_in, torch.get_num_threads()


def _on_fast_path(x: torch.Tensor, w: torch.Tensor) -> bool:
    return (
        fast_path(x)
        and w.dtype == torch.float32
        and w.is_contiguous()
        and not (torch.is_grad_enabled() and w.requires_grad)
    )


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None, prompt: bool = False) -> torch.Tensor:
    """x [..., K] @ w[N, K]^T (+ b) -> [..., N]; `w` an fp32 tensor or an `int8.Int8Weight` (`prompt`: a prompt
    pass, on the route's prompt table)."""
    if isinstance(w, Int8Weight):
        return _int8_linear(x, w, b, prompt)
    n_out, k = w.shape
    rows = x.numel() // k
    if rows > MAX_ROWS or k % 8 or n_out % 4 or not _on_fast_path(x, w):
        return F.linear(x, w, b)
    x2 = x.reshape(rows, k).contiguous()
    y = torch.empty(rows, n_out, dtype=x.dtype)
    _kernel().draftwise_small_gemm(x2.data_ptr(), w.data_ptr(), y.data_ptr(), rows, n_out, k, torch.get_num_threads())
    if b is not None:
        y += b
    return y.view(*x.shape[:-1], n_out)


def _int8_linear(x: torch.Tensor, w: Int8Weight, b: torch.Tensor | None, prompt: bool) -> torch.Tensor:
    """x [..., K] @ w^T (+ b) -> [..., N] fp32, each row quantized on its own (`int8.py`)."""
    k = w.in_features
    rows = x.numel() // k
    x2 = x.reshape(rows, k).float().contiguous()
    y = int8_gemm(x2, w, prompt=prompt) if int8_available() and x2.device.type == "cpu" else reference_linear(x2, w)
    if b is not None:
        y += b
    return y.view(*x.shape[:-1], w.out_features)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, as transformers' Llama computes it."""
    d = w.shape[0]
    if not _on_fast_path(x, w):
        return F.rms_norm(x, (d,), w, eps)
    x2 = x.contiguous()
    y = torch.empty_like(x2)
    _kernel().draftwise_rms_norm(x2.data_ptr(), w.data_ptr(), y.data_ptr(), x2.numel() // d, d, eps)
    return y


def fast_path(x: torch.Tensor) -> bool:
    """Whether the C kernels handle this activation: CPU fp32, no autograd, not being traced by torch.compile
    (ctypes calls cannot be traced), and the library is available."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and not (torch.is_grad_enabled() and x.requires_grad)
        and not torch.compiler.is_compiling()
        and _kernel() is not None
    )


def attention(
    qkv,
    rot,
    k_cache,
    v_cache,
    pos: int | list[int],
    n_heads: int,
    head_dim: int,
    start: list[int] | None = None,
    *,
    scale: float,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    norm_eps: float = 0.0,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Fast path of `lean.Layer`'s attention (see `draftwise_attention` in cpu_kernels.c).

    qkv [B, T, (H+2KV)*hd] (normed and rotated in place), rot [S, hd/2] complex, k_cache/v_cache [B, KV, S, hd]
    -> [B, T, H*hd], written at pos..pos+T-1 (pos[b] for row b when a list); start[b]: first real position of row b
    (left padding before it); q_norm/k_norm [hd]: per-head
    RMSNorm weights applied before RoPE; window: keys of the last `window` positions only; softcap: score capping.
    """
    B, T, _ = qkv.shape
    kv, S = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty(B, T, n_heads * head_dim)
    fn = _kernel().draftwise_attention
    qn = None if q_norm is None else q_norm.data_ptr()
    kn = None if k_norm is None else k_norm.data_ptr()
    for b in range(B):
        fn(
            qkv[b].data_ptr(),
            rot.data_ptr(),
            k_cache[b].data_ptr(),
            v_cache[b].data_ptr(),
            out[b].data_ptr(),
            T,
            pos[b] if isinstance(pos, list) else pos,
            start[b] if start else 0,
            n_heads,
            kv,
            head_dim,
            S,
            scale,
            torch.get_num_threads(),
            qn,
            kn,
            norm_eps,
            window or 0,
            softcap or 0.0,
        )
    return out


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def _matrix(w, b: torch.Tensor | None) -> Matrix | None:
    """A weight as cpu_layer.c takes it, or None where the unfused path would not take the C kernel either."""
    if isinstance(w, Int8Weight):
        return (
            Matrix(
                None,
                w.q.data_ptr(),
                w.s.data_ptr(),
                w.z.data_ptr(),
                w.sd.data_ptr(),
                w.zd.data_ptr(),
                w.qsum.data_ptr(),
                _ptr(b),
                w.out_features,
                w.in_features,
                w.padded_in,
                w.BITS,
                w.scale_format,
                w.abits,
            )
            if int8_available()
            else None
        )
    n, k = w.shape
    if w.dtype != torch.float32 or not w.is_contiguous() or k % 8 or n % 4 or w.requires_grad:
        return None
    return Matrix(w.data_ptr(), None, None, None, None, None, None, _ptr(b), n, k, k, 32, 0, 0)


def layer_struct(layer, gelu: bool) -> LayerStruct | None:
    """`layer`'s fused form (its tensors stay where they are: the struct points into them), or None when a part
    of it would take a torch path (a shape the kernels do not take, another dtype)."""
    s = layer.shape
    mats = [
        _matrix(getattr(layer, w), getattr(layer, b))
        for w, b in (("wqkv", "bqkv"), ("wo", "bo"), ("wgu", "bgu"), ("wd", "bd"))
    ]
    norms = [getattr(layer, n) for n in ("ln_attn", "ln_attn_out", "ln_mlp", "ln_mlp_out", "q_norm", "k_norm")]
    floats = [t for t in norms + [layer.bqkv, layer.bo, layer.bgu, layer.bd] if t is not None]
    if any(m is None for m in mats) or s.head_dim % 8 or any(t.dtype != torch.float32 for t in floats):
        return None
    return LayerStruct(
        *mats,
        *map(_ptr, norms),
        s.num_heads,
        s.num_kv_heads,
        s.head_dim,
        layer.window or 0,
        s.rms_eps,
        s.attn_scale,
        s.attn_softcap or 0.0,
        int(gelu),
    )


class Stack:
    """Layers to run in one C call (`layers`): their fused forms (`layer_struct`) and RoPE tables [*, hd/2] as the C
    arrays the call reads. A model makes its whole stack once (`LeanLM.stack`): building the arrays costs about what
    the call saves a step."""

    def __init__(self, structs: list[LayerStruct], rots: list[torch.Tensor]):
        self.n = len(structs)
        self.structs = (ctypes.POINTER(LayerStruct) * self.n)(*map(ctypes.pointer, structs))
        self.rots = (ctypes.c_void_p * self.n)(*(r.data_ptr() for r in rots))
        self.keys = self.key(structs, rots)
        self._keep = (structs, rots)  # what the arrays point into

    @staticmethod
    def key(structs: list[LayerStruct], rots: list[torch.Tensor]) -> tuple:
        """What a stack is made of: its structs (kept alive by it, so their ids stay theirs) and tables' memory."""
        return tuple(map(id, structs)), tuple(r.data_ptr() for r in rots)


def layers(
    stack: Stack,
    x: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pos: int | list[int] = 0,
    start: list[int] | None = None,
    segments: list[tuple[int, int, int]] | None = None,
    prompt: bool = False,
) -> torch.Tensor:
    """Decoder layers one after another in one C call (`draftwise_layers`: `lean.Layer.forward`'s fast path without
    Python between the layers or their kernels). x [B, T, D] at position pos (pos[b] for row b when a list: rows at
    their own positions, written at that slot), start[b] row b's first real position; or, given `segments` [(rows,
    cache row, position)] in x's order, x [R, D] rows of different lengths (a continuous batch's rows and a joining
    prompt's chunk, the weights read once for all); `prompt`: every row a prompt's, on the route's prompt table (it
    may be lossy: `prompt.py`). k_cache, v_cache [L, rows of the cache, KV, S, hd], the stack's
    layers' in order. Returns the new x (x itself is not changed)."""
    x = x.contiguous().clone()  # updated in place by the kernel
    starts = None if start is None else torch.tensor(start, dtype=torch.int64)
    if segments is not None:
        lens, slots, poss = (torch.tensor(col, dtype=torch.int64) for col in zip(*segments))
        nseg, T = len(segments), 0
    else:
        lens = slots = None
        poss = torch.tensor(pos, dtype=torch.int64) if isinstance(pos, list) else None
        nseg, T = x.shape[0], x.shape[1]
    _kernel().draftwise_layers(
        stack.structs,
        stack.rots,
        stack.n,
        x.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        k_cache.stride(0),
        nseg,
        T,
        _ptr(lens),
        _ptr(slots),
        0 if poss is not None else pos,
        _ptr(poss),
        _ptr(starts),
        k_cache.shape[3],
        torch.get_num_threads(),
        table(prompt),
    )
    return x


def silu_mul(gu: torch.Tensor) -> torch.Tensor:
    """[..., 2F] (gate, up) -> [..., F] silu(gate) * up."""
    f = gu.shape[-1] // 2
    if not fast_path(gu):
        gate, up = gu.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up
    gu = gu.contiguous()
    out = torch.empty(*gu.shape[:-1], f)
    _kernel().draftwise_silu_mul(gu.data_ptr(), out.data_ptr(), gu.numel() // (2 * f), f)
    return out


def gelu_tanh_mul(gu: torch.Tensor) -> torch.Tensor:
    """[..., 2F] (gate, up) -> [..., F] gelu_tanh(gate) * up (GeGLU, transformers' gelu_pytorch_tanh)."""
    f = gu.shape[-1] // 2
    if not fast_path(gu):
        gate, up = gu.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up
    gu = gu.contiguous()
    out = torch.empty(*gu.shape[:-1], f)
    _kernel().draftwise_gelu_tanh_mul(gu.data_ptr(), out.data_ptr(), gu.numel() // (2 * f), f)
    return out


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap), elementwise (Gemma 2's logit soft-capping)."""
    if not fast_path(x):
        return torch.tanh(x / cap) * cap
    x = x.contiguous().clone()
    _kernel().draftwise_softcap(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], cap)
    return x
