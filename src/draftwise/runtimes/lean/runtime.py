"""The lean runtime's entry in `runtimes.registry.RUNTIMES`: draftwise's own forward, loaded by the checkpoint loader it
shares with transformers."""

from __future__ import annotations

from ...timing import machine
from .. import checkpoint
from ..base import Model, ModelOptions
from ..hf.model import bytes_per_value
from . import activations, int8, kernels, q4


class Lean:
    name = "lean"
    lm_heads = True  # its LM head is timed alone (profile)
    cpu_only = False
    file_drafters = False  # drafters are built in memory (a layer subset shares the target's weights)
    features = True  # hands out the target's hidden states (a feature head reads them)
    reduced_heads = True  # the drafter's head rows mapped to the target's ids

    def load(self, spec: str, options: ModelOptions) -> Model:
        return checkpoint.load(spec, options)

    def load_drafter(self, spec: str, target: Model, options: ModelOptions) -> Model:
        return checkpoint.load_drafter(spec, target, options)

    def engine(self, model: Model, options: ModelOptions) -> str:
        """The code path a timing measures: the integer matrices' instruction set, the C kernels, torch.compile."""
        name = model.backend
        if options.dtype in (int8.NAME, q4.NAME):  # which path the integer matrices take (torch's: the same, slower)
            a8 = "-a8" if options.dtype == q4.NAME and activations.bits_of(model.lm) == 8 else ""
            return f"{name}+{options.dtype}-{kernels.route().short()}{a8}"
        if options.device == "cpu" and options.dtype == "fp32" and not options.compile and kernels.kernel_available():
            name += "+c-kernels"  # the transformers fallback's linear layers run on them too (`hf.route_linears`)
        return name + ("+compile" if options.compile else "")

    def stamp(self, model: Model, options: ModelOptions) -> dict:
        return machine(options.device, options.dtype, self.engine(model, options))

    def bytes_per_value(self, options: ModelOptions) -> float:
        """Bytes of one KV value (the sweep's memory model)."""
        return bytes_per_value(options.dtype)


RUNTIME = Lean()
