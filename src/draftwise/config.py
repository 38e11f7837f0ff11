"""Typed, frozen configuration of each stage, saved as `config.json` in its run folder.

A config holds everything that decides a stage's result, so a run folder can be compared, resumed and reproduced
from its config alone. Validation happens on construction and raises `DraftwiseError` with one line.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DraftwiseError

BASELINES = ("ar", "hf-generate", "hf-assisted", "hf-prompt-lookup", "llama-cpp", "llama-cpp-prompt-lookup",
             "llama-cpp-lookup")
LLAMA_SERVER = "llama-server"  # a baseline of its own, or llama-server:ARGS (the server's own options, shell-quoted)
# baselines that run one sequence at a time and do not use the point's drafter or γ (once per temperature in a grid)
PLAIN_BATCH1 = ("hf-generate", "llama-cpp")


def llama_server_args(baseline: str) -> list[str] | None:
    """The extra llama-server arguments of a `llama-server[:ARGS]` baseline (shlex-split), None for other baselines."""
    if baseline != LLAMA_SERVER and not baseline.startswith(LLAMA_SERVER + ":"):
        return None
    try:
        return shlex.split(baseline.partition(":")[2])
    except ValueError as e:
        raise DraftwiseError(f"baseline {baseline!r}: cannot split its llama-server arguments ({e})") from None


LOOKUP_DRAFTERS = ("ngram", "suffix")

GGUF_QUANTS = ("f32", "f16", "q8_0")
# --dtype: a float dtype, or the lean engine's int8 (int8 weights, int16 activations per token; lossy, labelled)
PRECISIONS = ("fp32", "bf16", "fp16", "int8")


def _check_gguf_quant(quant: str) -> None:
    if quant not in GGUF_QUANTS:
        raise DraftwiseError(f"unknown GGUF quantization {quant!r}: choose one of {', '.join(GGUF_QUANTS)}")



def drafter_kind(spec: str) -> str:
    """model | lookup | hybrid, from a drafter spec's text alone (see `specs`)."""
    if spec.split(":", 1)[0].split(",", 1)[0] in LOOKUP_DRAFTERS:
        return "lookup"
    return "hybrid" if spec.startswith("hybrid:") else "model"


@dataclass(frozen=True)
class BenchConfig:
    """`draftwise bench`: SD with a drafter against baselines, on the same prompts in one process."""

    target: str = "default"
    drafter: str | None = None  # a checkpoint, a .gguf file, layers:i,j,..., ngram, suffix:..., hybrid:... (see specs)
    gamma: int = 4  # lookahead γ: tokens drafted per round (the most per round with draft_stop > 0 or a lookup)
    draft_stop: float = 0.0  # adaptive lookahead: stop drafting once q(own token) < this; 0 = always γ
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    suite: str = "spec_bench"  # packaged suites: a name, a comma list or 'all'
    split: str = "eval"
    prompts: str | None = None  # a user prompt file instead of the suites
    limit: int | None = 10  # prompts, spread round-robin over categories; None = all
    max_new_tokens: int = 128
    baselines: tuple[str, ...] = ("ar",)
    batch_size: int = 1  # prompts decoded together (batched SD / AR; transformers baselines need 1)
    synthetic_alpha: float | None = None  # accept each draft with this probability instead of testing it (cost only)
    seed: int = 0
    warmup: int = 1  # untimed runs of each method before measuring
    dtype: str = "fp32"
    device: str = "cpu"
    backend: str = "auto"  # auto | lean | transformers | llama.cpp
    compile: bool = False  # torch.compile the lean forward's layers
    gguf_quant: str = "f32"  # llama.cpp: precision of the GGUF files draftwise writes (drafters, HF-dir targets)
    llama_exact: bool = False  # llama.cpp: f32 KV cache, no flash attention (default: llama.cpp's own context)
    threads: int | None = None  # torch intra-op threads; None = torch's default
    llama_server: str | None = None  # the llama-server binary of llama-server baselines; None = on PATH, else .venv/bin
    schedule: str | None = None  # a profile run folder of this engine: adds SD with the round scheduler (sd.schedule),
    # pricing each round by that profile's verify curve; γ is then the longest run it may verify
    calibration: str | None = None  # what the scheduler's calibration starts from: a calibration folder (calibration.json,
    # `sd.calibrate`: its table at this temperature) or a bench run folder (its scheduled rounds of the same drafter and
    # temperature); None = it starts empty. Either way it then learns from this run's own rounds

    def __post_init__(self):
        _check_gguf_quant(self.gguf_quant)
        if self.schedule is not None and (not self.drafter or self.batch_size > 1 or self.synthetic_alpha is not None):
            raise DraftwiseError("schedule needs a drafter, batch size 1 and real acceptance (no synthetic_alpha)")
        if self.calibration is not None and self.schedule is None:
            raise DraftwiseError("calibration seeds the round scheduler: give --schedule too")
        object.__setattr__(self, "baselines", tuple(self.baselines))
        unknown = [b for b in self.baselines if b not in BASELINES and llama_server_args(b) is None]
        if unknown:
            raise DraftwiseError(f"unknown baseline {unknown[0]!r}: choose from {', '.join(BASELINES)}, "
                                 f"{LLAMA_SERVER} or {LLAMA_SERVER}:ARGS")
        twice = [b for i, b in enumerate(self.baselines) if b in self.baselines[:i]]
        if twice:
            raise DraftwiseError(f"baseline {twice[0]!r} is given twice")
        if self.gamma < 1:
            raise DraftwiseError(f"gamma (lookahead) must be >= 1, got {self.gamma}")
        if not 0 <= self.draft_stop < 1:
            raise DraftwiseError(f"draft_stop must be in [0, 1), got {self.draft_stop}")
        if self.batch_size < 1:
            raise DraftwiseError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.batch_size > 1 and (set(self.baselines) - {"ar"} or self.draft_stop):
            raise DraftwiseError("batch_size > 1 runs SD and AR only (transformers' and llama.cpp's baselines decode one "
                                 "sequence at a time; adaptive lookahead is batch-1)")
        if self.synthetic_alpha is not None:
            if not 0 <= self.synthetic_alpha <= 1:
                raise DraftwiseError(f"synthetic_alpha must be in [0, 1], got {self.synthetic_alpha}")
            if self.drafter is None or "hf-assisted" in self.baselines:
                raise DraftwiseError("synthetic acceptance needs a drafter and applies to the draftwise engine only "
                                     "(not to hf-assisted)")
        if self.drafter is None and "hf-assisted" in self.baselines:
            raise DraftwiseError("baseline hf-assisted needs a drafter (--drafter)")
        if "llama-cpp-lookup" in self.baselines and (self.drafter is None or drafter_kind(self.drafter) != "lookup"):
            raise DraftwiseError("baseline llama-cpp-lookup runs the point's lookup drafter inside llama-cpp-python: "
                                 "give an ngram or suffix --drafter")
        if self.drafter is not None:
            kind = drafter_kind(self.drafter)
            if kind != "model" and "hf-assisted" in self.baselines:
                raise DraftwiseError(f"baseline hf-assisted needs a model drafter, not a {kind} drafter "
                                     "(transformers' own lookup is the baseline hf-prompt-lookup)")
            if kind == "hybrid" and self.batch_size > 1:
                raise DraftwiseError("hybrid drafters run at batch size 1")
        if self.drafter is None and not self.baselines:
            raise DraftwiseError("nothing to run: give --drafter or at least one --baseline")
        if self.limit is not None and self.limit < 1:
            raise DraftwiseError(f"limit must be >= 1, got {self.limit}")
        if self.max_new_tokens < 1:
            raise DraftwiseError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise DraftwiseError(f"need temperature >= 0 and 0 < top_p <= 1, got {self.temperature}, {self.top_p}")
        if self.threads is not None and self.threads < 1:
            raise DraftwiseError(f"threads must be >= 1, got {self.threads}")


@dataclass(frozen=True)
class BenchGridConfig:
    """`draftwise bench` over a grid: drafters × γ × temperatures × batch sizes, each other setting from `bench`.
    An empty axis keeps `bench`'s value. Baselines run once per (temperature, batch size); hf-assisted (model drafters),
    hf-prompt-lookup and llama-cpp-prompt-lookup per point, as they use the point's drafter and γ; the transformers
    and llama.cpp baselines at batch size 1 only (they decode one sequence at a time)."""

    bench: BenchConfig = BenchConfig(drafter="layers:0")
    drafters: tuple[str, ...] = ()
    gammas: tuple[int, ...] = ()
    temperatures: tuple[float, ...] = ()
    batch_sizes: tuple[int, ...] = ()
    drafter_gammas: tuple[int, ...] = ()  # each drafter's own γ (aligned with `drafters`) instead of the γ axis
    scheduled: tuple[str, ...] = ()  # with bench.schedule: the drafters whose points also run the round scheduler
    # (the others run static SD only); empty = every drafter's
    rows: tuple[BenchConfig, ...] = ()  # whole benches on other runtimes (target file, backend, precision), each with
    # its drafter (or none) and baselines, interleaved prompt by prompt with the grid's points on the same prompts
    row_names: tuple[str, ...] = ()  # one per row: its runtime's name in the records (e.g. lean-int8)

    def __post_init__(self):
        if isinstance(self.bench, dict):  # read back from config.json
            object.__setattr__(self, "bench", from_dict(BenchConfig, self.bench))
        object.__setattr__(self, "rows", tuple(from_dict(BenchConfig, r) if isinstance(r, dict) else r
                                               for r in self.rows))
        for name in ("drafters", "gammas", "temperatures", "batch_sizes", "drafter_gammas", "scheduled", "row_names"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if len(self.row_names) != len(self.rows) or len(set(self.row_names)) != len(self.row_names):
            raise DraftwiseError("a bench grid's rows need one distinct name each (row_names)")
        same = ("suite", "split", "prompts", "limit", "max_new_tokens", "seed")
        for name, row in zip(self.row_names, self.rows):
            if any(getattr(row, k) != getattr(self.bench, k) for k in same):
                raise DraftwiseError(f"row {name} must run the grid's prompts ({', '.join(same)} as its bench)")
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        _positive("gammas", self.gammas)
        _positive("batch_sizes", self.batch_sizes)
        _positive("drafter_gammas", self.drafter_gammas)
        if not (self.drafters or self.bench.drafter or self.rows or self.bench.baselines):
            raise DraftwiseError("a bench grid needs at least one drafter or baseline")
        if self.drafter_gammas and (len(self.drafter_gammas) != len(self.drafters) or self.gammas):
            raise DraftwiseError("drafter_gammas gives one γ per drafter, instead of a γ axis")
        if self.scheduled and (not self.bench.schedule or set(self.scheduled) - set(self.drafters or (self.bench.drafter,))):
            raise DraftwiseError("scheduled names drafters of the grid, and needs bench.schedule (a profile folder)")
        self.points()  # every point must be a valid BenchConfig

    def runtimes(self) -> list[str | None]:
        """The runtime name of each point of `points()`: None for the grid's own, then the rows' names."""
        return [None] * (len(self.points()) - len(self.rows)) + list(self.row_names)

    def points(self) -> list[BenchConfig]:
        """SD points (one per drafter, γ, temperature, batch size), then one baseline point per (temperature, batch),
        then the rows."""
        b = self.bench
        drafters, gammas = self.drafters or ((b.drafter,) if b.drafter else ()), self.gammas or (b.gamma,)
        temps, sizes = self.temperatures or (b.temperature,), self.batch_sizes or (b.batch_size,)
        def per_point(drafter: str, n: int) -> tuple[str, ...]:
            own = {"hf-assisted": drafter_kind(drafter) == "model", "hf-prompt-lookup": True,
                   "llama-cpp-prompt-lookup": True, "llama-cpp-lookup": drafter_kind(drafter) == "lookup"}
            return tuple(x for x in b.baselines if own.get(x) and n == 1)

        pairs = list(zip(drafters, self.drafter_gammas)) if self.drafter_gammas else \
            [(d, g) for d in drafters for g in gammas]
        def schedule(drafter: str) -> dict:
            on = not self.scheduled or drafter in self.scheduled
            return {"schedule": b.schedule if on else None, "calibration": b.calibration if on else None}

        sd = [dataclasses.replace(b, drafter=d, gamma=g, temperature=t, batch_size=n, baselines=per_point(d, n),
                                  **schedule(d)) for t in temps for n in sizes for d, g in pairs]
        base = []
        for t in temps:
            for n in sizes:  # transformers' and llama.cpp's baselines are batch-1: at B > 1 only AR runs beside SD
                names = tuple(x for x in b.baselines if x == "ar" or n == 1 and (x in PLAIN_BATCH1 or
                                                                                llama_server_args(x) is not None))
                if names:
                    base.append(dataclasses.replace(b, drafter=None, gamma=1, synthetic_alpha=None, schedule=None,
                                                    calibration=None, temperature=t,
                                                    batch_size=n, baselines=names))
        return sd + base + list(self.rows)


def _positive(name: str, values) -> None:
    bad = [v for v in values if v < 1]
    if bad:
        raise DraftwiseError(f"{name} must all be >= 1, got {bad[0]}")


@dataclass(frozen=True)
class ProfileConfig:
    """`draftwise profile`: the target's AR step and verify passes, drafter steps and the LM head, timed here."""

    target: str = "default"
    drafters: tuple[str, ...] = ()  # checkpoints or layers:i,j,... specs
    depths: tuple[int, ...] = (1, 2, 4, 8, 16)  # full-width k-layer truncations of the target, timed as drafters
    gammas: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 16)
    batches: tuple[int, ...] = (1, 4, 8)
    context: int = 256  # positions already in the KV cache when a step is timed
    warmup: int = 3
    repeats: int = 15
    seed: int = 0
    dtype: str = "fp32"
    device: str = "cpu"
    backend: str = "auto"  # auto | lean | transformers | llama.cpp
    compile: bool = False  # torch.compile the lean forward's layers (launch-bound GPUs at batch 1)
    gguf_quant: str = "f32"  # llama.cpp: precision of the GGUF files draftwise writes (drafters, HF-dir targets)
    threads: int | None = None

    def __post_init__(self):
        _check_gguf_quant(self.gguf_quant)
        for name in ("drafters", "depths", "gammas", "batches"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("depths", "gammas", "batches"):
            _positive(name, getattr(self, name))
        if self.context < 1 or self.repeats < 1 or self.warmup < 0:
            raise DraftwiseError("context and repeats must be >= 1, warmup >= 0")


@dataclass(frozen=True)
class SweepConfig:
    """`draftwise sweep`: drafter shapes timed on this machine (random weights: latency needs no training)."""

    target: str = "default"
    budget: str = "15M"  # non-embedding parameters of the equal-budget shapes
    layers: tuple[int, ...] = (1, 2, 3, 4, 6, 8, 12, 24)  # depths of the equal-budget shapes
    widths: tuple[int, ...] = (192, 384, 576, 768, 960)  # hidden sizes timed at depth `width_depth`
    width_depth: int = 2
    truncations: tuple[int, ...] = (1, 2, 4, 8)  # full-width k-layer truncations of the target
    vocabs: tuple[int, ...] = (0,)  # LM-head sizes to time each shape with; 0 = the target's vocabulary
    context: int = 1024  # KV cache positions (timing, KV bytes and the batch that fits)
    memory: str = "16GiB"  # memory budget for the largest batch that fits beside the target
    batches: tuple[int, ...] = (1, 4)
    warmup: int = 3
    repeats: int = 10
    seed: int = 0
    dtype: str = "fp32"
    device: str = "cpu"
    backend: str = "lean"  # lean | llama.cpp (shapes written as GGUF files at gguf_quant)
    gguf_quant: str = "f32"
    threads: int | None = None

    def __post_init__(self):
        _check_gguf_quant(self.gguf_quant)
        if self.backend not in ("lean", "llama.cpp"):
            raise DraftwiseError(f"sweep runs on the lean or llama.cpp engine, not {self.backend!r}")
        for name in ("layers", "widths", "truncations", "vocabs", "batches"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("layers", "truncations", "batches"):
            _positive(name, getattr(self, name))
        if any(w < 1 for w in self.widths) or any(v < 0 for v in self.vocabs) or self.width_depth < 1:
            raise DraftwiseError("widths and width_depth must be >= 1, vocabs >= 0 (0 = the target's)")
        if self.context < 1 or self.repeats < 1:
            raise DraftwiseError("context and repeats must be >= 1")


@dataclass(frozen=True)
class PruneConfig:
    """`draftwise prune`: a drafter of an exact shape carved out of the target (see stages/prune)."""

    target: str = "default"
    shape: str = ""  # "layers=3,hidden=576,heads=9,kv_heads=3,ffn=1536"; dimensions left out keep the target's
    method: str = "importance"  # importance | l0
    calib_tokens: int = 2048  # target-generated tokens from the train split
    calib_suites: str = "all"
    max_new_tokens: int = 64  # per calibration continuation
    max_prompt_tokens: int = 192
    elimination_tokens: int = 512  # scored positions the layer elimination uses (importance; whole calibration rows)
    layer_criterion: str = "tvd"  # tvd | kl: what the layer elimination minimises
    l0_steps: int = 60
    draft_vocab: int = 0  # also write reduced/: the head cut to the N hottest tokens of `vocab_data` (0 = no)
    vocab_data: str | None = None  # a gen-data run folder (train split) for the token frequencies
    batch_size: int = 8
    seed: int = 0
    dtype: str = "fp32"
    device: str = "cpu"
    threads: int | None = None

    def __post_init__(self):
        if self.method not in ("importance", "l0"):
            raise DraftwiseError(f"unknown pruning method {self.method!r}: choose importance or l0")
        if self.layer_criterion not in ("tvd", "kl"):
            raise DraftwiseError(f"unknown layer criterion {self.layer_criterion!r}: choose tvd or kl")
        if self.draft_vocab and not self.vocab_data:
            raise DraftwiseError("--draft-vocab needs --vocab-data (a gen-data run folder: token frequencies)")
        if min(self.calib_tokens, self.max_new_tokens, self.elimination_tokens, self.batch_size, self.l0_steps) < 1:
            raise DraftwiseError("calib_tokens, max_new_tokens, elimination_tokens, batch_size and l0_steps must be >= 1")


@dataclass(frozen=True)
class AgreeConfig:
    """`draftwise agree`: teacher-forced top-1 agreement of a drafter with the target's greedy continuations."""

    target: str = "default"
    drafter: str = ""
    suites: str = "all"
    split: str = "eval"
    limit: int = 60
    max_new_tokens: int = 64
    max_prompt_tokens: int = 256
    gammas: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8)
    batch_size: int = 8
    dtype: str = "fp32"
    device: str = "cpu"
    backend: str = "auto"  # the engine both models run on (llama.cpp: GGUF files, see models.llamacpp_load)
    gguf_quant: str = "f32"
    threads: int | None = None

    def __post_init__(self):
        _check_gguf_quant(self.gguf_quant)
        object.__setattr__(self, "gammas", tuple(self.gammas))
        _positive("gammas", self.gammas)
        if not self.drafter:
            raise DraftwiseError("agree needs a drafter (--drafter)")
        if min(self.limit, self.max_new_tokens, self.batch_size) < 1:
            raise DraftwiseError("limit, max_new_tokens and batch_size must be >= 1")


RUNTIME_FORMS = (f"lean:{{{','.join(PRECISIONS)}}}, llama.cpp (the target's own GGUF) or "
                 f"llama.cpp:{{{','.join(GGUF_QUANTS)}}}")


def check_runtime(name: str) -> tuple[str, str | None]:
    """(engine, precision or None) of a runtime name (`stages.quality`); an unknown one is refused in one line."""
    engine, _, precision = name.partition(":")
    if engine == "lean" and precision in PRECISIONS:
        return engine, precision
    if engine == "llama.cpp" and (precision in GGUF_QUANTS or name == "llama.cpp"):
        return engine, precision or None
    raise DraftwiseError(f"unknown runtime {name!r}: choose from {RUNTIME_FORMS}")


@dataclass(frozen=True)
class QualityConfig:
    """`draftwise quality`: each runtime's top-1 agreement with, and NLL beside, the target on the lean engine at fp32,
    teacher-forced on eval prompt texts (stages/quality: the runtime names and what they run)."""

    target: str = "default"
    runtimes: tuple[str, ...] = ("lean:int8", "llama.cpp")  # lean:PRECISION, llama.cpp, llama.cpp:QUANT (or a comma
    # string of them, as the CLI gives it)
    suites: str = "all"
    limit: int = 24  # eval prompts (round-robin over suites and categories)
    max_prompt_tokens: int = 256  # longer prompts are skipped
    threads: int | None = None  # torch (and llama.cpp) threads; None = torch's default

    def __post_init__(self):
        runtimes = self.runtimes.split(",") if isinstance(self.runtimes, str) else self.runtimes
        object.__setattr__(self, "runtimes", tuple(r.strip() for r in runtimes if r.strip()))
        if not self.runtimes:
            raise DraftwiseError("give at least one runtime to compare with fp32 (e.g. lean:int8,llama.cpp)")
        for r in self.runtimes:
            check_runtime(r)
        twice = [r for i, r in enumerate(self.runtimes) if r in self.runtimes[:i]]
        if twice:
            raise DraftwiseError(f"runtime {twice[0]!r} is given twice")
        if self.limit < 1 or self.max_prompt_tokens < 2:
            raise DraftwiseError(f"limit must be >= 1 and max_prompt_tokens >= 2, got {self.limit}, "
                                 f"{self.max_prompt_tokens}")
        if self.threads is not None and self.threads < 1:
            raise DraftwiseError(f"threads must be >= 1, got {self.threads}")


@dataclass(frozen=True)
class GenDataConfig:
    """`draftwise gen-data`: the target's continuations of train prompts, with its top-k distribution."""

    target: str = "default"
    suites: str = "all"
    prompts: str | None = None  # extra prompts from a user file (eval-split texts are dropped)
    max_new_tokens: int = 128
    temperatures: tuple[float, ...] = (0.0, 1.0)
    topk: int = 32
    max_prompt_tokens: int = 512
    limit: int | None = None  # prompts (before temperatures multiply them)
    skip: int = 0  # prompts passed over first (a second run continues where a first one's limit stopped)
    shard_size: int = 64  # sequences per shard
    batch_size: int = 16
    seed: int = 0
    dtype: str = "fp32"
    device: str = "cpu"
    threads: int | None = None

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

    target: str = "default"
    drafter: str = ""
    data: str = ""  # a gen-data run folder
    loss: str = "tvd"  # fkl | rkl | tvd | jsd
    minutes: float | None = 10.0  # training-time budget (ignored when tokens is set)
    tokens: int | None = None  # budget in trained (continuation) positions
    lr: float = 1e-3
    batch_size: int = 8  # sequences per micro-batch
    grad_accum: int = 1
    max_len: int = 320  # tokens per sequence (long prompts are cut from the left)
    train_embeddings: bool = False  # the (tied) embedding and LM head are frozen by default
    draft_vocab: int = 0  # also write reduced/: the head cut to the N hottest tokens of `data` (0 = no)
    on_policy_every: int = 0  # every n-th step on-policy (drafter generates, target scores); 0 = off
    on_policy_tokens: int = 32
    eval_every: int = 25
    checkpoint_every: int = 25
    eval_prompts: int = 32
    eval_tokens: int = 48
    eval_suites: str = "all"
    seed: int = 0
    dtype: str = "fp32"
    device: str = "cpu"
    threads: int | None = None

    def __post_init__(self):
        from .stages.losses import LOSSES

        if self.loss not in LOSSES:
            raise DraftwiseError(f"unknown loss {self.loss!r}: choose from {', '.join(LOSSES)}")
        if not self.drafter or not self.data:
            raise DraftwiseError("distill needs --drafter and --data (a gen-data run folder)")
        if self.tokens is not None:
            object.__setattr__(self, "minutes", None)
        if not (self.tokens or self.minutes):
            raise DraftwiseError("give a budget: --minutes M or --tokens N")
        if min(self.batch_size, self.grad_accum, self.max_len, self.eval_every, self.checkpoint_every) < 1 or self.lr <= 0:
            raise DraftwiseError("batch_size, grad_accum, max_len, eval_every, checkpoint_every and lr must be positive")


@dataclass(frozen=True)
class DesignConfig:
    """`draftwise design`: candidates → prune → distill → agree → profile → lookups → bench → select → report → export.

    `minutes` is the whole run's budget (`plan`: every stage sized to the time left, from timings measured as it goes;
    stages/design/plan.py); the counts below are the sizes at full scale. `plan=False`: every stage at these sizes,
    `minutes` sizing only the data generated and the distillation per candidate.
    """

    target: str = "default"
    minutes: float = 30.0
    plan: bool = True
    wide_layers: tuple[int, ...] = ()  # override: k full-width layers and their twin (default: shapes from the sweep)
    budget: str = ""  # drafters' non-embedding parameters (e.g. 7M); default: the target's first 2 layers' worth
    narrow_factor: int = 3  # deep-narrow twin: heads, KV heads and FFN ÷ f, layers × f (equal non-embedding params)
    drafter: str | None = None  # an optional user drafter, benchmarked beside the candidates
    lookups: bool = True  # also n-gram and suffix lookup drafters and the hybrid of the best model drafter with one
    scheduler: bool = True  # with lookups: each tuned lookup's variant under the round scheduler is a candidate too
    loss: str = "fkl"
    temperatures: tuple[float, ...] = (0.0, 0.5, 1.0)
    bench_suites: str = "all"  # every packaged suite: TAR and speedup per task
    bench_limit: int = 18  # eval prompts of the selection grid (round-robin over suites: 2 per suite)
    refine_limit: int = 9  # eval prompts of the γ-neighbour, temperature and batch benchmarks
    headline_limit: int = 8  # spec_bench eval prompts of the headline run (SD vs AR vs transformers)
    tune_prompts: int = 27  # eval prompts whose target text the lookup settings are replayed on
    corpus_gain: float = 0.01  # extend gen-data once if doubling the suffix corpus last gained this much (predicted)
    max_new_tokens: int = 96
    accuracy_items: int = 30  # MMLU and HellaSwag eval items per model for the accuracy sanity check
    draft_vocabs: tuple[int, ...] = (32768, 16384, 8192, 4096)  # reduced draft heads tried on the chosen drafter
    adaptive: bool = True  # also measure adaptive lookahead against the static γ*
    select_repeats: int = 1  # extra interleaved passes over the same prompts when options tie within noise
    memory: str = "1GiB"  # budget for target + drafter weights and both KV caches: the largest batch that fits with SD on
    context: int = 1024  # KV positions per sequence in that footprint
    batch_cap: int = 8  # the largest batch benchmarked here (the feasible batch is capped to it, and the report says so)
    rows: tuple[str, ...] = ("lean", "lean-int8", "llama.cpp")  # the runtimes given a verdict each (lean-int8: the lean
    # engine at int8, a lossy choice; llama.cpp: the target's own GGUF); `--engines` is its old flag
    gguf_quants: tuple[str, ...] = ()  # further llama.cpp rows: the target written at these precisions (lossy choices)
    llama_server: str | None = None  # the llama-server binary of the llama.cpp rows' built-ins (None: PATH, .venv/bin)
    seed: int = 0
    dtype: str = "fp32"
    device: str = "cpu"
    threads: int | None = None

    def __post_init__(self):
        from .cost import parse_count

        for name in ("rows", "gguf_quants"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for q in self.gguf_quants:
            _check_gguf_quant(q)
        if self.dtype == "int8":
            raise DraftwiseError("design builds and trains its candidates at a float precision (--dtype fp32, bf16 or "
                                 "fp16); the lean engine at int8 is a row of its own: --rows lean,lean-int8")
        if "lean" not in self.rows or set(self.rows) - {"lean", "lean-int8", "llama.cpp"}:
            raise DraftwiseError(f"rows must include lean (where candidates are built) and may add lean-int8 and "
                                 f"llama.cpp, got {','.join(self.rows)}")
        if self.gguf_quants and "llama.cpp" not in self.rows:
            raise DraftwiseError("gguf_quants are llama.cpp rows: add llama.cpp to rows")

        object.__setattr__(self, "wide_layers", tuple(self.wide_layers))
        object.__setattr__(self, "draft_vocabs", tuple(self.draft_vocabs))
        _positive("draft_vocabs", self.draft_vocabs)
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        _positive("wide_layers", self.wide_layers)
        if self.minutes <= 0:
            raise DraftwiseError(f"minutes must be > 0, got {self.minutes}")
        if self.select_repeats < 0:
            raise DraftwiseError(f"select_repeats must be >= 0, got {self.select_repeats}")
        if self.narrow_factor < 2:
            raise DraftwiseError(f"narrow_factor must be >= 2, got {self.narrow_factor}")
        if 0.0 not in self.temperatures or min(self.temperatures) < 0:
            raise DraftwiseError("temperatures must include 0 (the greedy headline) and be >= 0")
        if min(self.bench_limit, self.refine_limit, self.headline_limit, self.tune_prompts, self.max_new_tokens,
               self.accuracy_items) < 1:
            raise DraftwiseError("bench_limit, refine_limit, headline_limit, tune_prompts, max_new_tokens and "
                                 "accuracy_items must be >= 1")
        if self.corpus_gain < 0:
            raise DraftwiseError(f"corpus_gain must be >= 0, got {self.corpus_gain}")
        if self.budget and parse_count(self.budget) < 1:
            raise DraftwiseError(f"budget must be a positive count (e.g. 7M), got {self.budget!r}")
        if parse_count(self.memory) < 1 or min(self.context, self.batch_cap) < 1:
            raise DraftwiseError(f"memory, context and batch_cap must be >= 1, got {self.memory}, {self.context}, "
                                 f"{self.batch_cap}")


def to_dict(config) -> dict[str, Any]:
    return {"stage": type(config).__name__, **dataclasses.asdict(config)}


def from_dict(cls, data: dict[str, Any]):
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - fields - {"stage"}
    if unknown:
        raise DraftwiseError(f"unknown {cls.__name__} field(s): {', '.join(sorted(unknown))}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields})


def load(cls, path: Path):
    return from_dict(cls, json.loads(path.read_text()))
