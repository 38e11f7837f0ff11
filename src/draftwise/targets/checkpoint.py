"""A checkpoint directory's contents: its weights (all at once, or each tensor when first asked for), its config and
its tokenizer."""

from __future__ import annotations

from collections.abc import MutableMapping
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from ..errors import DraftwiseError


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All safetensors tensors of a checkpoint directory (sharded or not)."""
    state = {}
    for file in sorted(path.glob("*.safetensors")):
        state.update(load_file(file))
    return state


class LazyWeights(MutableMapping):
    """A checkpoint's tensors, each read when first asked for into memory of its own (`pread`, not a mapping of the
    file) and held until deleted: a model built a layer at a time, dropping each layer's weights (`bank.build`), never
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


def config_and_tokenizer(path: Path, options=None):
    """A checkpoint directory's transformers config and tokenizer (remote code only where `options` asks for it)."""
    remote = bool(getattr(options, "trust_remote_code", False))
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=remote)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=remote)
    except (OSError, ValueError, KeyError) as e:
        raise DraftwiseError(f"cannot load {path}: {str(e).splitlines()[0]}") from e
    return config, tokenizer
