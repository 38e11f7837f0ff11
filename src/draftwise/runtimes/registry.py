"""The runtimes' registry (`RUNTIMES`) and what every stage calls on it: `load`, `load_drafter`, `engine`, `stamp`,
`describe`, `fill_cache`. The runtimes themselves are described in the package's docstring."""

from __future__ import annotations

import torch

from ..errors import DraftwiseError
from ..gguf.read import quant_name
from ..targets.fingerprint import check_compatible
from .base import Model, ModelOptions, Runtime
from .hf.model import torch_dtype
from .hf.runtime import RUNTIME as TRANSFORMERS
from .lean import int8, q4
from .lean.runtime import RUNTIME as LEAN
from .llamacpp.load import RUNTIME as LLAMACPP

RUNTIMES: dict[str, Runtime] = {r.name: r for r in (LEAN, TRANSFORMERS, LLAMACPP)}
AUTO = "auto"  # lean where the architecture allows, else transformers (the lean runtime's loader decides)


def register(runtime: Runtime) -> Runtime:
    """Add a runtime: its name becomes a backend every stage accepts."""
    RUNTIMES[runtime.name] = runtime
    return runtime


def backends() -> tuple[str, ...]:
    return (AUTO, *RUNTIMES)


def runtime(backend: str) -> Runtime:
    """The runtime a backend names (`auto`: the lean runtime, which falls back to transformers itself)."""
    if backend == AUTO:
        return LEAN
    if backend not in RUNTIMES:
        raise DraftwiseError(f"unknown backend {backend!r}: choose one of {', '.join(backends())}")
    return RUNTIMES[backend]


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DraftwiseError(f"device {device!r} asked for, but torch sees no CUDA GPU on this machine")
    if not (device == "cpu" or device.startswith("cuda")):
        raise DraftwiseError(f"unknown device {device!r}: use cpu, cuda or cuda:N")


def _checked(options: ModelOptions) -> Runtime:
    """The runtime `options` ask for, once the device and precision they name are known to run on it (one line)."""
    chosen = runtime(options.backend)
    _check_device(options.device)
    torch_dtype(options.dtype)  # an unknown precision: one line, before anything loads
    if options.dtype in (int8.NAME, q4.NAME):
        int8.check_supported(options.device, options.backend, options.dtype)
    if options.device != "cpu" and chosen.cpu_only:
        raise DraftwiseError(f"the {chosen.name} backend runs on the CPU here (device cpu)")
    return chosen


def load(spec: str, options: ModelOptions = ModelOptions()) -> Model:
    """Load a target or drafter on `options.backend`: 'default', a .gguf file, a local Hugging Face directory, or
    `random:...` (see `targets`)."""
    return _checked(options).load(spec, options)


def load_drafter(spec: str, target: Model, options: ModelOptions = ModelOptions()) -> Model:
    """A drafter for `target` on the target's runtime: a checkpoint (as `load`), `layers:i,j,...` of the target
    itself, or `random:...`; refused in one line where it would run on another runtime or speak another vocabulary."""
    chosen = _checked(options)
    if chosen is not runtime(target.backend) and not {chosen.name, target.backend} <= {LEAN.name, TRANSFORMERS.name}:
        raise DraftwiseError(
            f"drafter {spec}: target and drafter run on one engine (target: {target.backend}, "
            f"drafter: {options.backend})"
        )
    drafter = chosen.load_drafter(spec, target, options)
    check_compatible(target, drafter)
    return drafter


def engine(model: Model, options: ModelOptions) -> str:
    """The code path a timing of `model` measures (its runtime says: the C kernels, int8 paths, torch.compile)."""
    return runtime(model.backend).engine(model, options)


def stamp(model: Model, options: ModelOptions) -> dict:
    """What a timing of `model` is taken on (`timing.machine`, and what its runtime adds)."""
    return runtime(model.backend).stamp(model, options)


def fill_cache(lm, batch: int, context: int, room: int, generator: torch.Generator) -> None:
    """Make `lm`'s cache hold `context` positions of `batch` rows, with `room` more to time passes at `context`. A
    preallocated cache (the lean forward's) costs the same whatever it holds; a DynamicCache or llama.cpp's cache must
    really hold them (random tokens)."""
    lm.reset(batch, context + room)
    if not getattr(lm, "preallocated_cache", False):
        lm.forward(torch.randint(0, lm.vocab_size, (batch, context), generator=generator).to(lm.device), 0, 0)


def describe(model: Model) -> dict:
    """What a run folder records about a model."""
    return {
        "spec": model.name,
        "path": str(model.path) if model.path else None,
        "backend": model.backend,
        "model_type": model.config.model_type,
        "layers": model.config.num_hidden_layers,
        "hidden_size": model.config.hidden_size,
        "vocab_size": model.vocab_size,
        "load_seconds": round(model.load_seconds, 3),
        **({"gguf": str(model.gguf), "quant": quant_name(model.gguf)} if model.gguf else {}),
    }
