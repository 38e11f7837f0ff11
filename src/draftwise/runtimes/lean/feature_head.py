"""A feature-level drafter (EAGLE-style): a small head that reads the target's own feature and proposes the next
tokens, so a draft step costs a few matrix-vector products instead of a drafter model's forward.

One step: the target's feature f_t at position t (the final-normed last hidden state its LM head reads) and the
embedding of the token x_{t+1} go in; the logits of x_{t+2} over a draft vocabulary and the head's estimate of
f_{t+1} come out. The estimate feeds the next step, with the drafted token's embedding, so γ steps need no target.

    x = [rmsnorm(f) ; rmsnorm(embed(x_{t+1}))]          [2D]   (the two halves live on very different scales)
    h = fc(x)                                             [D]
    h = h + down(silu(gate(rmsnorm(h))) * up(rmsnorm(h)))   × blocks (Llama's MLP block)
    \\hat f_{t+1} = rmsnorm(h)                            [D]
    logits = head(\\hat f_{t+1})                          [N]    head = the target's LM head rows d2t

Attention-free on purpose: the target's feature already summarises the whole context, and the head only has to map
it one or a few tokens ahead. EAGLE proper adds one attention layer over the drafter's own history (docs/feature.md
maps the parts). The embedding and the head rows are the target's, read at load time and frozen: a checkpoint holds
the trained weights, `d2t` (draft index -> target id, EAGLE-3's name; here the ids themselves, not offsets), a
config and the target tokenizer's fingerprint, so it never carries a copy of the target's 49k-row matrices.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ...errors import DraftwiseError
from .forward import LeanLM
from .int8 import Int8Weight
from .kernels import linear, rms_norm, silu_mul

FORMAT = "draftwise-feature-head"
WEIGHTS = "feature_head.safetensors"
ENGINES = "the lean engine (fp32, bf16, int8)"  # the only one that exposes the target's hidden states


@dataclass(frozen=True)
class FeatureHeadConfig:
    hidden: int  # D: the target's hidden size
    ffn: int  # each block's MLP width
    blocks: int  # MLP blocks after fc
    draft_vocab: int  # N: rows of the head (len(d2t))
    vocab_size: int  # the target's vocabulary (d2t's range)
    rms_eps: float = 1e-6


def require_lean(target) -> LeanLM:
    """The target's lean forward, or a one-line refusal naming the engines that can serve a feature drafter."""
    if not isinstance(target.lm, LeanLM):
        raise DraftwiseError(
            f"a feature drafter reads the target's hidden states, which only {ENGINES} exposes; the "
            f"{target.backend} engine cannot serve one (transformers' fallback and llama.cpp return logits only)"
        )
    return target.lm


def draft_vocab(rows: list[dict], n: int) -> torch.Tensor:
    """d2t [≤ n]: the n target ids the teacher data's target emits most (its top-k probabilities summed over every
    scored position — what the target would make a drafter propose), sorted ascending; every id the data gives any
    mass when fewer than n do."""
    if n < 1:
        raise DraftwiseError(f"draft vocabulary size must be >= 1, got {n}")
    mass: dict[int, float] = {}
    for row in rows:
        ids, probs = row["topk_ids"].reshape(-1), row["topk_probs"].reshape(-1).double()
        uniq, inverse = torch.unique(ids, return_inverse=True)
        summed = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse, probs)
        for i, m in zip(uniq.tolist(), summed.tolist()):
            mass[i] = mass.get(i, 0.0) + m
    ranked = sorted((i for i in mass if mass[i] > 0), key=lambda i: (-mass[i], i))  # ties: the smaller id first
    if not ranked:
        raise DraftwiseError("the teacher data gives no token any mass: no draft vocabulary to choose")
    return torch.tensor(sorted(ranked[:n]), dtype=torch.long)


class Block(nn.Module):
    """Llama's MLP block with its pre-norm and residual: h + down(silu(gate(n)) * up(n)), n = rmsnorm(h)."""

    def __init__(self, hidden: int, ffn: int, eps: float):
        super().__init__()
        self.norm = nn.Parameter(torch.ones(hidden))
        self.wgu = nn.Parameter(torch.empty(2 * ffn, hidden))  # gate and up fused: one matmul
        self.wd = nn.Parameter(torch.empty(hidden, ffn))
        self.eps = eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + linear(silu_mul(linear(rms_norm(h, self.norm, self.eps), self.wgu)), self.wd)


class FeatureHead(nn.Module):
    """The trained part (fc, blocks, norms) and `d2t`; `attach(lm)` lends it the target's embedding and head rows."""

    def __init__(self, config: FeatureHeadConfig, d2t: torch.Tensor, seed: int = 0):
        super().__init__()
        D, eps = config.hidden, config.rms_eps
        self.config = config
        self.norm_f = nn.Parameter(torch.ones(D))  # EAGLE-3's hidden_norm
        self.norm_e = nn.Parameter(torch.ones(D))  # EAGLE-3's input_layernorm
        self.fc = nn.Parameter(torch.empty(D, 2 * D))
        self.blocks = nn.ModuleList(Block(D, config.ffn, eps) for _ in range(config.blocks))
        self.norm = nn.Parameter(torch.ones(D))
        self.register_buffer("d2t", d2t.to(torch.long).clone())
        self.embedding: torch.Tensor | None = None  # the target's, frozen and not ours to save (`attach`)
        self.embed_scale = None
        self.head: torch.Tensor | None = None  # [N, D] fp32: the target's LM head rows d2t
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            nn.init.normal_(self.fc, 0.0, (2 * D) ** -0.5, generator=gen)  # unit-scale h from unit-scale halves
            for b in self.blocks:
                nn.init.normal_(b.wgu, 0.0, D**-0.5, generator=gen)
                nn.init.normal_(b.wd, 0.0, 0.1 * config.ffn**-0.5, generator=gen)  # blocks start near identity

    def attach(self, lm: LeanLM) -> FeatureHead:
        """Take the target's embedding (by reference) and its head rows `d2t` (a dequantized copy at int8), and the
        final norm's scale as the starting point of ours (a fresh head then reads features on the target's scale)."""
        self.embedding, self.embed_scale = lm.embed, lm.embed_scale
        head = lm.head.dequantize() if isinstance(lm.head, Int8Weight) else lm.head
        self.head = head[self.d2t.to(head.device)].float().contiguous()
        return self.to(lm.device)

    def init_norm_from(self, lm: LeanLM) -> None:
        with torch.no_grad():
            self.norm.copy_(lm.norm.float())

    def forward(self, features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """features [N, D] (the target's, or this head's previous estimate) and tokens [N] (the token each feature's
        position predicted) -> (logits [N, draft vocab] of the token after, the next feature [N, D])."""
        eps = self.config.rms_eps
        e = nn.functional.embedding(tokens, self.embedding).float()
        if self.embed_scale is not None:
            e = e * self.embed_scale
        x = torch.cat([rms_norm(features.float(), self.norm_f, eps), rms_norm(e, self.norm_e, eps)], -1)  # [N, 2D]
        h = linear(x, self.fc)  # [N, D]
        for block in self.blocks:
            h = block(h)
        feature = rms_norm(h, self.norm, eps)
        return linear(feature, self.head), feature

    def parameter_count(self) -> int:
        """Trained parameters (the target's embedding and head rows it borrows are not counted)."""
        return sum(p.numel() for p in self.parameters())

    def save(self, folder: str | Path, fingerprint: str) -> Path:
        """folder/feature_head.safetensors (trained weights and d2t) and folder/config.json (shape, tokenizer)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}
        save_file(tensors, folder / (WEIGHTS + ".tmp"))
        (folder / (WEIGHTS + ".tmp")).replace(folder / WEIGHTS)
        meta = {"format": FORMAT, **asdict(self.config), "tokenizer_fingerprint": fingerprint}
        (folder / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
        return folder


def is_checkpoint(folder: Path) -> bool:
    config = Path(folder) / "config.json"
    return config.is_file() and json.loads(config.read_text()).get("format") == FORMAT


def load(folder: str | Path, target) -> FeatureHead:
    """A saved head attached to `target` (a `models.Model` on the lean engine); refuses, in one line, a head saved for
    another tokenizer or another hidden size."""
    from ...targets.fingerprint import fingerprint

    folder = Path(folder)
    if not is_checkpoint(folder):
        raise DraftwiseError(f"{folder} holds no feature head (config.json of format {FORMAT!r})")
    lm = require_lean(target)
    meta = json.loads((folder / "config.json").read_text())
    if meta["tokenizer_fingerprint"] != fingerprint(target.tokenizer):
        raise DraftwiseError(
            f"feature head {folder} was trained for another tokenizer than {target.name}'s: its token ids "
            "would mean other text"
        )
    config = FeatureHeadConfig(**{k: meta[k] for k in FeatureHeadConfig.__dataclass_fields__})
    if config.hidden != lm.shape.hidden_size or config.vocab_size != lm.vocab_size:
        raise DraftwiseError(
            f"feature head {folder} reads features of size {config.hidden} over {config.vocab_size} tokens; "
            f"the target has {lm.shape.hidden_size} over {lm.vocab_size}"
        )
    state = load_file(folder / WEIGHTS)
    head = FeatureHead(config, state["d2t"])
    head.load_state_dict(state)
    return head.attach(lm).eval()
