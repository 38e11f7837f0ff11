"""The config of `draftwise train-feature`: a feature-level drafter (EAGLE-style head) trained on teacher data."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DraftwiseError
from .base import LOSSES, check_budget, check_trainable, opt, opt_device, opt_dtype, opt_seed, opt_target, opt_threads


@dataclass(frozen=True)
class TrainFeatureConfig:
    """`draftwise train-feature`: a small head on the target's features (`runtimes.lean.feature_head`), trained toward
    the target's next-next-token distribution and its next feature on a `draftwise teacher` folder (features stored)."""

    target: str = opt_target()
    data: str = opt("", "a `draftwise teacher` run folder whose shards hold the target's features", required=True)
    loss: str = opt("fkl", "the divergence to the target's top-k on the draft vocabulary", choices=LOSSES)
    minutes: float | None = opt(10.0, "training-time budget (ignored when --tokens is set)", exclusive="budget")
    tokens: int | None = opt(
        None, "budget in trained positions (draft starts) instead of minutes (deterministic)", exclusive="budget"
    )
    lr: float = opt(3e-3, "learning rate (AdamW)")
    batch_size: int = opt(1024, "positions per step (the head is position-wise: positions, not sequences)")
    blocks: int = opt(1, "MLP blocks after the head's input projection")
    ffn: int = opt(0, "each block's MLP width (0 = the target's intermediate size)")
    draft_vocab: int = opt(8192, "rows of the head: the target ids the teacher data's target emits most")
    feature_weight: float = opt(0.1, "weight of the feature regression (smooth L1) beside the token loss's 1")
    unroll: int = opt(2, "draft steps trained per position, each after the first from the head's own feature")
    eval_every: int = opt(50, "steps between held-out agreement evaluations")
    checkpoint_every: int = opt(50, "steps between checkpoints (a rerun resumes from the last)")
    eval_prompts: int = opt(32, "held-out eval prompts of the agreement evaluation")
    eval_tokens: int = opt(48, "target tokens per eval prompt")
    eval_suites: str = opt("all", "packaged suites of the eval prompts")
    seed: int = opt_seed()
    dtype: str = opt_dtype()
    device: str = opt_device()
    threads: int | None = opt_threads()

    def __post_init__(self):
        check_trainable("train-feature", self.dtype)
        if self.loss not in LOSSES:
            raise DraftwiseError(f"unknown loss {self.loss!r}: choose from {', '.join(LOSSES)}")
        if not self.data:
            raise DraftwiseError("train-feature needs --data (a `draftwise teacher` run folder with features)")
        check_budget(self)
        counts = (self.batch_size, self.blocks, self.draft_vocab, self.unroll, self.eval_every, self.checkpoint_every)
        if min(counts) < 1 or min(self.eval_prompts, self.eval_tokens) < 1 or self.lr <= 0:
            raise DraftwiseError(
                "batch_size, blocks, draft_vocab, unroll, eval_every, checkpoint_every, eval_prompts, eval_tokens "
                "and lr must be positive"
            )
        if self.ffn < 0 or self.feature_weight < 0:
            raise DraftwiseError("ffn and feature_weight must be >= 0")
