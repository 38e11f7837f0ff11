"""`export`: the model a spec names (a checkpoint or run folder, 'default', a .gguf file, `layers:`, `random:`) written
as GGUF with the target's tokenizer. Separate from `gguf_export`, which writes a config and a state dict it is handed:
this module resolves and checks the spec (tokenizer, vocabulary, reduced heads) and finds the target's own GGUF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch

from ..errors import DraftwiseError
from . import random
from . import vocab as reduced
from .base import ModelOptions, check_compatible, config_and_tokenizer, layer_subset, parse_layers, read_weights
from .gguf_export import QUANTS, unsupported, write_gguf
from .source import resolve

SOURCE_FILE = "draftwise-source.json"  # in a cache dir converted from a GGUF (`source._cached_gguf`)


def source_gguf(model_dir: Path) -> Path | None:
    """The GGUF file a cache dir was converted from (`source._cached_gguf`), when it still exists."""
    file = Path(model_dir) / SOURCE_FILE
    if not file.is_file():
        return None
    gguf = Path(json.loads(file.read_text()).get("gguf", ""))
    return gguf if gguf.is_file() else None


def export(spec: str, out: str | os.PathLike, quant: str = "f32", target: str = "default", options=None) -> Path:
    """Write the model `spec` names (a checkpoint or run folder, 'default', a .gguf file, `layers:i,j,...` or
    `random:...` of `target`) as GGUF at `quant`, with `target`'s tokenizer: copied from the target's GGUF when it
    has one ('default', a .gguf file, a dir converted from one), else built from its Hugging Face tokenizer."""
    if quant not in QUANTS:
        raise DraftwiseError(f"unknown GGUF quantization {quant!r}: choose one of {', '.join(QUANTS)}")
    options = options or ModelOptions()
    target_dir = resolve(target)
    target_config, target_tok = config_and_tokenizer(target_dir, options)
    if spec.startswith("layers:"):
        ids = parse_layers(spec, target_config.num_hidden_layers)
        _refuse(unsupported(target_config), spec)
        _refuse_reduced(target_dir, reduced)
        config, state = layer_subset(target_config, read_weights(target_dir), ids)
        tokenizer = target_tok
    elif spec.startswith(random.PREFIX):
        shape = random.parse(spec, random.shape_of(target_config))
        config = random.llama_config(shape, target_config)
        _refuse(unsupported(config), spec)
        state, tokenizer = random.random_state_dict(config, torch.float32, "cpu", shape["seed"]), target_tok
    else:
        path = resolve(spec)
        _refuse_reduced(path, reduced)
        config, tokenizer = (target_config, target_tok) if path == target_dir else config_and_tokenizer(path, options)
        check_compatible(SimpleNamespace(tokenizer=target_tok), SimpleNamespace(tokenizer=tokenizer))
        _refuse(unsupported(config), spec)
        state = read_weights(path)
    if config.vocab_size != target_config.vocab_size:
        raise DraftwiseError(
            f"{spec} has a vocabulary of {config.vocab_size} but the target {target}'s is "
            f"{target_config.vocab_size}: a drafter must use the target's vocabulary"
        )
    return write_gguf(config, state, tokenizer, out, quant, source_gguf(target_dir))


def _refuse(reason: str | None, spec: str) -> None:
    if reason:
        raise DraftwiseError(f"cannot export {spec} to GGUF: {reason}")


def _refuse_reduced(path: Path, reduced) -> None:
    if reduced.read_map(path) is not None:
        raise DraftwiseError(
            f"cannot export {path} to GGUF: it has a reduced-vocabulary head ({reduced.MAP_FILE}), "
            "which llama.cpp cannot run; export the full-vocabulary checkpoint it was cut from"
        )
