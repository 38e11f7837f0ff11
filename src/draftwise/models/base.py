"""What every runtime's loader shares: the options a model loads with, the loaded `Model`, reading a checkpoint's
weights, config and tokenizer, a model made of some of another's layers, and the vocabulary check a drafter must
pass."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from ..errors import DraftwiseError
from . import hf


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

    def parameter_count(self) -> int:
        """Total parameters, a tied head counted once (the convention used in every draftwise table)."""
        model = self.lm.model if isinstance(self.lm, hf.HFCausalLM) else self.hf_model()
        return sum(p.numel() for p in model.parameters())


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All safetensors tensors of a checkpoint directory (sharded or not)."""
    state = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(file))
    return state


class LazyWeights(MutableMapping):
    """A checkpoint's tensors, each read when first asked for into memory of its own (`pread`, not a mapping of the
    file) and held until deleted: a model built a layer at a time, dropping each layer's weights (`q4.build`), never
    holds the whole file. With `read_weights`' mapping, every page read stays in the process's resident set for as
    long as any tensor of the file lives: a 1.7B q4 target kept its 6.7 GB fp32 file resident."""

    def __init__(self, path: Path):
        self._file, self._held = {}, {}
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(file, framework="pt") as f:
                self._file.update(dict.fromkeys(f.keys(), file))

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._held:
            with safe_open(self._file[key], framework="pt", backend="pread") as f:
                self._held[key] = f.get_tensor(key)
        return self._held[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self._file.setdefault(key, None)
        self._held[key] = value

    def __delitem__(self, key: str) -> None:
        del self._file[key]
        self._held.pop(key, None)

    def __iter__(self):
        return iter(list(self._file))

    def __len__(self) -> int:
        return len(self._file)


def config_and_tokenizer(path: Path, options: ModelOptions):
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=options.trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(
            path, local_files_only=True, trust_remote_code=options.trust_remote_code
        )
    except (OSError, ValueError, KeyError) as e:
        raise DraftwiseError(f"cannot load {path}: {str(e).splitlines()[0]}") from e
    return config, tokenizer


def parse_layers(spec: str, num_layers: int) -> list[int]:
    """`layers:0,29` -> [0, 29], checked against the target's depth."""
    body = spec.split(":", 1)[1]
    try:
        ids = [int(tok) for tok in body.split(",") if tok.strip()]
    except ValueError:
        raise DraftwiseError(f"bad layer list {spec!r}: expected layers:i,j,... with integers") from None
    if not ids:
        raise DraftwiseError(f"bad layer list {spec!r}: name at least one layer")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise DraftwiseError(f"bad layer list {spec!r}: the target has layers 0..{num_layers - 1}, not {bad}")
    if len(set(ids)) != len(ids):
        raise DraftwiseError(f"bad layer list {spec!r}: a layer is repeated")
    return ids


def layer_subset(config, state_dict: dict[str, torch.Tensor], ids: list[int]):
    """Config and weights of a model made of layers `ids` of another (renumbered 0..k-1), sharing its embeddings."""
    sub = config.__class__.from_dict(config.to_dict())
    sub.num_hidden_layers = len(ids)
    if getattr(sub, "layer_types", None):
        sub.layer_types = [config.layer_types[i] for i in ids]
    out = {k: v for k, v in state_dict.items() if not k.startswith("model.layers.")}
    for new, old in enumerate(ids):
        prefix = f"model.layers.{old}."
        out.update({f"model.layers.{new}.{k[len(prefix) :]}": v for k, v in state_dict.items() if k.startswith(prefix)})
    return sub, out


def check_compatible(target: Model, drafter: Model) -> None:
    """The drafter must map the same strings to the same token ids as the target, or its tokens mean nothing."""
    if drafter.tokenizer is target.tokenizer:
        return
    tv, dv = target.tokenizer.get_vocab(), drafter.tokenizer.get_vocab()
    if tv == dv:
        return
    differ = sorted(tok for tok in set(tv) | set(dv) if tv.get(tok) != dv.get(tok))
    example = differ[0]
    raise DraftwiseError(
        f"drafter vocabulary incompatible with target: {len(differ)} tokens differ "
        f"(e.g. {example!r}: target id {tv.get(example)}, drafter id {dv.get(example)}); "
        "a drafter must use the target's tokenizer"
    )
