"""`feature:PATH`: a feature-level drafter (EAGLE-style, `runtimes.lean.feature_head`), PATH a `draftwise train-feature`
run folder or its `checkpoint/`. Each draft step reads a feature — the target's own for the first step, the head's
estimate after — and the token before, so γ steps cost γ small head passes and no drafter cache.

Where the feature comes from: the lean target keeps its last forward's hidden states (`LeanLM.last_hidden`). The
first draft of a round predicts the token after seq[-1], so it needs the feature at position len(seq) − 2, the one
that predicted seq[-1]. After prefill (prompt[:-1]) that is the prefill's last position; after a round it is a
position of the verify pass, which fed the target from the length the previous `keep` named. A session therefore
remembers that length and, at `keep`, picks the row of `last_hidden` for the new length (a prompt of one token has no
feature yet: that round proposes nothing, the target's step gives the first one).

Lossless like any drafter: greedy drafts are the head's argmax; under sampling q is the distribution the draft was
drawn from — the head's softmax (after temperature / top-p) over the draft vocabulary, 0 on every other target id.
Only the lean engine exposes hidden states, so transformers and llama.cpp targets are refused; no other engine
(vLLM, SGLang, llama-server) can load such a head as it is (docs/feature.md says what maps to EAGLE-3 and what not).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from ...errors import DraftwiseError
from ...runtimes.base import Model, ModelOptions
from ...runtimes.lean import feature_head as fh
from ..drafters import bucket, draw, own_prob
from ..roles import Draft
from ..sampling import SamplingParams, argmax
from .base import Builtin, Loaded, body

NAME = "feature"


def checkpoint_folder(spec: str) -> Path:
    """PATH of `feature:PATH`: a train-feature run folder (its checkpoint/) or the checkpoint itself."""
    path = Path(body(spec, NAME))
    if not str(path) or str(path) == ".":
        raise DraftwiseError(f"bad drafter spec {spec!r}: expected feature:PATH (a train-feature run folder)")
    for folder in (path / "checkpoint", path):
        if fh.is_checkpoint(folder):
            return folder
    raise DraftwiseError(f"no feature head in {path}: give a `draftwise train-feature` run folder or its checkpoint/")


@torch.no_grad()
def target_features(lm, tokens: list[int]) -> torch.Tensor:
    """The target's features at every position of `tokens`, teacher-forced in one pass: [T, D] fp32."""
    lm.reset(1, len(tokens))
    lm.forward(torch.tensor([tokens], device=lm.device), 0, 0)
    return lm.features(lm.last_hidden[0]).float()


@torch.no_grad()
def unrolled_drafts(head, features: torch.Tensor, tokens: list[int], prompt_len: int, gamma: int) -> list[list[int]]:
    """Greedy drafts along known text: for each continuation position P, the head's drafts of tokens P..P+γ−1
    (target ids, cut at the end of the text), the first from the target's feature at P−2 (`features` [T, D]) and
    x_{P−1}, each next from the head's own feature and the true token before it — what greedy SD drafts in a round
    that starts at P, since a draft only counts while the drafts before it equal the text; [] where P < 2."""
    first = max(prompt_len, 2)
    at = torch.arange(first, len(tokens), device=features.device)
    out: list[list[int]] = [[] for _ in range(min(first, len(tokens)) - prompt_len)]
    if not len(at):
        return out
    ids = torch.tensor(tokens, device=features.device)
    feature, steps = features[at - 2], []
    for k in range(gamma):
        logits, feature = head(feature, ids[(at - 1 + k).clamp_max(len(tokens) - 1)])
        steps.append(head.d2t[logits.argmax(-1)].tolist())
    return out + [[s[i] for s in steps][: len(tokens) - P] for i, P in enumerate(at.tolist())]


class FeatureDrafter:
    kind = "feature"

    def __init__(self, head: fh.FeatureHead, lm):
        self.head, self.lm = head, lm

    def start(self, prompts: list[list[int]], slots: int, vocab_size: int, batched: bool = False) -> FeatureSession:
        """Called after the loop's prefill of prompt[:-1], whose hidden states the target still holds."""
        if batched or len(prompts) != 1:
            raise DraftwiseError("feature drafters run at batch size 1")
        return FeatureSession(self.head, self.lm, len(prompts[0]), vocab_size)


class FeatureSession:
    def __init__(self, head: fh.FeatureHead, lm, prompt_len: int, vocab_size: int):
        self.head, self.lm, self.vocab_size = head, lm, vocab_size
        self.feature: torch.Tensor | None = None  # [D] at position `length` − 2 of a sequence of `length` tokens
        self.length = 0
        prefilled = self.lm.last_hidden is not None and self.lm.last_hidden.shape[:2] == (1, prompt_len - 1)
        if prefilled:  # (a one-token prompt has no prefill: what the target holds is another call's)
            self._take(prompt_len - 1, 0)
        self.fed_from = prompt_len - 1  # where the target's next forward (the first verify pass) starts

    def _take(self, length: int, fed_from: int) -> None:
        """The feature a sequence of `length` + 1 tokens drafts from (position length − 1), out of the target's last
        forward, which fed it from position `fed_from`; none when that forward did not cover it."""
        hidden, i = self.lm.last_hidden, length - 1 - fed_from
        if length < 1 or hidden is None or hidden.shape[0] != 1 or not 0 <= i < hidden.shape[1]:
            self.feature = None
            return
        self.feature = self.lm.features(hidden[0, i]).float()  # [D]
        self.length = length + 1

    @torch.no_grad()
    def propose(
        self,
        seqs: dict[int, list[int]],
        gamma: int,
        params: SamplingParams,
        generator: torch.Generator,
        stop_below: float = 0.0,
    ) -> dict[int, Draft]:
        (row, seq), *rest = seqs.items()
        if rest:
            raise DraftwiseError("feature drafters run at batch size 1")
        if self.feature is None or self.length != len(seq) or gamma < 1:
            return {row: Draft()}  # no feature for this sequence (a one-token prompt): a plain step
        draft = Draft([], None if params.greedy else [], "model", [])  # priced per step, as a model's (cost.py)
        feature, token = self.feature[None], torch.tensor([seq[-1]], device=self.feature.device)
        for _ in range(gamma):
            logits, feature = self.head(feature, token)  # [1, N], [1, D]
            if params.greedy:  # the argmax over the draft vocabulary is the argmax over the full one (q = 0 off it)
                i = int(argmax(logits[0]))
                draft.tokens.append(int(self.head.d2t[i]))
                q = float(torch.softmax(logits[0], -1)[i])
            else:
                full = self.full(logits[0])
                draft.tokens.append(draw(full, params, generator, draft.qs))
                q = own_prob(full, draft.qs, draft.tokens[-1])
            draft.features.append(f"model|q{bucket(q)}")  # q(x): the head's confidence in its own token
            if stop_below and q < stop_below:
                break
            token = torch.tensor(draft.tokens[-1:], device=feature.device)
        return {row: draft}

    def full(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [N] as target-vocabulary logits [V]: −inf (q = 0) off the draft vocabulary."""
        out = logits.new_full((self.vocab_size,), float("-inf"))
        return out.index_copy_(0, self.head.d2t, logits)

    def keep(self, row: int, length: int) -> None:
        """Called after each verify pass, which fed the target from the previous `keep`'s length."""
        self._take(length, self.fed_from)
        self.fed_from = length  # the target's next forward starts here (the loop's `Context`)


class Feature:
    name = NAME
    kind = "feature"
    description = "a small head on the target's own features (EAGLE-style), trained by `draftwise train-feature`"
    usage = "feature:PATH"
    batched = False  # one session reads one row of the target's hidden states

    def matches(self, spec: str) -> bool:
        return spec.startswith(NAME + ":")

    def load(self, spec: str, target: Model | None, options: ModelOptions = ModelOptions()) -> Loaded:
        if target is None:
            raise DraftwiseError(f"{spec}: a feature drafter needs its target (it reads the target's features)")
        lm = fh.require_lean(target)
        head = fh.load(checkpoint_folder(spec), target)
        return Loaded(spec, self.kind, FeatureDrafter(head, lm))

    def vllm(self, spec: str, gamma: int) -> dict:
        raise DraftwiseError(
            "a feature drafter has no vLLM export: vLLM's eagle3 method loads EAGLE-3 heads (self-attention over "
            "three intermediate layers' features), which this head is not (docs/feature.md)"
        )

    def llama_server(self, spec: str, gamma: int, gguf: Callable[[str], Path]) -> Builtin:
        raise DraftwiseError(
            "a feature drafter has no llama-server counterpart: its draft-eagle3 loads EAGLE-3 heads, which this "
            "head is not (docs/feature.md)"
        )


FAMILY = Feature()
