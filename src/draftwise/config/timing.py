"""The timing stages' configs: `profile`, `sweep` and `predict`."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DraftwiseError
from ..units import memory_budget
from .base import (
    check_gguf_quant,
    check_positive,
    opt,
    opt_backend,
    opt_compile,
    opt_device,
    opt_dtype,
    opt_gguf_quant,
    opt_seed,
    opt_target,
    opt_threads,
)


@dataclass(frozen=True)
class ProfileConfig:
    """`draftwise profile`: the target's AR step and verify passes, drafter steps and the LM head, timed here."""

    target: str = opt_target()
    drafters: tuple[str, ...] = opt(
        (),
        "a drafter to time (repeatable): a checkpoint, layers:i,j,... or any drafter spec",
        flag="--drafter",
        repeat=True,
    )
    depths: tuple[int, ...] = opt((1, 2, 4, 8, 16), "full-width k-layer truncations of the target, timed as drafters")
    gammas: tuple[int, ...] = opt((1, 2, 3, 4, 6, 8, 12, 16), "γ of the verify passes timed (γ + 1 tokens each)")
    batches: tuple[int, ...] = opt((1, 4, 8), "batch sizes timed", flag="--batch")
    context: int = opt(256, "positions already in the KV cache when a step is timed")
    warmup: int = opt(3, "untimed runs before each timing")
    repeats: int = opt(15, "timed runs of each step (the median is kept)")
    seed: int = opt_seed()
    dtype: str = opt_dtype()
    device: str = opt_device()
    backend: str = opt_backend()
    compile: bool = opt_compile()
    gguf_quant: str = opt_gguf_quant()
    threads: int | None = opt_threads()

    def __post_init__(self):
        check_gguf_quant(self.gguf_quant)
        for name in ("drafters", "depths", "gammas", "batches"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("depths", "gammas", "batches"):
            check_positive(name, getattr(self, name))
        if self.context < 1 or self.repeats < 1 or self.warmup < 0:
            raise DraftwiseError("context and repeats must be >= 1, warmup >= 0")


@dataclass(frozen=True)
class SweepConfig:
    """`draftwise sweep`: drafter shapes timed on this machine (random weights: latency needs no training)."""

    target: str = opt_target()
    budget: str = opt("15M", "non-embedding parameters of the equal-budget shapes")
    layers: tuple[int, ...] = opt((1, 2, 3, 4, 6, 8, 12, 24), "depths of the equal-budget shapes")
    widths: tuple[int, ...] = opt((192, 384, 576, 768, 960), "hidden sizes timed at --width-depth")
    width_depth: int = opt(2, "depth of the shapes --widths times")
    truncations: tuple[int, ...] = opt((1, 2, 4, 8), "full-width k-layer truncations of the target")
    vocabs: tuple[int, ...] = opt((0,), "LM-head sizes to time each shape with (0 = the target's)", flag="--vocab")
    context: int = opt(1024, "KV cache positions (timing, KV bytes and the batch that fits)")
    memory: str = opt("auto", "memory budget for the largest batch beside the target (auto: this machine's memory)")
    batches: tuple[int, ...] = opt((1, 4), "batch sizes timed", flag="--batch")
    warmup: int = opt(3, "untimed runs before each timing")
    repeats: int = opt(10, "timed runs of each shape (the median is kept)")
    seed: int = opt_seed()
    dtype: str = opt_dtype()
    device: str = opt_device()
    backend: str = opt_backend("lean", ("lean", "llama.cpp"))  # llama.cpp: shapes written as GGUF files at gguf_quant
    gguf_quant: str = opt_gguf_quant()
    threads: int | None = opt_threads()

    def __post_init__(self):
        check_gguf_quant(self.gguf_quant)
        if self.backend not in ("lean", "llama.cpp"):
            raise DraftwiseError(f"sweep runs on the lean or llama.cpp engine, not {self.backend!r}")
        for name in ("layers", "widths", "truncations", "vocabs", "batches"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        for name in ("layers", "truncations", "batches"):
            check_positive(name, getattr(self, name))
        if any(w < 1 for w in self.widths) or any(v < 0 for v in self.vocabs) or self.width_depth < 1:
            raise DraftwiseError("widths and width_depth must be >= 1, vocabs >= 0 (0 = the target's)")
        if self.context < 1 or self.repeats < 1 or memory_budget(self.memory) < 1:
            raise DraftwiseError(
                f"context, repeats and memory must be >= 1, got {self.context}, {self.repeats}, {self.memory}"
            )


@dataclass(frozen=True)
class PredictConfig:
    """`draftwise predict`: tokens/s per profiled drafter and γ, predicted from a profile run's timings and an
    acceptance, measured by a bench run or assumed i.i.d. (stages/predict)."""

    profile: str = opt("", "a profile run folder", required=True)
    bench: str | None = opt(
        None, "a bench run folder: measured acceptance of its drafter, and a check of the prediction"
    )
    alpha: float | None = opt(None, "assumed i.i.d. acceptance for drafters without measured acceptance")
    batch: int = opt(1, "the batch size predicted for (a profiled one)")
    gammas: tuple[int, ...] = opt((), "γ values to predict (default: the profiled ones)")

    def __post_init__(self):
        object.__setattr__(self, "gammas", tuple(self.gammas))
