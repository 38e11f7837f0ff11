"""One named mask per prunable dimension, and a forward of any lean-path family that applies them
(LLM-Shearing's design).

  layer         [L]     scales a whole decoder layer's residual branches (0 = the layer is skipped)
  head          [L, H]  scales each query head's attention output before o_proj
  intermediate  [L, F]  scales each FFN channel, act(gate)·up, before down_proj
  hidden        [D]     scales each residual-stream dimension: embedding output, every branch output; every RMSNorm
                        over the residual width then averages over the kept dimensions only (Σ x²·z / Σ z), as the
                        sliced model's norm does
With 0/1 values the masked model computes exactly what the physically sliced model does (`slicing.py`), so scores
and L0 training act on the masks, and slicing is a separate, exact step. The forward is plain differentiable torch
over the lean forward's weight layout (`family.layer_tensors`: one description of every family's weights), so
gradients reach the masks (Taylor scores, L0 training).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from ...runtimes.lean.attention import attend, rotate
from ...targets.family import FAMILIES, Shape, layer_tensors, rope_keys, rope_table, windows


@dataclass
class Masks:
    layer: torch.Tensor  # [L]
    head: torch.Tensor  # [L, H]
    intermediate: torch.Tensor  # [L, F]
    hidden: torch.Tensor  # [D]

    @classmethod
    def ones(cls, config, requires_grad: bool = False) -> Masks:
        s = Shape.of(config)
        sizes = {
            "layer": (s.num_layers,),
            "head": (s.num_layers, s.num_heads),
            "intermediate": (s.num_layers, config.intermediate_size),
            "hidden": (s.hidden_size,),
        }
        return cls(**{k: torch.ones(v, requires_grad=requires_grad) for k, v in sizes.items()})

    def items(self):
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


def masked_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, z: torch.Tensor) -> torch.Tensor:
    """RMSNorm over the kept dimensions of x [.., D] (x is already 0 where z is 0)."""
    variance = (x.pow(2) * z).sum(-1, keepdim=True) / z.sum()
    return x * torch.rsqrt(variance + eps) * weight  # weight: the family's offset already folded in


class MaskedLM(nn.Module):
    """A causal LM of any lean-path family whose forward takes `Masks`; its weights are frozen buffers."""

    def __init__(self, config, state_dict: dict[str, torch.Tensor]):
        super().__init__()
        self.config, self.shape, self.family = config, Shape.of(config), FAMILIES[config.model_type]
        sd = {k: v.detach() for k, v in state_dict.items()}
        self.layers = [
            layer_tensors(sd, f"model.layers.{i}.", self.family, self.shape) for i in range(self.shape.num_layers)
        ]
        self.windows, self.rope_keys = windows(config), rope_keys(config)
        self.embed = sd["model.embed_tokens.weight"]
        self.norm = self.family.norm_scale(sd["model.norm.weight"])
        self.embed_scale = self.family.embedding_scale(self.shape.hidden_size, self.embed.dtype)
        self.head = self.embed if config.tie_word_embeddings else sd["lm_head.weight"]
        self._rot: dict[str | None, torch.Tensor] = {}

    def _rotations(self, T: int, key: str | None) -> torch.Tensor:
        if key not in self._rot or self._rot[key].shape[0] < T:
            self._rot[key] = rope_table(self.config, self.shape, max(T, 64), key)
        return self._rot[key][:T, None, :]  # [T, 1, hd/2]

    def forward(self, ids: torch.Tensor, masks: Masks | None = None) -> torch.Tensor:
        """ids [B, T] (right padding is harmless: attention is causal) -> logits [B, T, V]."""
        s = self.shape
        B, T = ids.shape
        H, KV, hd, eps = s.num_heads, s.num_kv_heads, s.head_dim, s.rms_eps
        z = masks.hidden if masks is not None else torch.ones(s.hidden_size)
        x = F.embedding(ids, self.embed)  # [B, T, D]
        if self.embed_scale is not None:
            x = x * self.embed_scale
        x = x * z
        keys = torch.arange(T)
        causal = keys <= keys[:, None]  # [T, T]
        for i, w in enumerate(self.layers):
            zl = masks.layer[i] if masks is not None else 1.0
            qkv = F.linear(masked_rms_norm(x, w["ln_attn"], eps, z), w["wqkv"], w["bqkv"]).view(B, T, H + 2 * KV, hd)
            q, k, v = qkv.split([H, KV, KV], dim=2)
            if w["q_norm"] is not None:
                q, k = F.rms_norm(q, (hd,), w["q_norm"], eps), F.rms_norm(k, (hd,), w["k_norm"], eps)
            rot = self._rotations(T, self.rope_keys[i])
            q, k = rotate(q, rot), rotate(k, rot)
            mask = causal if self.windows[i] is None else causal & (keys > keys[:, None] - self.windows[i])
            att = attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask[None, None], s)  # [B, H, T, hd]
            if masks is not None:
                att = att * masks.head[i][None, :, None, None]
            o = F.linear(att.transpose(1, 2).reshape(B, T, H * hd), w["wo"], w["bo"])
            if w["ln_attn_out"] is not None:
                o = masked_rms_norm(o, w["ln_attn_out"], eps, z)
            x = x + zl * o * z
            gate, up = F.linear(masked_rms_norm(x, w["ln_mlp"], eps, z), w["wgu"], w["bgu"]).chunk(2, dim=-1)
            a = (F.gelu(gate, approximate="tanh") if self.family.activation == "gelu_tanh" else F.silu(gate)) * up
            if masks is not None:
                a = a * masks.intermediate[i]
            m = F.linear(a, w["wd"], w["bd"])
            if w["ln_mlp_out"] is not None:
                m = masked_rms_norm(m, w["ln_mlp_out"], eps, z)
            x = x + zl * m * z
        logits = F.linear(masked_rms_norm(x, self.norm, eps, z), self.head)
        return logits if s.final_softcap is None else torch.tanh(logits / s.final_softcap) * s.final_softcap
