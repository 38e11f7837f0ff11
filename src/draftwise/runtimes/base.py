"""What every runtime shares: the options a model loads with, the loaded `Model` (and its weights put down while
others use the memory: `put_down`), the `LM` Protocol the decoding loop calls, and the `Runtime` Protocol each runtime
package meets (`runtimes.registry.RUNTIMES` registers them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from .. import memory


class LM(Protocol):
    """What the decoding loop calls on a model's forward (`LeanLM`, `HFCausalLM`, `LlamaCppLM`, a drafter's view):
    `reset` makes room for `batch` rows of `length` positions, `forward` runs `ids` from position `pos` and returns the
    logits of the last `n_logits` positions (all where 0), rolling back whatever the cache held past `pos`."""

    vocab_size: int
    device: str

    def reset(self, batch: int, length: int) -> None: ...

    def forward(self, ids: torch.Tensor, pos: int, n_logits: int) -> torch.Tensor: ...

    def weight_bytes(self) -> int: ...


class Runtime(Protocol):
    """A runtime: how a spec becomes a `Model` on it, and what a timing taken on it says it ran. One package each
    (`runtimes/lean`, `runtimes/hf`, `runtimes/llamacpp`), registered in `runtimes.registry.RUNTIMES`; stages ask these
    fields instead of branching on a runtime's name."""

    name: str  # the backend that names it (--backend)
    lm_heads: bool  # an LM head can be timed alone (profile); llama.cpp runs the head inside its graph
    cpu_only: bool  # runs on the CPU only (no --device cuda)
    file_drafters: bool  # a drafter is a file it reads (llama.cpp: a GGUF written from the spec), not built in memory
    features: bool  # hands out the target's hidden states (what a feature head reads)
    reduced_heads: bool  # drafts with a reduced-vocabulary head (`draft_vocab.json`): its logits mapped to the target's

    def load(self, spec: str, options: ModelOptions) -> Model: ...

    def load_drafter(self, spec: str, target: Model, options: ModelOptions) -> Model: ...

    def engine(self, model: Model, options: ModelOptions) -> str: ...

    def stamp(self, model: Model, options: ModelOptions) -> dict: ...

    def bytes_per_value(self, options: ModelOptions) -> float: ...


@dataclass(frozen=True)
class ModelOptions:
    dtype: str = (
        "fp32"  # fp32 | bf16 | fp16 | int8 (the lean engine's int8 weights, int16 activations; lossy: `int8.py`)
    )
    device: str = "cpu"  # cpu | cuda | cuda:N
    backend: str = "auto"  # auto: lean when the architecture allows, else transformers
    compile: bool = False  # torch.compile each layer of the lean forward (it then bypasses the CPU C kernels)
    trust_remote_code: bool = False
    gguf_quant: str = "f32"  # llama.cpp: the precision draftwise writes a GGUF at when it must write one (an HF dir,
    # a trained, layers: or random: drafter); a .gguf file or 'default' runs at its own quantization
    llama_exact: bool = (
        False  # llama.cpp: an f32 KV cache and no flash attention (its defaults: f16 KV, flash attention
    )
    # where llama.cpp picks it, which llama-server runs too); see `llamacpp.LlamaCppLM`


@dataclass
class Model:
    """A loaded causal LM. `lm` is what the engine calls; `hf_model()` builds its transformers twin (baselines)."""

    name: str
    config: object
    tokenizer: object
    lm: object  # LeanLM | HFCausalLM
    backend: str
    path: Path | None = None
    load_seconds: float = 0.0
    _hf_factory: Callable[[], object] | None = field(default=None, repr=False)
    _hf: object | None = field(default=None, repr=False)
    gguf: Path | None = None  # the GGUF file llama.cpp runs (backend llama.cpp)

    @property
    def vocab_size(self) -> int:
        return self.lm.vocab_size

    def hf_model(self):
        """A plain transformers model of the same weights (its own instance: the engine's fallback model runs on
        draftwise's kernels, and a baseline must measure transformers as users run it)."""
        if self._hf is None:
            self._hf = self._hf_factory()
        return self._hf

    def encode(self, text: str) -> list[int]:
        """Token ids of a user prompt, through the chat template when the tokenizer has one."""
        tok = self.tokenizer
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return tok(text)["input_ids"]

    @property
    def eos_ids(self) -> frozenset[int]:
        """Tokens that end a generation: the tokenizer's EOS and the config's (an int or a list)."""
        ids = set()
        for source in (self.tokenizer.eos_token_id, getattr(self.config, "eos_token_id", None)):
            ids.update(source if isinstance(source, (list, tuple)) else [source] if source is not None else [])
        return frozenset(ids)

    def weight_bytes(self) -> int:
        """Bytes of weights one plain decoding step reads on this runtime (the bandwidth limit's denominator)."""
        return self.lm.weight_bytes()

    def held_bytes(self, beside: Model | None = None) -> int:
        """Bytes of weights this model holds in memory, as loaded (a memory budget's figure, where `weight_bytes` is a
        step's reads): every tensor of its forward, the embedding table included, each storage once, less those it
        shares with `beside` (a drafter's with its target: `layers:` views hold none of their own). A runtime outside
        torch (llama.cpp) counts its file's tensors."""
        if not isinstance(self.lm, torch.nn.Module):
            return self.lm.weight_bytes()
        shared = set(_storages(beside.lm)) if beside is not None and isinstance(beside.lm, torch.nn.Module) else set()
        return sum(n for at, n in _storages(self.lm).items() if at not in shared)

    def parameter_count(self) -> int:
        """Total parameters, a tied head counted once (the convention used in every draftwise table)."""
        from .hf.model import HFCausalLM

        model = self.lm.model if isinstance(self.lm, HFCausalLM) else self.hf_model()
        return sum(p.numel() for p in model.parameters())

    def put_down(self) -> None:
        """Let go of the weights (`lm` is None after; the tokenizer and config stay) and hand what they held back to
        the OS (`memory.release`): for a caller that needs no forward from here on, or one that loads them again
        (`put_down`)."""
        self.lm = None
        memory.release()


def _storages(module: torch.nn.Module) -> dict[int, int]:
    """{address: bytes} of each storage behind `module`'s parameters and buffers (a view, a tied head: once)."""
    tensors = [*module.parameters(), *(t for _, t in module.named_buffers(remove_duplicate=False) if t is not None)]
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


@contextmanager
def put_down(model: Model, load: Callable[[], Model]) -> Iterator[None]:
    """`model` without its weights inside the block (`Model.put_down`), `load()`'s after it, so that what runs inside
    does not stack its peak on them; a block that raises leaves them down (its caller ends there)."""
    model.put_down()
    yield
    model.lm = load().lm
