"""transformers models: building them from our checkpoints, and running any of them behind the engine's interface.

`HFCausalLM` is the fallback for architectures the lean path does not cover: it keeps a `DynamicCache` and crops it
when the engine rolls back, so the engine sees the same `reset` / `forward(ids, pos, n_logits)` as with `LeanLM`.
The same builders give the baselines (`generate()`, assisted generation) their transformers models.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from ...config import PRECISIONS
from ...errors import DraftwiseError
from ..lean import int8, kernels, q4

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """The dtype a model's activations, KV cache and float weights are held in (int8, q4: fp32 around their integer
    matrices)."""
    if name in (int8.NAME, q4.NAME):
        return torch.float32
    if name not in DTYPES:
        raise DraftwiseError(f"unknown dtype {name!r}: choose one of {', '.join(PRECISIONS)}")
    return DTYPES[name]


def bytes_per_value(name: str) -> int:
    """Bytes of one KV value stored at precision `name` (4 fp32 and int8, 2 bf16/fp16)."""
    return torch_dtype(name).itemsize


def from_pretrained(path: Path, dtype: torch.dtype, device: str, trust_remote_code: bool = False):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()  # a per-tensor bar for a sub-second load is noise beside draftwise's own

    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, local_files_only=True, trust_remote_code=trust_remote_code, use_safetensors=True
    )
    return model.to(device).eval()


def from_state_dict(config, state_dict: dict[str, torch.Tensor], dtype: torch.dtype, device: str):
    """A transformers model of `config` holding exactly `state_dict` (a tied head may be absent from it)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise DraftwiseError(f"checkpoint does not fit its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if config.tie_word_embeddings:
        model.tie_weights()
    return model.to(device).eval()


def _kernel_linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return kernels.linear(x, module.weight, module.bias)


def route_linears(model) -> None:
    """Send every nn.Linear of `model` through `kernels.linear`: on a CPU in fp32 the C small-row kernel for a step or
    a verify pass (BLAS packs the whole weight matrix for a few rows: a 262k-row LM head read at a third of the
    memory speed), torch everywhere else (GPU, bf16, long prefill, autograd) — the same results, rows bitwise
    identical between a step and a verify pass."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = functools.partial(_kernel_linear, module)


def step_bytes(model) -> int:
    """Bytes of weights one decoding step of a transformers model reads (see `LeanLM.weight_bytes`): the input
    embedding only when it is the head too."""
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    seen, total = set(), 0
    for p in model.parameters():
        if (p is not embed or embed is head) and p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


class HFCausalLM:
    """The engine interface over a transformers causal LM (see `LeanLM` for the contract). Its linear layers run
    on draftwise's kernels (`route_linears`), so the model is the engine's own: baselines build their own twin."""

    def __init__(self, model):
        from transformers import DynamicCache

        route_linears(model)
        self.model = model
        self.config = model.config
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._new_cache = lambda: DynamicCache(config=model.config)
        self.cache = None
        self.max_len = 0

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    def weight_bytes(self) -> int:
        return step_bytes(self.model)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def reset(self, batch_size: int, max_len: int) -> None:
        self.cache, self.max_len, self.batch_size = self._new_cache(), max_len, batch_size
        self.cache.activate_past_recording()  # sliding-window layers keep what a rollback needs

    def kv_bytes(self) -> int:
        if self.cache is None:
            return 0
        return sum(
            t.numel() * t.element_size()
            for layer in self.cache.layers
            for t in (layer.keys, layer.values)
            if t is not None
        )

    @torch.inference_mode()
    def forward(
        self, ids: torch.Tensor, pos: int, n_logits: int | None = None, start: list[int] | None = None
    ) -> torch.Tensor:
        B, T = ids.shape
        if self.cache is None or pos + T > self.max_len:
            raise ValueError(f"cache holds {self.max_len} positions, need {pos + T}: call reset() first")
        surplus = self.cache.get_seq_length() - pos
        if surplus > 0:
            self.cache.crop(-surplus)  # roll back rejected positions
        out = self.model(
            input_ids=ids,
            cache=self.cache,
            use_cache=True,
            cache_position=torch.arange(pos, pos + T, device=ids.device),
            attention_mask=None
            if start is None
            else (
                torch.arange(pos + T, device=ids.device)[None] >= torch.tensor(start, device=ids.device)[:, None]
            ).long(),
            logits_to_keep=1 if n_logits == 0 else n_logits or 0,  # transformers reads 0 as "all"
        )
        return out.logits[:, :0] if n_logits == 0 else out.logits  # [B, n, V]

    @torch.inference_mode()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm and LM head: hidden states [B, T, D] -> logits [B, T, V]."""
        return self.model.get_output_embeddings()(self.model.model.norm(x))


def save_checkpoint(path: Path, config, state_dict: dict[str, torch.Tensor], tokenizer) -> Path:
    """A standard transformers checkpoint (config, safetensors, tokenizer with its chat template) that
    `AutoModelForCausalLM.from_pretrained`, draftwise and assisted generation all load."""
    model = from_state_dict(config, state_dict, next(iter(state_dict.values())).dtype, "cpu")
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return Path(path)
