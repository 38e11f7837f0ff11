"""A runtime as a plug-in, in one module: `recompute` runs a transformers model with no KV cache at all, computing
the whole sequence again on every forward (what a runtime without a cache would do). It answers everything
draftwise asks of a runtime (`runtimes.base.Runtime`); importing the module registers it as `--backend recompute`."""

from __future__ import annotations

import torch

from draftwise.runtimes.base import Model, ModelOptions
from draftwise.runtimes.hf.model import from_pretrained, step_bytes
from draftwise.runtimes.registry import register
from draftwise.targets.checkpoint import config_and_tokenizer
from draftwise.targets.source import resolve
from draftwise.timing import machine


class RecomputeLM:
    def __init__(self, model):
        self.model, self.vocab_size, self.device, self.dtype = model, model.config.vocab_size, model.device, model.dtype

    def reset(self, batch: int, length: int) -> None:
        self.ids = torch.zeros(batch, 0, dtype=torch.long)

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, pos: int, n_logits: int | None = None, start=None) -> torch.Tensor:
        self.ids = torch.cat([self.ids[:, :pos], ids], dim=1)  # rolling back is forgetting what lies past `pos`
        logits = self.model(input_ids=self.ids).logits[:, pos:]
        return logits[:, logits.shape[1] - n_logits :] if n_logits else logits[:, :0] if n_logits == 0 else logits

    def weight_bytes(self) -> int:
        return step_bytes(self.model)


class Recompute:
    name, lm_heads, cpu_only, file_drafters, features, reduced_heads = "recompute", False, True, False, False, False

    def load(self, spec: str, options: ModelOptions) -> Model:
        path = resolve(spec)
        config, tokenizer = config_and_tokenizer(path, options)
        lm = RecomputeLM(from_pretrained(path, torch.float32, "cpu"))
        return Model(
            spec, config, tokenizer, lm, self.name, path, 0.0, lambda: from_pretrained(path, torch.float32, "cpu")
        )

    def load_drafter(self, spec: str, target: Model, options: ModelOptions) -> Model:
        return self.load(spec, options)

    def engine(self, model: Model, options: ModelOptions) -> str:
        return self.name

    def stamp(self, model: Model, options: ModelOptions) -> dict:
        return machine(options.device, options.dtype, self.name)

    def bytes_per_value(self, options: ModelOptions) -> float:
        return 4


RUNTIME = register(Recompute())
