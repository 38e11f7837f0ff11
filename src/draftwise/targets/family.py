"""What each architecture changes in the one decoder the lean forward runs (`lean.py`), read from a transformers config.

Llama's decoder is the base: RMSNorm `x·w`, RoPE, grouped-query attention scaled by 1/√hd, SwiGLU, one norm before
attention and one before the MLP. The other families differ by a few switches, not by their own forward:

  family        norm     embeddings  q/k norm  norms around blocks  MLP        attention                 weights
  llama         w        ×1          -         pre                  SwiGLU     1/√hd                     split
  mistral       w        ×1          -         pre                  SwiGLU     1/√hd, sliding window     split
  qwen2         w        ×1          -         pre                  SwiGLU     1/√hd (window if set)     split, qkv bias
  qwen3         w        ×1          RMSNorm   pre                  SwiGLU     1/√hd (window if set)     split
  phi3          w        ×1          -         pre                  SwiGLU     1/√hd (window if set)     fused qkv,
                                                                                                         gate_up
  gemma         1+w      ×√d         -         pre                  GeGLU-tanh 1/√hd                     split
  gemma2        1+w      ×√d         -         pre and post         GeGLU-tanh query_pre_attn_scalar, soft-cap,
                                                                               local/global
  gemma3_text   1+w      ×√d         RMSNorm   pre and post         GeGLU-tanh query_pre_attn_scalar, local/global,
                                                                               per-layer-type RoPE base
Gemma 2 also soft-caps the final logits. Per layer, `layer_types` ("sliding_attention" / "full_attention") says which
layers see only the last `sliding_window` positions (all layers when a config has a window but no layer types).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
GELU_TANH = ("gelu_pytorch_tanh", "gelu_new")  # transformers' names for gelu's tanh approximation


@dataclass(frozen=True)
class Family:
    """The switches one architecture sets over Llama's decoder (see the module table)."""

    norm_offset: float = 0.0  # RMSNorm scales by (offset + w): Gemma stores w around 0
    embed_scale: bool = False  # embeddings × √d
    qk_norm: bool = False  # RMSNorm over each q and k head, before RoPE
    sandwich_norms: bool = False  # a norm after attention and after the MLP too, before each residual add
    activation: str = "silu"  # silu (SwiGLU) | gelu_tanh (GeGLU)
    fused_weights: bool = False  # qkv_proj and gate_up_proj stored as one matrix each

    def norm_scale(self, w: torch.Tensor) -> torch.Tensor:
        """A stored RMSNorm weight as the forward multiplies by it: offset + w (computed in fp32 as transformers
        does)."""
        return w + self.norm_offset if self.norm_offset else w

    def embedding_scale(self, hidden_size: int, dtype: torch.dtype) -> torch.Tensor | None:
        """What embeddings are multiplied by: √d rounded to the weights' dtype as transformers does, or None."""
        return torch.tensor(hidden_size**0.5, dtype=dtype) if self.embed_scale else None


FAMILIES = {
    "llama": Family(),
    "mistral": Family(),
    "qwen2": Family(),
    "qwen3": Family(qk_norm=True),
    "phi3": Family(fused_weights=True),
    "gemma": Family(norm_offset=1.0, embed_scale=True, activation="gelu_tanh"),
    "gemma2": Family(norm_offset=1.0, embed_scale=True, sandwich_norms=True, activation="gelu_tanh"),
    "gemma3_text": Family(norm_offset=1.0, embed_scale=True, sandwich_norms=True, qk_norm=True, activation="gelu_tanh"),
}


def activation_of(config) -> str:
    return getattr(config, "hidden_activation", None) or getattr(config, "hidden_act", None) or "silu"


def rope_parameters(config, layer_type: str | None = None) -> dict:
    """The RoPE settings of one layer type (Gemma 3 keys them by layer type; other configs have one set)."""
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    if layer_type is not None and isinstance(rope.get(layer_type), dict):
        return rope[layer_type]
    return rope


def rope_keys(config) -> list[str | None]:
    """Per layer, the key of its RoPE table: its layer type where RoPE differs by type, else None (one table)."""
    rope = getattr(config, "rope_parameters", None) or {}
    types = getattr(config, "layer_types", None)
    if types and any(isinstance(rope.get(t), dict) for t in set(types)):
        return list(types)
    return [None] * config.num_hidden_layers


def windows(config) -> list[int | None]:
    """Per layer, its sliding window (None: full attention), as transformers' attention modules decide it."""
    window = getattr(config, "sliding_window", None)
    if window is None or getattr(config, "use_sliding_window", True) is False:
        return [None] * config.num_hidden_layers
    types = getattr(config, "layer_types", None)
    if types:
        return [window if t == "sliding_attention" else None for t in types]
    return [window] * config.num_hidden_layers


def unsupported_reason(config) -> str | None:
    """Why the lean path cannot run this config exactly (None: it can). The caller falls back to transformers."""
    family = FAMILIES.get(config.model_type)
    if family is None:
        return f"model_type {config.model_type!r} is not one of {tuple(FAMILIES)}"
    act = activation_of(config)
    if (family.activation == "silu" and act != "silu") or (family.activation == "gelu_tanh" and act not in GELU_TANH):
        return f"activation {act!r} (the lean path implements {config.model_type} with {family.activation})"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    for key in set(rope_keys(config)):
        rope = rope_parameters(config, key)
        if rope.get("rope_type", "default") not in STATIC_ROPE_TYPES:
            return f"rope_type {rope.get('rope_type')!r} depends on sequence length"
        if rope.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None) or 1.0) != 1.0:
            return "partial rotary embeddings (partial_rotary_factor < 1)"
    if getattr(config, "attention_chunk_size", None):
        return "chunked attention"
    return None


@dataclass(frozen=True)
class Shape:
    """The dimensions and per-config settings the forward needs, read once from a transformers config."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    attn_scale: float = 0.0  # scores = attn_scale · q·k (0: 1/√head_dim)
    attn_softcap: float | None = None
    final_softcap: float | None = None

    @classmethod
    def of(cls, config) -> Shape:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        scalar = getattr(config, "query_pre_attn_scalar", None)
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            rms_eps=config.rms_norm_eps,
            attn_scale=(scalar if scalar else head_dim) ** -0.5,
            attn_softcap=getattr(config, "attn_logit_softcapping", None),
            final_softcap=getattr(config, "final_logit_softcapping", None),
        )


def rope_table(config, shape: Shape, max_len: int, layer_type: str | None = None) -> torch.Tensor:
    """Complex rotations [max_len, head_dim/2], including the variant's attention scaling (HF scales cos and sin)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = rope_parameters(config, layer_type)
    kind = rope.get("rope_type", "default")
    if kind == "default":
        inv_freq = 1.0 / (
            rope["rope_theta"] ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float) / shape.head_dim)
        )
        scale = 1.0
    elif layer_type is not None:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu", layer_type=layer_type)
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    angles = torch.outer(torch.arange(max_len, dtype=torch.float), inv_freq.float())  # [S, hd/2]
    return torch.polar(torch.full_like(angles, float(scale)), angles)


def pair_halves(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Reorder rows [h0..h_{d/2-1}, h_{d/2}..h_{d-1}] of each head to [h0, h_{d/2}, h1, h_{d/2+1}, ...]."""
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(n_heads * head_dim, *rest)


def layer_tensors(
    sd: dict[str, torch.Tensor], prefix: str, family: Family, shape: Shape
) -> dict[str, torch.Tensor | None]:
    """One layer's weights in the lean forward's layout: q/k/v and gate/up fused, q and k rows pair-adjacent (see
    `lean.py`), norm weights with the family's offset folded in, names the same for every family:
    wqkv bqkv wo bo wgu bgu wd bd, ln_attn (before attention), ln_attn_out (after it, or None), ln_mlp, ln_mlp_out,
    q_norm, k_norm."""
    H, KV, hd = shape.num_heads, shape.num_kv_heads, shape.head_dim

    def get(name):
        return sd.get(prefix + name)

    def norm(name):
        w = get(name)
        return None if w is None else family.norm_scale(w)

    if family.fused_weights:
        q, k, v = get("self_attn.qkv_proj.weight").split([H * hd, KV * hd, KV * hd])
        gate, up = get("mlp.gate_up_proj.weight").chunk(2)
    else:
        q, k, v = get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight"), get("self_attn.v_proj.weight")
        gate, up = get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")
    qb, kb, vb = get("self_attn.q_proj.bias"), get("self_attn.k_proj.bias"), get("self_attn.v_proj.bias")
    gate_b, up_b = get("mlp.gate_proj.bias"), get("mlp.up_proj.bias")
    q_norm, k_norm = norm("self_attn.q_norm.weight"), norm("self_attn.k_norm.weight")
    sandwich = family.sandwich_norms
    return {
        "wqkv": torch.cat([pair_halves(q, H, hd), pair_halves(k, KV, hd), v]),
        "bqkv": None if qb is None else torch.cat([pair_halves(qb, H, hd), pair_halves(kb, KV, hd), vb]),
        "wo": get("self_attn.o_proj.weight"),
        "bo": get("self_attn.o_proj.bias"),
        "wgu": torch.cat([gate, up]),
        "bgu": None if gate_b is None else torch.cat([gate_b, up_b]),
        "wd": get("mlp.down_proj.weight"),
        "bd": get("mlp.down_proj.bias"),
        "ln_attn": norm("input_layernorm.weight"),
        "ln_attn_out": norm("post_attention_layernorm.weight") if sandwich else None,
        "ln_mlp": norm("pre_feedforward_layernorm.weight" if sandwich else "post_attention_layernorm.weight"),
        "ln_mlp_out": norm("post_feedforward_layernorm.weight") if sandwich else None,
        "q_norm": None if q_norm is None else pair_halves(q_norm, 1, hd),
        "k_norm": None if k_norm is None else pair_halves(k_norm, 1, hd),
    }
