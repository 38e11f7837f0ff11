"""The requested shape, the units kept to reach it, and the physical slicing that makes the smaller checkpoint.

Scores (from importance or L0) rank units; `select` keeps exactly the requested number in each dimension, keeping
GQA valid: query heads are kept per KV group (whole groups by their summed score, then the best heads inside each
kept group), so every kept KV head serves the same number of query heads. `slice_checkpoint` then cuts the weights
to those indices — the same model the 0/1 masks of `masks.py` describe.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import DraftwiseError
from ...targets.family import FAMILIES, Shape

DIMENSIONS = ("layers", "hidden", "heads", "kv_heads", "ffn")


@dataclass(frozen=True)
class PruneShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int

    @classmethod
    def parse(cls, text: str, config) -> PruneShape:
        """'layers=3,hidden=576,...' (dimensions left out keep the target's), checked against the target."""
        s = Shape.of(config)
        values = {
            "layers": s.num_layers,
            "hidden": s.hidden_size,
            "heads": s.num_heads,
            "kv_heads": s.num_kv_heads,
            "ffn": config.intermediate_size,
        }
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, _, value = part.partition("=")
            if name not in values:
                raise DraftwiseError(f"unknown shape dimension {name!r}: use {', '.join(DIMENSIONS)}")
            try:
                values[name] = int(value)
            except ValueError:
                raise DraftwiseError(f"shape dimension {name} needs an integer, got {value!r}") from None
        shape = cls(**values)
        shape.check(config)
        return shape

    def check(self, config) -> None:
        s = Shape.of(config)
        limits = {
            "layers": s.num_layers,
            "hidden": s.hidden_size,
            "heads": s.num_heads,
            "kv_heads": s.num_kv_heads,
            "ffn": config.intermediate_size,
        }
        for name, limit in limits.items():
            value = getattr(self, name)
            if not 1 <= value <= limit:
                raise DraftwiseError(f"shape {name}={value} is impossible: the target has {limit} (need 1..{limit})")
        # where the width is heads × head_dim (Llama, Qwen2, Mistral), keep it a whole number of heads: some configs
        # derive head_dim from it; a family whose width differs from its attention width (Gemma) sets head_dim itself
        if s.hidden_size == s.num_heads * s.head_dim and self.hidden % s.head_dim:
            raise DraftwiseError(f"shape hidden={self.hidden} is not a multiple of head_dim {s.head_dim}")
        if self.heads % self.kv_heads:
            raise DraftwiseError(f"shape kv_heads={self.kv_heads} does not divide heads={self.heads}")
        group, target_group = self.heads // self.kv_heads, s.num_heads // s.num_kv_heads
        if group > target_group:
            raise DraftwiseError(
                f"shape has {group} query heads per KV head; the target's groups have only {target_group}"
            )


@dataclass(frozen=True)
class Kept:
    """Indices kept in each dimension (per kept layer for heads, KV heads and FFN channels), in the target's
    numbering."""

    layers: list[int]
    hidden: list[int]
    heads: list[list[int]]  # per kept layer: query heads
    kv_heads: list[list[int]]  # per kept layer: KV heads
    ffn: list[list[int]]  # per kept layer: FFN channels

    def as_dict(self) -> dict:
        return self.__dict__.copy()


def _top(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the k highest scores, in ascending index order (ties broken by lower index: deterministic)."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    return sorted(order[:k])


def select(
    shape: PruneShape,
    config,
    layer_scores: torch.Tensor | list[int],
    head: torch.Tensor,
    intermediate: torch.Tensor,
    hidden: torch.Tensor,
) -> Kept:
    """Keep the best units: `layer_scores` ([L] scores, or the kept layers already chosen), head [L, H],
    intermediate [L, F] and hidden [D] scores in the target's numbering."""
    s = Shape.of(config)
    layers = layer_scores if isinstance(layer_scores, list) else _top(layer_scores, shape.layers)
    group, new_group = s.num_heads // s.num_kv_heads, shape.heads // shape.kv_heads
    heads, kv_heads = [], []
    for l in layers:
        by_group = head[l].view(s.num_kv_heads, group)  # query heads h = g * group + j serve KV head g
        groups = _top(by_group.sum(-1), shape.kv_heads)
        kv_heads.append(groups)
        heads.append([g * group + j for g in groups for j in _top(by_group[g], new_group)])
    return Kept(
        layers=list(layers),
        hidden=_top(hidden, shape.hidden),
        heads=heads,
        kv_heads=kv_heads,
        ffn=[_top(intermediate[l], shape.ffn) for l in layers],
    )


def masks_of(kept: Kept, config):
    """The 0/1 masks that describe `kept` (a KV head is dropped exactly when all its query heads are)."""
    from .masks import Masks

    m = Masks.ones(config)
    m.layer.zero_()[kept.layers] = 1
    m.hidden.zero_()[kept.hidden] = 1
    m.head.zero_()
    m.intermediate.zero_()
    for l, hs, fs in zip(kept.layers, kept.heads, kept.ffn):
        m.head[l, hs] = 1
        m.intermediate[l, fs] = 1
    return m


def slice_checkpoint(config, state_dict: dict[str, torch.Tensor], kept: Kept):
    """(config, weights) of the sliced model: a standard checkpoint of the target's family with the kept units.

    Families that scale embeddings by √d (Gemma) would scale a narrower model's by √d' instead: its embedding
    rows are rescaled by √(d/d') to stay exact, which unties them from the LM head (the head keeps the plain rows)."""
    s = Shape.of(config)
    hd, H, KV, F = s.head_dim, s.num_heads, s.num_kv_heads, config.intermediate_size
    hid = torch.tensor(kept.hidden)
    embed = state_dict["model.embed_tokens.weight"][:, hid]
    out = {
        "model.embed_tokens.weight": embed.clone(),
        "model.norm.weight": state_dict["model.norm.weight"][hid].clone(),
    }
    untie = FAMILIES[config.model_type].embed_scale and len(kept.hidden) < s.hidden_size and config.tie_word_embeddings
    if untie:
        out["lm_head.weight"] = embed.clone()
        out["model.embed_tokens.weight"] = embed * (s.hidden_size / len(kept.hidden)) ** 0.5
    elif not config.tie_word_embeddings:
        out["lm_head.weight"] = state_dict["lm_head.weight"][:, hid].clone()

    def rows(heads: list[int]) -> torch.Tensor:
        return torch.tensor([h * hd + i for h in heads for i in range(hd)])

    for new, (l, hs, kvs, fs) in enumerate(zip(kept.layers, kept.heads, kept.kv_heads, kept.ffn)):
        p, q = f"model.layers.{l}.", f"model.layers.{new}."
        qr, kvr, ff = rows(hs), rows(kvs), torch.tensor(fs)
        cut = {
            "self_attn.q_proj.weight": lambda w: w[qr][:, hid],
            "self_attn.q_proj.bias": lambda b: b[qr],
            "self_attn.k_proj.weight": lambda w: w[kvr][:, hid],
            "self_attn.k_proj.bias": lambda b: b[kvr],
            "self_attn.v_proj.weight": lambda w: w[kvr][:, hid],
            "self_attn.v_proj.bias": lambda b: b[kvr],
            "self_attn.o_proj.weight": lambda w: w[hid][:, qr],
            "self_attn.o_proj.bias": lambda b: b[hid],
            "mlp.gate_proj.weight": lambda w: w[ff][:, hid],
            "mlp.gate_proj.bias": lambda b: b[ff],
            "mlp.up_proj.weight": lambda w: w[ff][:, hid],
            "mlp.up_proj.bias": lambda b: b[ff],
            "mlp.down_proj.weight": lambda w: w[hid][:, ff],
            "mlp.down_proj.bias": lambda b: b[hid],
            "input_layernorm.weight": lambda w: w[hid],
            "post_attention_layernorm.weight": lambda w: w[hid],
            "pre_feedforward_layernorm.weight": lambda w: w[hid],
            "post_feedforward_layernorm.weight": lambda w: w[hid],
            "self_attn.q_norm.weight": lambda w: w,
            "self_attn.k_norm.weight": lambda w: w,  # per head_dim: shared by heads
            # Phi-3's fused matrices: q, k, v rows stacked; gate then up rows
            "self_attn.qkv_proj.weight": lambda w: w[torch.cat([qr, H * hd + kvr, (H + KV) * hd + kvr])][:, hid],
            "mlp.gate_up_proj.weight": lambda w: w[torch.cat([ff, F + ff])][:, hid],
        }
        for name, fn in cut.items():
            if p + name in state_dict:
                out[q + name] = fn(state_dict[p + name]).clone()
    new_config = config.__class__.from_dict(config.to_dict())
    new_config.update(
        dict(
            num_hidden_layers=len(kept.layers),
            hidden_size=len(kept.hidden),
            num_attention_heads=len(kept.heads[0]),
            num_key_value_heads=len(kept.kv_heads[0]),
            intermediate_size=len(kept.ffn[0]),
            head_dim=hd,
        )
    )
    if untie:
        new_config.tie_word_embeddings = False
    if getattr(new_config, "layer_types", None):  # kept layers keep their local/global attention
        new_config.layer_types = [config.layer_types[l] for l in kept.layers]
    return new_config, out
