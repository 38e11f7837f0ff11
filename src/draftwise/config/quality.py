"""`draftwise quality`'s config and the runtime names it compares."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DraftwiseError
from .base import GGUF_QUANTS, PRECISIONS, opt, opt_target, opt_threads

ACTIVATION_FORMS = ("q4-a8", "q4-a16")  # lean q4 at 8-bit activations per block, or 16 per row (`lean.activations`)
RUNTIME_FORMS = (
    f"lean:{{{','.join(PRECISIONS + ACTIVATION_FORMS)}}}, llama.cpp (the target's own GGUF) or "
    f"llama.cpp:{{{','.join(GGUF_QUANTS)}}}"
)


def asked_activations(name: str) -> int | None:
    """The activation bits a runtime name asks lean q4 to run at (lean:q4-a8: 8), or None: the file's own choice."""
    _, _, precision = name.partition(":")
    return int(precision.partition("-a")[2]) if precision in ACTIVATION_FORMS else None


def check_runtime(name: str) -> tuple[str, str | None]:
    """(engine, precision or None) of a runtime name (`stages.quality`); an unknown one is refused in one line."""
    engine, _, precision = name.partition(":")
    if engine == "lean" and (precision in PRECISIONS or precision in ACTIVATION_FORMS):
        return engine, precision
    if engine == "llama.cpp" and (precision in GGUF_QUANTS or name == "llama.cpp"):
        return engine, precision or None
    raise DraftwiseError(f"unknown runtime {name!r}: choose from {RUNTIME_FORMS}")


@dataclass(frozen=True)
class QualityConfig:
    """`draftwise quality`: each runtime's top-1 agreement with, and NLL beside, the target on the lean engine at fp32,
    teacher-forced on eval prompt texts (stages/quality: the runtime names and what they run)."""

    target: str = opt_target()
    runtimes: tuple[str, ...] = opt(
        ("lean:int8", "llama.cpp"),  # (or a comma string of them)
        "comma list, each compared with the fp32 lean reference: "
        f"lean:{'|'.join(PRECISIONS + ACTIVATION_FORMS)} (q4-a8: 8-bit activations per block; measured on a GGUF "
        "file, its verdict is kept for that file's later loads here), llama.cpp (the target's own GGUF: Q4_1 for "
        "'default') or "
        f"llama.cpp:{'|'.join(GGUF_QUANTS)} (the target written as GGUF at that precision)",
    )
    suites: str = opt("all", "packaged suites whose eval prompts are scored: a name, a comma list or 'all'")
    limit: int = opt(24, "eval prompts (round-robin over suites and categories)")
    max_prompt_tokens: int = opt(256, "longer prompts are skipped")
    threads: int | None = opt_threads()

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
            raise DraftwiseError(
                f"limit must be >= 1 and max_prompt_tokens >= 2, got {self.limit}, {self.max_prompt_tokens}"
            )
        if self.threads is not None and self.threads < 1:
            raise DraftwiseError(f"threads must be >= 1, got {self.threads}")
