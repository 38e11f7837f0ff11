"""What every stage config shares: how a field declares its option (`opt`, `internal`; the CLI is derived from
them, cli/options.py), the options most stages have, the names of precisions, engines and losses, the checks several
configs make, and a config's dict form (config.json)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from ..errors import DraftwiseError

GGUF_QUANTS = ("f32", "f16", "q8_0")
# --dtype: a float dtype, or the lean engine's int8 (int8 weights, int16 activations per token; lossy, labelled)
PRECISIONS = ("fp32", "bf16", "fp16", "int8", "q4")  # q4: a GGUF file's own 4-bit blocks on the lean engine
INTEGER = ("int8", "q4")  # deployment precisions: integer weights the int8 kernel computes, no gradients through them
BACKENDS = ("auto", "lean", "transformers", "llama.cpp")
LOSSES = ("fkl", "rkl", "tvd", "jsd")  # distillation losses (stages.losses computes each)
_CLI_KEYS = {"flag", "aliases", "parse", "choices", "metavar", "repeat", "required", "exclusive", "positional"}


def opt(default, help: str, **cli) -> Any:
    """A field that is a user option: its default, its help, and how the command line gives it where that is not
    `--field-name VALUE` (cli/options.py): flag, aliases, parse (one value's text -> value), choices, metavar, repeat
    (the flag may be given again; its values add up), required, exclusive (a group: one of its flags at most),
    positional."""
    unknown = set(cli) - _CLI_KEYS
    if unknown:
        raise TypeError(f"unknown option setting(s): {', '.join(sorted(unknown))}")
    return dataclasses.field(default=default, metadata={"help": help, **cli})


def internal(default, why: str) -> Any:
    """A field that is no user option: derived from others, or set by the stage that builds the config."""
    return dataclasses.field(default=default, metadata={"internal": why})


def check_budget(config) -> None:
    """A training budget (`minutes` or `tokens`, an exclusive pair of options): `tokens` wins when given (it is
    deterministic), and one of them must be set."""
    if config.tokens is not None:
        object.__setattr__(config, "minutes", None)
    if not (config.tokens or config.minutes):
        raise DraftwiseError("give a budget: --minutes M or --tokens N")


def user_fields(cls) -> list[dataclasses.Field]:
    """The fields of a config class that are user options (each a flag of its command)."""
    return [f for f in dataclasses.fields(cls) if "internal" not in f.metadata]


def all_if_zero(text: str) -> int | None:
    """A --limit's text: 0 = all (None)."""
    try:
        return int(text) or None
    except ValueError:
        raise ValueError(f"expected an integer (0 = all), got {text!r}") from None


# the options most stages share (a function each: a dataclass field belongs to one class)
def opt_target():
    return opt(
        "default",
        "'default', a named real model (qwen2.5-coder-1.5b, qwen2.5-coder-0.5b), a local HF model directory or a "
        ".gguf file",
    )


def opt_seed():
    return opt(0, "random seed (sampling, shuffles, random weights)")


def opt_dtype():
    return opt(
        "fp32",
        "precision: fp32, bf16, fp16, int8 — the lean engine with int8 weights (blocks of 32) and "
        "int16 activations per token, a lossy choice whose cost `draftwise quality` measures — or q4: "
        "the lean engine on a GGUF target's own 4-bit blocks (Q4_0, Q4_1, Q4_K), the rest at int8",
        choices=PRECISIONS,
    )


def opt_device():
    return opt("cpu", "cpu, cuda or cuda:N")


def opt_threads():
    return opt(None, "torch (and llama.cpp) threads (default: torch's choice)")


def opt_backend(default: str = "auto", choices: tuple[str, ...] = BACKENDS):
    return opt(
        default,
        "the engine: lean (draftwise's), transformers, or llama.cpp (a GGUF at its own quantization; "
        "'default' runs the Q4_1 file it ships as)",
        choices=choices,
    )


def opt_gguf_quant():
    return opt(
        "f32", "llama.cpp: the precision of GGUF files draftwise writes (drafters, HF-dir targets)", choices=GGUF_QUANTS
    )


def opt_compile():
    return opt(False, "torch.compile the lean forward's layers (helps on launch-bound GPUs at batch 1)")


def check_gguf_quant(quant: str) -> None:
    if quant not in GGUF_QUANTS:
        raise DraftwiseError(f"unknown GGUF quantization {quant!r}: choose one of {', '.join(GGUF_QUANTS)}")


def check_trainable(command: str, dtype: str) -> None:
    """A stage that takes gradients through its models runs at a float dtype: int8 is a deployment precision."""
    if dtype in INTEGER:
        raise DraftwiseError(
            f"{command} takes gradients through the models: run it at fp32, bf16 or fp16 ({dtype} is a "
            "deployment precision: bench, agree, profile, quality)"
        )


def check_positive(name: str, values) -> None:
    bad = [v for v in values if v < 1]
    if bad:
        raise DraftwiseError(f"{name} must all be >= 1, got {bad[0]}")


def to_dict(config) -> dict[str, Any]:
    return {"stage": type(config).__name__, **dataclasses.asdict(config)}


def from_dict(cls, data: dict[str, Any]):
    """A config from its dict form (config.json); a field a later version renamed (`cls.RENAMED`: old -> new) is read
    under its new name, so an older run folder still resumes."""
    renamed = getattr(cls, "RENAMED", {})
    data = {renamed.get(k, k): v for k, v in data.items()}
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - fields - {"stage"}
    if unknown:
        raise DraftwiseError(f"unknown {cls.__name__} field(s): {', '.join(sorted(unknown))}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in fields})


def load(cls, path: Path):
    return from_dict(cls, json.loads(path.read_text()))


def like(cls, name: str, **changes) -> Any:
    """The option `name` of config class `cls` again, for another config (one help text for one meaning); `changes`
    replace its default or CLI settings."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    meta = {**f.metadata, **{k: v for k, v in changes.items() if k != "default"}}
    return dataclasses.field(default=changes.get("default", f.default), metadata=meta)
