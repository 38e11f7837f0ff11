"""Decoder shapes as the cost model sees them: a decoder's dimensions (any lean-path family), its parameter counts,
weight and KV-cache bytes, the shape of a given depth at a parameter budget, and the batch that fits in memory.
Separate from `cost` (which re-exports these names): this is sizing alone, no timings and no acceptance.

Parameter counts (the convention used in every draftwise table): `embedding` = vocabulary × width (the input table);
`head` = the output projection, 0 when tied (a tied head is counted once, in `embedding`); `non_embedding` = every
other weight (attention, MLP, norms); `total` = embedding + head + non_embedding.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import DraftwiseError


@dataclass(frozen=True)
class Shape:
    """A decoder's dimensions (any lean-path family): what decides its parameters, bytes and KV cache."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool = True
    norms: int = 2  # RMSNorms over the width per layer (Gemma 2/3: four)
    qk_norm: bool = False  # a norm over each q and k head (Qwen3, Gemma 3)

    @classmethod
    def of(cls, config) -> Shape:
        from .targets.family import FAMILIES, Family

        family = FAMILIES.get(config.model_type, Family())
        heads = config.num_attention_heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            ffn=config.intermediate_size,
            vocab=config.vocab_size,
            tied=bool(config.tie_word_embeddings),
            norms=4 if family.sandwich_norms else 2,
            qk_norm=family.qk_norm,
        )

    def layer_params(self) -> int:
        """One decoder layer (no biases): q, k, v, o, gate, up, down and its norms."""
        d, hd = self.hidden, self.head_dim
        attention = d * self.heads * hd + 2 * d * self.kv_heads * hd + self.heads * hd * d
        return attention + 3 * d * self.ffn + self.norms * d + (2 * hd if self.qk_norm else 0)

    def params(self) -> dict[str, int]:
        embedding = self.vocab * self.hidden
        head = 0 if self.tied else self.vocab * self.hidden
        non_embedding = self.layers * self.layer_params() + self.hidden  # + the final norm
        return {
            "total": embedding + head + non_embedding,
            "embedding": embedding,
            "head": head,
            "non_embedding": non_embedding,
        }

    def kv_bytes(self, context: int, batch: int = 1, bytes_per_value: int = 4) -> int:
        """Keys and values of `context` positions for `batch` sequences."""
        return 2 * self.layers * self.kv_heads * self.head_dim * context * batch * bytes_per_value

    def weight_bytes(self, bytes_per_value: int = 4) -> int:
        return self.params()["total"] * bytes_per_value

    def describe(self) -> str:
        return f"L{self.layers} d{self.hidden} h{self.heads}/{self.kv_heads} ffn{self.ffn} V{self.vocab}"


def shape_for_budget(template: Shape, layers: int, budget: int, multiple: int = 8) -> Shape:
    """A `layers`-deep shape with about `budget` non-embedding parameters. Width, heads and FFN scale together
    (the template's head_dim and GQA ratio kept, FFN at its ratio to width) to the nearest width the head layout
    allows; widths come in steps of head_dim × group (192 for SmolLM2), too coarse for equal budgets, so the FFN
    size (a multiple of `multiple`) then absorbs the remainder."""
    if layers < 1:
        raise DraftwiseError(f"layers must be >= 1, got {layers}")
    group = template.heads // template.kv_heads
    ratio = template.ffn / template.hidden

    def make(kv_heads: int) -> Shape:
        heads = kv_heads * group
        hidden = template.hidden * heads // template.heads  # heads × head_dim where the width is that (not Gemma's)
        ffn = max(multiple, int(round(ratio * hidden / multiple)) * multiple)
        return Shape(
            layers,
            hidden,
            heads,
            kv_heads,
            template.head_dim,
            ffn,
            template.vocab,
            template.tied,
            template.norms,
            template.qk_norm,
        )

    smallest = replace(make(1), ffn=multiple)  # the FFN absorbs the remainder, down to `multiple` channels
    if smallest.params()["non_embedding"] > budget:
        raise DraftwiseError(
            f"budget {budget:,} is smaller than {layers} layer(s) of the narrowest shape "
            f"({smallest.describe()}: {smallest.params()['non_embedding']:,} non-embedding parameters)"
        )
    kv = 1
    while make(kv + 1).params()["non_embedding"] <= budget:
        kv += 1
    below, above = make(kv), make(kv + 1)
    nb, na = below.params()["non_embedding"], above.params()["non_embedding"]
    shape = below if budget - nb <= na - budget else above
    d = shape.hidden
    fixed = shape.params()["non_embedding"] - layers * 3 * d * shape.ffn  # everything but the FFN weights
    ffn = max(multiple, int(round((budget - fixed) / (layers * 3 * d) / multiple)) * multiple)
    return Shape(
        layers, d, shape.heads, shape.kv_heads, shape.head_dim, ffn, shape.vocab, shape.tied, shape.norms, shape.qk_norm
    )


def max_batch(
    memory: int, target: Shape, drafter: Shape, context: int, bytes_per_value: int = 4, weights: int | None = None
) -> int:
    """Largest batch whose KV caches (target + drafter, `context` positions each, `bytes_per_value` a value) fit
    beside both models' weights: `weights` bytes where they were measured as loaded, else their shapes' at
    `bytes_per_value`."""
    if weights is None:
        weights = target.weight_bytes(bytes_per_value) + drafter.weight_bytes(bytes_per_value)
    free = memory - weights
    per_seq = target.kv_bytes(context, 1, bytes_per_value) + drafter.kv_bytes(context, 1, bytes_per_value)
    return max(0, free // per_seq)
