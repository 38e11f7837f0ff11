"""`draftwise design`'s config (the whole study), and `export-gguf`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import DraftwiseError
from ..units import parse_count
from .base import (
    GGUF_QUANTS,
    INTEGER,
    LOSSES,
    PRECISIONS,
    check_gguf_quant,
    check_positive,
    opt,
    opt_device,
    opt_seed,
    opt_target,
    opt_threads,
)

AUTO = "auto"  # the study's precision chosen by the cost model (`design.study`)


@dataclass(frozen=True)
class DesignConfig:
    """`draftwise design`: candidates → prune → distill → agree → profile → lookups → bench → select → report → export.

    `minutes` is the whole run's budget (`plan`: every stage sized to the time left, from timings measured as it goes;
    design/plan.py); the counts below are the sizes at full scale. `plan=False`: every stage at these sizes,
    `minutes` sizing only the data generated and the distillation per candidate.
    """

    RENAMED: ClassVar[dict[str, str]] = {"engines": "rows"}  # config.json of older run folders

    target: str = opt_target()
    minutes: float = opt(
        30.0,
        "the whole run's budget: every stage is sized to it from timings measured as the run "
        "goes, optional stages left out when it is short (the report says which)",
    )
    plan: bool = opt(
        True,
        "run every stage at the sizes given here instead (--minutes then sizes only data and distillation)",
        flag="--fixed-sizes",
    )
    wide_layers: tuple[int, ...] = opt(
        (), "override the cost model's shapes: k full-width layers and their deep-narrow twin"
    )
    budget: str = opt("", "drafters' non-embedding parameters, e.g. 7M (default: the target's first 2 layers')")
    narrow_factor: int = opt(
        3, "deep-narrow twin: layers × f; heads, KV heads and FFN ÷ f (equal non-embedding parameters)"
    )
    drafter: str | None = opt(None, "your own drafter, benchmarked beside the candidates")
    lookups: bool = opt(True, "model drafters only (no n-gram, suffix or hybrid candidates)")
    feature_drafter: bool = opt(
        True, "no feature-level drafter (an EAGLE-style head on the target's features, trained on the teacher data)"
    )
    text: str | None = opt(
        None, "your own text for the teacher data (.jsonl with 'text' fields, or plain text), scored before the suites"
    )
    scheduler: bool = opt(
        True, "no scheduled candidates (the tuned lookups under the round scheduler, calibrated on the target's text)"
    )
    loss: str = opt("fkl", "the distillation loss (stages.losses)", choices=LOSSES)
    prompts: str | None = opt(
        None,
        "your traffic: JSONL of requests (prompt, turns or chat messages per line, optional max_tokens and "
        "temperature: an OpenAI request log's shape; a line without a temperature at 1.0, the OpenAI default), "
        "measured by the benchmarks and the verdict instead of the packaged suites at --temperatures",
    )
    temperatures: tuple[float, ...] = opt(
        (0.0, 1.0), "temperatures of the default traffic, each measured (0, the greedy selection, included)"
    )
    bench_suites: str = opt("all", "suites of the selection grid (TAR and speedup per task)")
    bench_limit: int = opt(18, "eval prompts of the selection grid (round-robin over suites: 2 per suite)")
    refine_limit: int = opt(9, "eval prompts of the γ, temperature and batch benchmarks")
    headline_limit: int = opt(8, "spec_bench eval prompts of the headline run (SD vs AR vs transformers)")
    tune_prompts: int = opt(27, "eval prompts whose target text tunes the lookup settings")
    corpus_gain: float = opt(
        0.01, "extend gen-data once when doubling the suffix corpus last gained at least this (predicted)"
    )
    max_new_tokens: int = opt(96, "tokens generated per prompt")
    accuracy_items: int = opt(30, "MMLU and HellaSwag eval items per model for the accuracy sanity check")
    draft_vocabs: tuple[int, ...] = opt((32768, 16384, 8192, 4096), "reduced draft heads tried on the chosen drafter")
    adaptive: bool = opt(True, "do not measure adaptive lookahead against the static γ*")
    select_repeats: int = opt(1, "extra interleaved passes over the same prompts when candidates tie within noise")
    memory: str = opt(
        "auto",
        "budget for target + drafter weights and KV caches: the largest batch that fits with SD on (auto: this "
        "machine's memory)",
    )
    context: int = opt(1024, "KV positions per sequence in that footprint")
    batch_cap: int = opt(
        8, "the largest batch benchmarked on this machine (the feasible batch is capped to it, and the report says so)"
    )
    rows: tuple[str, ...] = opt(
        ("lean", "lean-int8", "lean-q4", "llama.cpp"),
        "where verdicts are measured: lean (draftwise's engine at --dtype, where candidates "
        "are built), lean-int8 (the same engine at int8: a lossy choice, its quality measured), "
        "lean-q4 (the same engine on the target file's own 4-bit blocks, where it is a GGUF file with some) "
        "and llama.cpp (the target's own GGUF, at its quantization); the design's answer "
        "compares every one's choice with the fastest plain decoding of any of them",
        aliases=("--engines",),
    )
    gguf_quants: tuple[str, ...] = opt(
        (),
        "further llama.cpp rows: the target written at these precisions (comma "
        f"list of {', '.join(GGUF_QUANTS)}; each a lossy choice you make)",
    )
    llama_server: str | None = opt(
        None, "the llama-server binary of the llama.cpp rows (default: PATH, then .venv/bin)"
    )
    serve: bool = opt(
        True,
        "do not measure the answer's deploy command through draftwise serve's HTTP API (beside llama-server's plain "
        "decoding) after the export",
    )
    seed: int = opt_seed()
    dtype: str = opt(
        AUTO,
        "the precision the study runs the target at: auto (fp32 where the budget's plan at fp32 keeps every row; else "
        "the file's fastest lean precision, q4 or int8, candidates then taken as they are: design/study.py), or one "
        "of " + ", ".join(PRECISIONS),
        choices=(AUTO, *PRECISIONS),
    )
    device: str = opt_device()
    threads: int | None = opt_threads()

    @property
    def trains(self) -> bool:
        """Whether candidates are pruned and distilled: only at a float precision. A study at int8 or q4 (a target
        too big for an fp32 study in its budget) takes its candidates as they are: layers of the target, a small model
        of its family, lookups."""
        return self.dtype not in INTEGER

    def __post_init__(self):
        for name in ("rows", "gguf_quants"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for q in self.gguf_quants:
            check_gguf_quant(q)
        if not self.trains and (self.wide_layers or self.budget):
            raise DraftwiseError(
                f"a design at --dtype {self.dtype} takes its candidates as they are (pruning and distillation run at "
                "a float precision: --dtype fp32, bf16 or fp16); drop --wide-layers and --budget"
            )
        if "lean" not in self.rows or set(self.rows) - {"lean", "lean-int8", "lean-q4", "llama.cpp"}:
            raise DraftwiseError(
                f"rows must include lean (where candidates are built) and may add lean-int8, lean-q4 and "
                f"llama.cpp, got {','.join(self.rows)}"
            )
        if self.gguf_quants and "llama.cpp" not in self.rows:
            raise DraftwiseError("gguf_quants are llama.cpp rows: add llama.cpp to rows")

        object.__setattr__(self, "wide_layers", tuple(self.wide_layers))
        object.__setattr__(self, "draft_vocabs", tuple(self.draft_vocabs))
        check_positive("draft_vocabs", self.draft_vocabs)
        object.__setattr__(self, "temperatures", tuple(float(t) for t in self.temperatures))
        check_positive("wide_layers", self.wide_layers)
        if self.minutes <= 0:
            raise DraftwiseError(f"minutes must be > 0, got {self.minutes}")
        if self.select_repeats < 0:
            raise DraftwiseError(f"select_repeats must be >= 0, got {self.select_repeats}")
        if self.narrow_factor < 2:
            raise DraftwiseError(f"narrow_factor must be >= 2, got {self.narrow_factor}")
        if 0.0 not in self.temperatures or min(self.temperatures) < 0:
            raise DraftwiseError("temperatures must include 0 (the greedy headline) and be >= 0")
        if (
            min(
                self.bench_limit,
                self.refine_limit,
                self.headline_limit,
                self.tune_prompts,
                self.max_new_tokens,
                self.accuracy_items,
            )
            < 1
        ):
            raise DraftwiseError(
                "bench_limit, refine_limit, headline_limit, tune_prompts, max_new_tokens and "
                "accuracy_items must be >= 1"
            )
        if self.corpus_gain < 0:
            raise DraftwiseError(f"corpus_gain must be >= 0, got {self.corpus_gain}")
        if self.budget and parse_count(self.budget) < 1:
            raise DraftwiseError(f"budget must be a positive count (e.g. 7M), got {self.budget!r}")
        if (self.memory != "auto" and parse_count(self.memory) < 1) or min(self.context, self.batch_cap) < 1:
            raise DraftwiseError(
                f"memory, context and batch_cap must be >= 1, got {self.memory}, {self.context}, {self.batch_cap}"
            )


@dataclass(frozen=True)
class ExportGgufConfig:
    """`draftwise export-gguf`: a model written as a GGUF file llama.cpp runs, with the target's tokenizer
    (gguf.export; it refuses an unknown quantization)."""

    model: str = opt(
        "",
        "'default', a checkpoint or prune / distill run folder, a .gguf file, layers:i,j,... or "
        "random:... (of --target)",
        positional=True,
    )
    quant: str = opt("f32", f"{', '.join(GGUF_QUANTS)} (matrices; norms and biases stay f32)")
    target: str = opt(
        "default", "the target whose tokenizer metadata the file carries (copied from its GGUF when it has one)"
    )


@dataclass(frozen=True)
class ReportConfig:
    """`draftwise report`: a finished design folder's report.md and report.html rendered again from the folder alone
    (nothing reruns; a report whose code changed renders the old run's records anew)."""
