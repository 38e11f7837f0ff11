"""One named mask per prunable dimension, and a Llama forward that applies them (LLM-Shearing's design).

  layer         [L]     scales a whole decoder layer's residual branches (0 = the layer is skipped)
  head          [L, H]  scales each query head's attention output before o_proj
  intermediate  [L, F]  scales each FFN channel, silu(gate)·up, before down_proj
  hidden        [D]     scales each residual-stream dimension: embedding output, every branch output; RMSNorm then
                        averages over the kept dimensions only (Σ x²·z / Σ z), as the sliced model's norm does
With 0/1 values the masked model computes exactly what the physically sliced model does (`slicing.py`), so scores
and L0 training act on the masks, and slicing is a separate, exact step. The forward is plain differentiable torch
on the standard Hugging Face weight layout, so gradients reach the masks (Taylor scores, L0 training).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ...models.llama import Shape, rope_table


@dataclass
class Masks:
    layer: torch.Tensor  # [L]
    head: torch.Tensor  # [L, H]
    intermediate: torch.Tensor  # [L, F]
    hidden: torch.Tensor  # [D]

    @classmethod
    def ones(cls, config, requires_grad: bool = False) -> "Masks":
        s = Shape.of(config)
        sizes = {"layer": (s.num_layers,), "head": (s.num_layers, s.num_heads),
                 "intermediate": (s.num_layers, config.intermediate_size), "hidden": (s.hidden_size,)}
        return cls(**{k: torch.ones(v, requires_grad=requires_grad) for k, v in sizes.items()})

    def items(self):
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


def masked_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, z: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the kept dimensions of x [.., D] (x is already 0 where z is 0)."""
    variance = (x.pow(2) * z).sum(-1, keepdim=True) / z.sum()
    return x * torch.rsqrt(variance + eps) * weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class MaskedLlama(nn.Module):
    """A Llama-family causal LM whose forward takes `Masks`; its weights are frozen buffers."""

    def __init__(self, config, state_dict: dict[str, torch.Tensor]):
        super().__init__()
        self.config, self.shape = config, Shape.of(config)
        self.weights = {k: v.detach() for k, v in state_dict.items()}
        self.tied = config.tie_word_embeddings
        rot = rope_table(config, self.shape, 1)
        self._rope = (config, rot)

    def w(self, name: str) -> torch.Tensor | None:
        return self.weights.get(name)

    def _cos_sin(self, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
        config, rot = self._rope
        if rot.shape[0] < T:
            rot = rope_table(config, self.shape, max(T, 2 * rot.shape[0]))
            self._rope = (config, rot)
        r = rot[:T].to(device)  # [T, hd/2] complex: HF's cos/sin repeat each frequency over both halves
        return torch.cat([r.real, r.real], -1), torch.cat([r.imag, r.imag], -1)

    def forward(self, ids: torch.Tensor, masks: Masks | None = None) -> torch.Tensor:
        """ids [B, T] (right padding is harmless: attention is causal) -> logits [B, T, V]."""
        s = self.shape
        B, T = ids.shape
        H, KV, hd = s.num_heads, s.num_kv_heads, s.head_dim
        z = masks.hidden if masks is not None else torch.ones(s.hidden_size)
        cos, sin = self._cos_sin(T, ids.device)
        x = F.embedding(ids, self.w("model.embed_tokens.weight")) * z
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            zl = masks.layer[i] if masks is not None else 1.0
            h = masked_rms_norm(x, self.w(p + "input_layernorm.weight"), s.rms_eps, z)
            q = F.linear(h, self.w(p + "self_attn.q_proj.weight"), self.w(p + "self_attn.q_proj.bias")).view(B, T, H, hd).transpose(1, 2)
            k = F.linear(h, self.w(p + "self_attn.k_proj.weight"), self.w(p + "self_attn.k_proj.bias")).view(B, T, KV, hd).transpose(1, 2)
            v = F.linear(h, self.w(p + "self_attn.v_proj.weight"), self.w(p + "self_attn.v_proj.bias")).view(B, T, KV, hd).transpose(1, 2)
            q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=KV != H)  # [B, H, T, hd]
            if masks is not None:
                att = att * masks.head[i][None, :, None, None]
            o = F.linear(att.transpose(1, 2).reshape(B, T, H * hd), self.w(p + "self_attn.o_proj.weight"), self.w(p + "self_attn.o_proj.bias"))
            x = x + zl * o * z
            h = masked_rms_norm(x, self.w(p + "post_attention_layernorm.weight"), s.rms_eps, z)
            a = F.silu(F.linear(h, self.w(p + "mlp.gate_proj.weight"), self.w(p + "mlp.gate_proj.bias"))) \
                * F.linear(h, self.w(p + "mlp.up_proj.weight"), self.w(p + "mlp.up_proj.bias"))
            if masks is not None:
                a = a * masks.intermediate[i]
            x = x + zl * F.linear(a, self.w(p + "mlp.down_proj.weight"), self.w(p + "mlp.down_proj.bias")) * z
        x = masked_rms_norm(x, self.w("model.norm.weight"), s.rms_eps, z)
        head = self.w("model.embed_tokens.weight") if self.tied else self.w("lm_head.weight")
        return F.linear(x, head)
