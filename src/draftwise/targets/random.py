"""Random-weight models (Llama by default, or a target's family): shapes whose trained weights are not at hand (a
LLaMA-7B-shaped target on a GPU machine with no model files), for what depends on the shape alone — step latency, and
SD's system cost under `bench --synthetic-alpha`.

Spec: `random:` followed by `key=value` pairs over layers, hidden, heads, kv_heads, head_dim, ffn, vocab and seed.
A target's left-out keys take LLaMA-7B's (32 layers, d=4096, 32 heads, FFN 11008, vocabulary 32000); a drafter's
take its target's, so `random:layers=5` is a 5-layer drafter at the target's width. Text is encoded byte by byte
(ids 3..258, folded into the vocabulary): there is no tokenizer, and none is needed to measure cost.
"""

from __future__ import annotations

import torch

from ..errors import DraftwiseError
from .family import FAMILIES

PREFIX = "random:"
LLAMA_7B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008, "vocab": 32000, "tied": False}
KEYS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab", "seed")


class ByteTokenizer:
    """Stands in for a tokenizer: UTF-8 bytes as ids (no chat template, no EOS)."""

    chat_template = None
    eos_token_id = None

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __call__(self, text: str) -> dict:
        return {"input_ids": [3 + (b % max(1, self.vocab_size - 3)) for b in text.encode()]}

    def get_vocab(self) -> dict[str, int]:
        return {f"<byte {i}>": i for i in range(self.vocab_size)}


def parse(spec: str, base: dict | None = None) -> dict:
    """`random:layers=5,hidden=2048` -> the full shape (left-out keys from `base`, else LLaMA-7B)."""
    shape = dict(base or LLAMA_7B)
    shape.setdefault("seed", 0)
    body = spec[len(PREFIX) :]
    for part in filter(None, (p.strip() for p in body.split(","))):
        key, _, value = part.partition("=")
        if key not in KEYS or not value.isdigit():
            raise DraftwiseError(f"bad random model spec {spec!r}: expected key=integer pairs over {', '.join(KEYS)}")
        shape[key] = int(value)
    if "head_dim" not in body:
        shape["head_dim"] = shape["hidden"] // shape["heads"]
    if min(shape[k] for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "ffn", "vocab")) < 1:
        raise DraftwiseError(f"bad random model spec {spec!r}: every dimension must be >= 1")
    if shape["heads"] % shape["kv_heads"]:
        raise DraftwiseError(f"bad random model spec {spec!r}: heads ({shape['heads']}) must be a multiple of kv_heads")
    return shape


def shape_of(config) -> dict:
    heads = config.num_attention_heads
    return {
        "layers": config.num_hidden_layers,
        "hidden": config.hidden_size,
        "heads": heads,
        "kv_heads": config.num_key_value_heads,
        "head_dim": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "ffn": config.intermediate_size,
        "vocab": config.vocab_size,
        "tied": bool(config.tie_word_embeddings),
    }


def llama_config(shape: dict, template=None):
    """A transformers config of `shape`: a LlamaConfig, or `template`'s class and other settings when given (so a
    shape swept for a Gemma target is a Gemma model; its local/global layer pattern repeats over the new depth)."""
    from transformers import LlamaConfig

    config = template.__class__.from_dict(template.to_dict()) if template is not None else LlamaConfig()
    config.update(
        dict(
            num_hidden_layers=shape["layers"],
            hidden_size=shape["hidden"],
            num_attention_heads=shape["heads"],
            num_key_value_heads=shape["kv_heads"],
            head_dim=shape["head_dim"],
            intermediate_size=shape["ffn"],
            vocab_size=shape["vocab"],
            tie_word_embeddings=shape.get("tied", False),
        )
    )
    if getattr(template, "layer_types", None):
        config.layer_types = [template.layer_types[i % len(template.layer_types)] for i in range(shape["layers"])]
    if template is None:
        config.eos_token_id = None  # random weights: a generation runs to its length
    return config


def random_state_dict(config, dtype: torch.dtype, device: str, seed: int = 0) -> dict[str, torch.Tensor]:
    """Hugging Face-named weights of `config`'s shape and family: N(0, 0.02²) matrices and unit norms, drawn on
    `device` itself (a 7B model is never materialised on the host). A tied head is left out, as checkpoints leave it."""
    gen = torch.Generator(device=device).manual_seed(seed)
    family = FAMILIES[config.model_type]
    d, hd, f, v = config.hidden_size, config.head_dim, config.intermediate_size, config.vocab_size
    heads, kv = config.num_attention_heads, config.num_key_value_heads

    def w(*size):
        return 0.02 * torch.randn(*size, generator=gen, device=device, dtype=dtype)

    def norm(n):  # a unit scale, stored as the family stores it (Gemma: scale - 1)
        return torch.full((n,), 1.0 - family.norm_offset, device=device, dtype=dtype)

    sd = {"model.embed_tokens.weight": w(v, d), "model.norm.weight": norm(d)}
    if not config.tie_word_embeddings:
        sd["lm_head.weight"] = w(v, d)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        if family.fused_weights:
            sd.update(
                {
                    p + "self_attn.qkv_proj.weight": w((heads + 2 * kv) * hd, d),
                    p + "mlp.gate_up_proj.weight": w(2 * f, d),
                }
            )
        else:
            sd.update(
                {
                    p + "self_attn.q_proj.weight": w(heads * hd, d),
                    p + "self_attn.k_proj.weight": w(kv * hd, d),
                    p + "self_attn.v_proj.weight": w(kv * hd, d),
                    p + "mlp.gate_proj.weight": w(f, d),
                    p + "mlp.up_proj.weight": w(f, d),
                }
            )
        sd.update(
            {
                p + "self_attn.o_proj.weight": w(d, heads * hd),
                p + "mlp.down_proj.weight": w(d, f),
                p + "input_layernorm.weight": norm(d),
                p + "post_attention_layernorm.weight": norm(d),
            }
        )
        if family.sandwich_norms:
            sd.update(
                {p + "pre_feedforward_layernorm.weight": norm(d), p + "post_feedforward_layernorm.weight": norm(d)}
            )
        if family.qk_norm:
            sd.update({p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd)})
    return sd
