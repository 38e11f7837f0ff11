"""The config of `draftwise teacher`: the target's top-k and features over text, teacher-forced, cached."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DraftwiseError
from .base import opt, opt_device, opt_seed, opt_target, opt_threads

TEACHER_PRECISIONS = ("auto", "fp32", "bf16", "int8", "q4")


@dataclass(frozen=True)
class TeacherConfig:
    """`draftwise teacher`: the target's top-k distribution and last hidden state at every position of text it
    scores teacher-forced (one prefill-like pass per batch): the packaged suites' train split, a gen-data run's
    continuations and a user's text file."""

    target: str = opt_target()
    suites: str = opt("all", "packaged suites whose train-split text is scored: a name, a comma list, 'all' or 'none'")
    text: str | None = opt(None, "a user's text to score too (.jsonl with 'text' or 'prompt' fields, or plain text)")
    continuations: str | None = opt(
        None, "a gen-data run folder whose sequences are scored too (the target's own text; same tokenizer)"
    )
    tokens: int = opt(0, "the most tokens to score, over the sources in order (0 = all)")
    seq_len: int = opt(256, "tokens per scored sequence (longer texts are cut into pieces of this length)")
    min_len: int = opt(16, "shorter sequences are skipped")
    topk: int = opt(32, "the target's most likely tokens stored per position (with their probabilities)")
    features: bool = opt(True, "do not store the target's feature (final-normed last hidden state) per position")
    precision: str = opt(
        "auto",
        "the teacher's precision: bf16 where the CPU computes it natively (AVX-512 BF16 / AMX) or on a GPU, else "
        "fp32 (auto); or the deployed target's int8 / q4 (a big target's: the drafter learns the target it will "
        "serve, at a third of bf16's memory); a lossy teacher's top-1 agreement with the fp32 target is recorded",
        choices=TEACHER_PRECISIONS,
    )
    batch_size: int = opt(
        0,
        "sequences per forward pass; 0: about 512 tokens a pass on the int8 kernel (int8, q4: 2 × 256 scored 37-42 "
        "tokens/s where 8 × 256 scored 25-29 on an AMD EPYC Zen 3), 8 on torch's matmul (fp32, bf16: 8 × 256 fastest)",
    )
    shard_size: int = opt(64, "sequences per shard (the unit of caching and of resuming)")
    cache: bool = opt(True, "keep shards in the run folder, not shared through the cache ($DRAFTWISE_CACHE/teacher)")
    seed: int = opt_seed()
    device: str = opt_device()
    threads: int | None = opt_threads()

    def __post_init__(self):
        if self.precision not in TEACHER_PRECISIONS:
            raise DraftwiseError(
                f"unknown teacher precision {self.precision!r}: choose {', '.join(TEACHER_PRECISIONS)}"
            )
        if min(self.seq_len, self.topk, self.shard_size, self.min_len) < 1 or self.batch_size < 0:
            raise DraftwiseError("seq_len, topk, shard_size and min_len must be >= 1, batch_size >= 0 (0: auto)")
        if self.min_len > self.seq_len:
            raise DraftwiseError(f"min_len ({self.min_len}) must be <= seq_len ({self.seq_len})")
        if self.tokens < 0:
            raise DraftwiseError(f"tokens must be >= 0, got {self.tokens}")
        if self.suites == "none" and not self.text and not self.continuations:
            raise DraftwiseError("nothing to score: give suites, --text or --continuations")
