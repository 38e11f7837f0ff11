"""The lean forward for the Llama family (Llama, Mistral, Qwen2, SmolLM): RMSNorm, RoPE (and its static scaling
variants), grouped-query attention, SwiGLU, tied or untied head — loading the same Hugging Face weights.

Why not the transformers model: at batch 1 on a CPU a decoding step is a few hundred small ops whose overhead,
and BLAS paths that are slow for a few rows, dominate. Here a layer is ~25 ops, q/k/v and gate/up are fused into one
matmul each, and the KV cache is preallocated and indexed by absolute position (the gpt-fast design): rolling back
rejected draft tokens costs nothing, the next forward simply writes over them.

Internal layout (invisible outside): the rows of q_proj and k_proj are permuted within each head so that the two
halves HF's `rotate_half` pairs (i, i + head_dim/2) become adjacent, and RoPE is one complex multiplication. Attention
scores are unchanged (q and k get the same permutation; v is untouched).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import kernels
from .kernels import linear, rms_norm, silu_mul

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def unsupported_reason(config) -> str | None:
    """Why the lean path cannot run this config exactly (None: it can). The caller falls back to transformers."""
    if config.model_type not in SUPPORTED_TYPES:
        return f"model_type {config.model_type!r} is not one of {SUPPORTED_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r} (lean path implements SwiGLU with silu)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default"}
    if rope.get("rope_type", "default") not in STATIC_ROPE_TYPES:
        return f"rope_type {rope.get('rope_type')!r} depends on sequence length"
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings:
        return f"sliding-window attention (window {window})"
    return None


@dataclass(frozen=True)
class Shape:
    """The dimensions the forward needs, read once from a transformers config."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float

    @classmethod
    def of(cls, config) -> "Shape":
        heads = config.num_attention_heads
        return cls(
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            num_layers=config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            rms_eps=config.rms_norm_eps,
        )


def rope_table(config, shape: Shape, max_len: int) -> torch.Tensor:
    """Complex rotations [max_len, head_dim/2], including the variant's attention scaling (HF scales cos and sin)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = getattr(config, "rope_parameters", None) or {"rope_type": "default", "rope_theta": 10000.0}
    kind = rope.get("rope_type", "default")
    if kind == "default":
        inv_freq = 1.0 / (rope["rope_theta"] ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float) / shape.head_dim))
        scale = 1.0
    else:
        inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    angles = torch.outer(torch.arange(max_len, dtype=torch.float), inv_freq.float())  # [S, hd/2]
    return torch.polar(torch.full_like(angles, float(scale)), angles)


def _pair_halves(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Reorder rows [h0..h_{d/2-1}, h_{d/2}..h_{d-1}] of each head to [h0, h_{d/2}, h1, h_{d/2+1}, ...]."""
    rest = w.shape[1:]
    return w.reshape(n_heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(n_heads * head_dim, *rest)


class Layer(nn.Module):
    """One decoder block with fused projections; holds weights only (the cache lives in the model)."""

    def __init__(self, sd: dict[str, torch.Tensor], prefix: str, shape: Shape):
        super().__init__()
        H, KV, hd = shape.num_heads, shape.num_kv_heads, shape.head_dim

        def get(name):
            return sd.get(prefix + name)

        q, k, v = get("self_attn.q_proj.weight"), get("self_attn.k_proj.weight"), get("self_attn.v_proj.weight")
        qb, kb, vb = get("self_attn.q_proj.bias"), get("self_attn.k_proj.bias"), get("self_attn.v_proj.bias")
        gate_b, up_b = get("mlp.gate_proj.bias"), get("mlp.up_proj.bias")
        tensors = {
            "wqkv": torch.cat([_pair_halves(q, H, hd), _pair_halves(k, KV, hd), v]),
            "bqkv": None if qb is None else torch.cat([_pair_halves(qb, H, hd), _pair_halves(kb, KV, hd), vb]),
            "wo": get("self_attn.o_proj.weight"),
            "bo": get("self_attn.o_proj.bias"),
            "wgu": torch.cat([get("mlp.gate_proj.weight"), get("mlp.up_proj.weight")]),
            "bgu": None if gate_b is None else torch.cat([gate_b, up_b]),
            "wd": get("mlp.down_proj.weight"),
            "bd": get("mlp.down_proj.bias"),
            "ln1": get("input_layernorm.weight"),
            "ln2": get("post_attention_layernorm.weight"),
        }
        for name, t in tensors.items():
            self.register_buffer(name, None if t is None else t.contiguous(), persistent=False)
        self.shape = shape

    def forward(self, x, rot, k_cache, v_cache, pos: int, mask, start: list[int] | None, positions=None):
        # x [B, T, D]; rot [S, hd/2] complex; k_cache, v_cache [B, KV, S, hd]; mask [B or 1, 1, T, pos+T] bool or None;
        # positions [B, T]: each row's own RoPE positions when cache slots and positions differ (batched SD)
        s = self.shape
        T = x.shape[1]
        qkv = linear(rms_norm(x, self.ln1, s.rms_eps), self.wqkv, self.bqkv)  # [B, T, (H+2KV)*hd]
        if positions is not None:
            att = self.attention(qkv, rot[positions][:, :, None, :], k_cache, v_cache, pos, mask)
        elif kernels.fast_path(qkv) and T <= kernels.MAX_ROWS and s.head_dim % 8 == 0:
            att = kernels.attention(qkv, rot, k_cache, v_cache, pos, s.num_heads, s.head_dim, start)
        else:
            att = self.attention(qkv, rot[pos : pos + T, None, :], k_cache, v_cache, pos, mask)
        x = x + linear(att, self.wo, self.bo)  # att [B, T, H*hd]
        gu = linear(rms_norm(x, self.ln2, s.rms_eps), self.wgu, self.bgu)  # [B, T, 2F]
        return x + linear(silu_mul(gu), self.wd, self.bd)

    def attention(self, qkv, rot, k_cache, v_cache, pos: int, mask):
        """Torch attention: RoPE on q and k, cache write, SDPA. rot [T or B×T, 1, hd/2] -> [B, T, H*hd]."""
        B, T, _ = qkv.shape
        H, KV, hd = self.shape.num_heads, self.shape.num_kv_heads, self.shape.head_dim
        qkv = qkv.view(B, T, H + 2 * KV, hd)
        qk = torch.view_as_complex(qkv[:, :, : H + KV].float().unflatten(-1, (hd // 2, 2)))  # [B, T, H+KV, hd/2]
        qk = torch.view_as_real(qk * rot).flatten(-2).to(qkv.dtype)  # [B, T, H+KV, hd]
        end = pos + T
        k_cache[:, :, pos:end] = qk[:, :, H:].transpose(1, 2)
        v_cache[:, :, pos:end] = qkv[:, :, H + KV :].transpose(1, 2)
        att = F.scaled_dot_product_attention(
            qk[:, :, :H].transpose(1, 2), k_cache[:, :, :end], v_cache[:, :, :end], attn_mask=mask, enable_gqa=KV != H
        )  # [B, H, T, hd]
        return att.transpose(1, 2).reshape(B, T, H * hd)


class LeanLlama(nn.Module):
    """A causal LM with a preallocated KV cache: `reset(batch, max_len)`, then `forward(ids, pos)` calls.

    `forward(ids [B, T], pos)` writes the keys/values of positions pos..pos+T-1, attends to positions < pos+T and
    returns logits of the last `n_logits` positions (all T when None). Calling it with a smaller `pos` than before
    discards everything from `pos` on: that is the whole rollback.
    """

    def __init__(self, config, state_dict: dict[str, torch.Tensor], layers: list[Layer] | None = None, compile: bool = False):
        super().__init__()
        reason = unsupported_reason(config)
        if reason:
            raise ValueError(f"lean path cannot run this model: {reason}")
        self.config = config
        self.shape = Shape.of(config)
        sd = state_dict
        self.register_buffer("embed", sd["model.embed_tokens.weight"], persistent=False)
        self.register_buffer("norm", sd["model.norm.weight"], persistent=False)
        head = sd["model.embed_tokens.weight"] if config.tie_word_embeddings else sd["lm_head.weight"]
        self.register_buffer("head", head.contiguous(), persistent=False)
        self.layers = nn.ModuleList(
            layers if layers is not None else [Layer(sd, f"model.layers.{i}.", self.shape) for i in range(self.shape.num_layers)]
        )
        self.vocab_size = self.head.shape[0]
        if compile:  # fuses each layer's elementwise ops (a win where op launches dominate, e.g. a GPU at batch 1)
            for layer in self.layers:
                layer.compile(dynamic=True)
        self._rot = rope_table(config, self.shape, 0)
        self.k_cache = self.v_cache = None

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def rotations(self, n: int) -> torch.Tensor:
        """The RoPE table [≥ n, hd/2] (complex), grown when needed."""
        if n > self._rot.shape[0]:
            self._rot = rope_table(self.config, self.shape, max(n, 2 * self._rot.shape[0])).to(self.device)
        return self._rot

    def reset(self, batch_size: int, max_len: int) -> None:
        """Make room for `max_len` positions of `batch_size` sequences (reuses the buffers when they fit)."""
        s = self.shape
        self.rotations(max_len)
        want = (len(self.layers), batch_size, s.num_kv_heads, max_len, s.head_dim)
        have = None if self.k_cache is None else self.k_cache.shape
        if have is None or have[1] != batch_size or have[3] < max_len:
            self.k_cache = torch.zeros(want, dtype=self.dtype, device=self.device)  # [L, B, KV, S, hd]
            self.v_cache = torch.zeros(want, dtype=self.dtype, device=self.device)

    @property
    def max_len(self) -> int:
        return 0 if self.k_cache is None else self.k_cache.shape[3]

    def kv_bytes(self) -> int:
        return 0 if self.k_cache is None else 2 * self.k_cache.numel() * self.k_cache.element_size()

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, pos: int, n_logits: int | None = None, start: list[int] | None = None,
                positions: torch.Tensor | None = None, key_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`start[b]`: the first real position of row b, for batches of left-padded prompts (keys before it are
        ignored; RoPE is relative, so a row's absolute offset does not matter).

        Batched SD (`sd.rows`) decouples cache slots from positions: `pos` is then the first slot written, for every
        row alike; `positions` [B, T] the RoPE position of each token in its own row; `key_mask` [B, S] which slots
        hold a real token of the row (keys are cached already rotated, so slots a row leaves unused cost nothing but
        masked attention)."""
        B, T = ids.shape
        if self.k_cache is None or self.k_cache.shape[1] != B or pos + T > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions for batch {self.k_cache.shape[1] if self.k_cache is not None else 0}; "
                             f"need {pos + T} for batch {B}: call reset() first")
        x = F.embedding(ids, self.embed)  # [B, T, D]
        mask = None
        if T > 1 or start is not None or key_mask is not None:
            # query i (slot pos+i) of row b sees the row's keys up to its own slot — those from start[b] on, or those
            # key_mask marks real — and always itself (so a padding query stays finite)
            keys = torch.arange(pos + T, device=ids.device)
            queries = torch.arange(pos, pos + T, device=ids.device)[:, None]
            mask = (keys <= queries)[None]  # [1, T, pos+T]
            if key_mask is not None:
                mask = (mask & key_mask[:, None, : pos + T]) | (keys == queries)  # [B, T, pos+T]
            elif start is not None:
                first = torch.tensor(start, device=ids.device)[:, None, None]  # [B, 1, 1]
                mask = (mask & (keys >= first)) | (keys == queries)  # [B, T, pos+T]
            mask = mask[:, None]  # [B or 1, 1, T, pos+T]
        if positions is not None:
            self.rotations(int(positions.max()) + 1)
        for i, layer in enumerate(self.layers):
            x = layer(x, self._rot, self.k_cache[i], self.v_cache[i], pos, mask, start, positions)
        if n_logits == 0:  # prefill that only fills the cache
            return x.new_empty(B, 0, self.vocab_size)
        if n_logits is not None:
            x = x[:, -n_logits:]
        return self.logits(x)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and LM head: hidden states [B, T, D] -> logits [B, T, V]."""
        return linear(rms_norm(x, self.norm, self.shape.rms_eps), self.head)

    def subset(self, layer_ids: list[int], config) -> "LeanLlama":
        """A model made of some of these layers (renumbered 0..k-1), sharing all weights with this one."""
        sd = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm, "lm_head.weight": self.head}
        return LeanLlama(config, sd, layers=[self.layers[i] for i in layer_ids])
