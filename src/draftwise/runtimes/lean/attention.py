"""The lean forward's attention in torch (where the C kernel does not take a pass: a GPU, autograd, per-row RoPE
positions): RoPE in the pair-adjacent layout (`forward.py` says why that layout), grouped-query attention with the
family's scale and optional score soft-cap, and which keys each query sees (`key_mask`). `stages.prune` scores layers
with them too."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...targets.family import Shape


def rotate(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """RoPE in the pair-adjacent layout: x [B, T, n, hd] times rot [T or B×T, 1, hd/2] (complex) -> [B, T, n, hd]."""
    xc = torch.view_as_complex(x.float().unflatten(-1, (x.shape[-1] // 2, 2)))  # [B, T, n, hd/2]
    return torch.view_as_real(xc * rot).flatten(-2).to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, s: Shape) -> torch.Tensor:
    """Grouped-query attention with the family's scale and optional score soft-cap: q [B, H, T, hd],
    k, v [B, KV, S, hd], mask [B or 1, 1, T, S] bool, or None: every query sees every key (a one-token step)
    -> [B, H, T, hd]."""
    H, KV = q.shape[1], k.shape[1]
    if s.attn_softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=s.attn_scale, enable_gqa=KV != H)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)  # SDPA has no soft-cap hook
    scores = torch.tanh(q @ k.transpose(-1, -2) * s.attn_scale / s.attn_softcap) * s.attn_softcap  # [B, H, T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(v.dtype) @ v


def key_mask(T: int, pos: int, start, positions, key_positions, window: int | None, dev) -> torch.Tensor | None:
    """Which keys each query sees, [B or 1, 1, T, pos+T] bool, for layers with this window (None: when causal
    attention over the whole cache needs no mask). Query i (slot pos+i) of row b sees the row's keys up to its
    own slot — those from start[b] on, or those key_positions marks real — within the window, and always itself
    (so a padding query stays finite)."""
    if T == 1 and start is None and key_positions is None and (window is None or pos < window):
        return None
    keys = torch.arange(pos + T, device=dev)
    queries = torch.arange(pos, pos + T, device=dev)[:, None]
    seen = (keys <= queries)[None]  # [1, T, pos+T]
    if key_positions is not None:
        key_pos = key_positions[:, None, : pos + T]  # [B, 1, pos+T]
        seen = seen & (key_pos >= 0)
        if window is not None:
            seen = seen & (key_pos > positions[:, :, None] - window)
    else:
        if start is not None:
            seen = seen & (keys >= torch.tensor(start, device=dev)[:, None, None])  # [B, T, pos+T]
        if window is not None:
            seen = seen & (keys > queries - window)
    return (seen | (keys == queries))[:, None]
