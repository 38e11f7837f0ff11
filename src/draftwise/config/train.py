"""The configs of building a drafter and checking it: `prune`, `gen-data`, `distill` and `agree`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DraftwiseError
from .base import (
    LOSSES,
    PRECISIONS,
    check_budget,
    check_gguf_quant,
    check_positive,
    check_trainable,
    opt,
    opt_backend,
    opt_device,
    opt_dtype,
    opt_gguf_quant,
    opt_seed,
    opt_target,
    opt_threads,
)


@dataclass(frozen=True)
class PruneConfig:
    """`draftwise prune`: a drafter of an exact shape carved out of the target (see stages/prune)."""

    target: str = opt_target()
    shape: str = opt("", "layers=3,hidden=576,heads=9,kv_heads=3,ffn=1536 (dimensions left out: the target's)")
    method: str = opt("importance", "importance scores or learned L0 masks", choices=("importance", "l0"))
    calib_tokens: int = opt(2048, "calibration tokens (scored positions) from the train split")
    data: str | None = opt(
        None, "a teacher or gen-data run folder whose sequences calibrate (default: generate continuations)"
    )
    calib_suites: str = opt("all", "packaged suites of the calibration prompts")
    max_new_tokens: int = opt(64, "per calibration continuation")
    max_prompt_tokens: int = opt(192, "longer calibration prompts are skipped")
    elimination_tokens: int = opt(
        512, "scored positions the layer elimination uses (importance; whole calibration rows)"
    )
    layer_criterion: str = opt("tvd", "what the layer elimination minimises", choices=("tvd", "kl"))
    l0_steps: int = opt(60, "optimisation steps of the L0 masks")
    draft_vocab: int = opt(0, "also write reduced/: the head cut to the N hottest tokens of --vocab-data (0 = no)")
    vocab_data: str | None = opt(
        None, "a gen-data run folder (train split) whose token frequencies choose the draft vocabulary"
    )
    batch_size: int = opt(8, "calibration sequences per batch")
    seed: int = opt_seed()
    dtype: str = opt_dtype()
    device: str = opt_device()
    threads: int | None = opt_threads()

    def __post_init__(self):
        check_trainable("prune", self.dtype)
        if self.method not in ("importance", "l0"):
            raise DraftwiseError(f"unknown pruning method {self.method!r}: choose importance or l0")
        if self.layer_criterion not in ("tvd", "kl"):
            raise DraftwiseError(f"unknown layer criterion {self.layer_criterion!r}: choose tvd or kl")
        if self.draft_vocab and not self.vocab_data:
            raise DraftwiseError("--draft-vocab needs --vocab-data (a gen-data run folder: token frequencies)")
        if min(self.calib_tokens, self.max_new_tokens, self.elimination_tokens, self.batch_size, self.l0_steps) < 1:
            raise DraftwiseError(
                "calib_tokens, max_new_tokens, elimination_tokens, batch_size and l0_steps must be >= 1"
            )


@dataclass(frozen=True)
class AgreeConfig:
    """`draftwise agree`: teacher-forced top-1 agreement of a drafter with the target's greedy continuations."""

    target: str = opt_target()
    drafter: str = opt(
        "", "the drafter: a checkpoint, a prune / distill run folder, layers:i,j,... or any drafter spec", required=True
    )
    suites: str = opt("all", "packaged suites: a name, a comma list or 'all'")
    split: str = opt("eval", "the suites' split", choices=("train", "eval"))
    prompts: str | None = opt(None, "your own prompts (your traffic) instead of the suites: JSONL or text")
    limit: int = opt(60, "prompts (round-robin over suites and categories)")
    max_new_tokens: int = opt(64, "target tokens per prompt the drafter is teacher-forced on")
    max_prompt_tokens: int = opt(256, "longer prompts are skipped")
    gammas: tuple[int, ...] = opt((1, 2, 3, 4, 5, 6, 8), "γ values whose greedy TAR the agreement implies")
    batch_size: int = opt(8, "prompts continued together")
    shared: str | None = opt(
        None,
        "a folder keeping the target's continuations: another agree on the same target, runtime and prompts "
        "reads them from it instead of generating them again (a design's candidates share one)",
    )
    dtype: str = opt_dtype()
    device: str = opt_device()
    backend: str = opt_backend()  # the engine both models run on (llama.cpp: GGUF files, see runtimes.llamacpp.load)
    gguf_quant: str = opt_gguf_quant()
    threads: int | None = opt_threads()

    def __post_init__(self):
        check_gguf_quant(self.gguf_quant)
        object.__setattr__(self, "gammas", tuple(self.gammas))
        check_positive("gammas", self.gammas)
        if not self.drafter:
            raise DraftwiseError("agree needs a drafter (--drafter)")
        if min(self.limit, self.max_new_tokens, self.batch_size) < 1:
            raise DraftwiseError("limit, max_new_tokens and batch_size must be >= 1")


@dataclass(frozen=True)
class GenDataConfig:
    """`draftwise gen-data`: the target's continuations of train prompts, with its top-k distribution."""

    target: str = opt_target()
    suites: str = opt("all", "packaged suites whose train prompts are continued: a name, a comma list or 'all'")
    prompts: str | None = opt(None, "extra prompts (JSONL or text); any that fall in the eval split are dropped")
    max_new_tokens: int = opt(128, "tokens generated per prompt and temperature")
    temperatures: tuple[float, ...] = opt((0.0, 1.0), "comma list: each prompt is continued at each")
    topk: int = opt(32, "the target's most likely tokens stored per position (with their probabilities)")
    max_prompt_tokens: int = opt(512, "longer prompts are skipped")
    limit: int | None = opt(None, "prompts (before temperatures multiply them; default: all)")
    skip: int = opt(0, "prompts passed over first (a second run continues where a first one's limit stopped)")
    shard_size: int = opt(64, "sequences per shard")
    batch_size: int = opt(16, "prompts continued together")
    seed: int = opt_seed()
    dtype: str = opt_dtype()
    device: str = opt_device()
    threads: int | None = opt_threads()

    def __post_init__(self):
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        if not self.temperatures or min(self.temperatures) < 0:
            raise DraftwiseError("temperatures must be a non-empty list of values >= 0")
        if min(self.max_new_tokens, self.topk, self.shard_size, self.batch_size, self.max_prompt_tokens) < 1:
            raise DraftwiseError("max_new_tokens, topk, shard_size, batch_size and max_prompt_tokens must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise DraftwiseError(f"limit must be >= 1, got {self.limit}")
        if self.skip < 0:
            raise DraftwiseError(f"skip must be >= 0, got {self.skip}")


@dataclass(frozen=True)
class DistillConfig:
    """`draftwise distill`: train a drafter toward the target's distribution on gen-data shards."""

    target: str = opt_target()
    drafter: str = opt("", "the drafter to train: a checkpoint, a prune run folder or layers:i,j,...", required=True)
    data: str = opt(
        "", "a gen-data or teacher run folder (`draftwise teacher`), or several joined by commas", required=True
    )
    loss: str = opt("tvd", "the divergence to the target's top-k (stages.losses)", choices=LOSSES)
    minutes: float | None = opt(10.0, "training-time budget (ignored when --tokens is set)", exclusive="budget")
    tokens: int | None = opt(
        None, "budget in trained (continuation) positions instead of minutes (deterministic)", exclusive="budget"
    )
    lr: float = opt(1e-3, "learning rate")
    batch_size: int = opt(8, "sequences per micro-batch")
    grad_accum: int = opt(1, "micro-batches per optimizer step")
    max_len: int = opt(320, "tokens per sequence (long prompts are cut from the left)")
    train_embeddings: bool = opt(False, "also train the (tied) embedding and LM head, frozen otherwise")
    autocast: str = opt(
        "auto",
        "matmuls in bf16 under autocast (weights and optimizer stay fp32): auto = where the CPU computes bf16 "
        "natively (2.4× the tokens/s measured on a 2-core EPYC Zen 5) or on a GPU",
        choices=("auto", "on", "off"),
    )
    draft_vocab: int = opt(
        0,
        "train with the head cut to the N hottest tokens of --vocab-data, as the drafter deploys, and write "
        "reduced/ with that head (0 = the full head)",
    )
    vocab_data: str | None = opt(
        None, "a gen-data run folder whose token frequencies choose the draft vocabulary (default: --data)"
    )
    on_policy_every: int = opt(0, "every n-th step on-policy: the drafter generates, the target scores (0 = off)")
    on_policy_tokens: int = opt(32, "tokens the drafter generates per on-policy sequence")
    eval_every: int = opt(25, "steps between held-out agreement evaluations")
    stop_below: float = opt(
        0.0,
        "after the pilot, stop when the learning curve predicts the agreement at the budget's end below this (the "
        "break-even a design asks for; 0 = train the whole budget)",
    )
    pilot: float = opt(0.3, "share of the budget trained before the learning curve is asked (with --stop-below)")
    checkpoint_every: int = opt(25, "steps between checkpoints (a rerun resumes from the last)")
    resume_from: str | None = opt(
        None,
        "a finished distill run folder to train further: its weights, optimizer, data order, learning curve and "
        "the settings this line leaves out go on here, --minutes / --tokens count what this run adds, and the "
        "curve's projection is checked at the end",
    )
    eval_prompts: int = opt(32, "held-out eval prompts of the agreement evaluation")
    eval_tokens: int = opt(48, "target tokens per eval prompt")
    eval_suites: str = opt("all", "packaged suites of the eval prompts")
    seed: int = opt_seed()
    dtype: str = opt_dtype()
    target_dtype: str = opt(
        "",
        "the target's precision for the held-out continuations and on-policy scoring (default: --dtype); a "
        "deployment precision (q4, int8) keeps a big target's fp32 copy out of memory and evaluates against the "
        "target as deployed",
    )
    device: str = opt_device()
    threads: int | None = opt_threads()

    def __post_init__(self):
        check_trainable("distill", self.dtype)
        if self.target_dtype and self.target_dtype not in PRECISIONS:
            raise DraftwiseError(f"unknown target precision {self.target_dtype!r}: choose from {', '.join(PRECISIONS)}")
        if self.loss not in LOSSES:
            raise DraftwiseError(f"unknown loss {self.loss!r}: choose from {', '.join(LOSSES)}")
        if not self.drafter or not self.data:
            raise DraftwiseError("distill needs --drafter and --data (a gen-data or teacher run folder)")
        if self.autocast not in ("auto", "on", "off"):
            raise DraftwiseError(f"autocast must be auto, on or off, got {self.autocast!r}")
        check_budget(self)
        if not 0 <= self.stop_below <= 1 or not 0 < self.pilot <= 1:
            raise DraftwiseError(f"need 0 <= stop_below <= 1 and 0 < pilot <= 1, got {self.stop_below}, {self.pilot}")
        if (
            min(self.batch_size, self.grad_accum, self.max_len, self.eval_every, self.checkpoint_every) < 1
            or self.lr <= 0
        ):
            raise DraftwiseError(
                "batch_size, grad_accum, max_len, eval_every, checkpoint_every and lr must be positive"
            )
