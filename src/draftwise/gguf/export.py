"""`export`: the model a spec names (a checkpoint or run folder, 'default', a .gguf file, `layers:`, `random:`) written
as GGUF with the target's tokenizer. Separate from `write`, which writes a config and a state dict it is handed:
this module resolves and checks the spec (tokenizer, vocabulary, reduced heads) and finds the target's own GGUF.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import torch

from ..config import GGUF_QUANTS
from ..errors import DraftwiseError
from ..paths import cache_dir
from ..targets import random, vocab_map
from ..targets.checkpoint import config_and_tokenizer, read_weights
from ..targets.fingerprint import check_compatible
from ..targets.layers import checkpoint_of
from ..targets.source import converted_from, digest, key_of, resolve, stamp_of
from ..targets.spec import parse
from .read import note, source
from .write import QUANTS, unsupported, write_gguf


def source_gguf(model_dir: Path) -> Path | None:
    """The GGUF file a cache dir was converted from (`source.converted_from`), when it still exists."""
    gguf = converted_from(model_dir)
    return gguf if gguf is not None and gguf.is_file() else None


def export(spec: str, out: str | os.PathLike, quant: str = "f32", target: str = "default", options=None) -> Path:
    """Write the model `spec` names (a checkpoint or run folder, 'default', a .gguf file, `layers:i,j,...` or
    `random:...` of `target`) as GGUF at `quant`, with `target`'s tokenizer: copied from the target's GGUF when it
    has one ('default', a .gguf file, a dir converted from one), else built from its Hugging Face tokenizer."""
    if quant not in QUANTS:
        raise DraftwiseError(f"unknown GGUF quantization {quant!r}: choose one of {', '.join(QUANTS)}")
    target_dir = resolve(target)
    target_config, target_tok = config_and_tokenizer(target_dir, options)
    kind = parse(spec).kind
    if kind == "layers":
        _refuse(unsupported(target_config), spec)
        _refuse_reduced(target_dir)
        config, state = checkpoint_of(spec, target_config, target_dir)
        tokenizer = target_tok
    elif kind == "random":
        shape = random.parse(spec, random.shape_of(target_config))
        config = random.llama_config(shape, target_config)
        _refuse(unsupported(config), spec)
        state, tokenizer = random.random_state_dict(config, torch.float32, "cpu", shape["seed"]), target_tok
    else:
        path = resolve(spec)
        _refuse_reduced(path)
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


def _refuse_reduced(path: Path) -> None:
    if vocab_map.read_map(path) is not None:
        raise DraftwiseError(
            f"cannot export {path} to GGUF: it has a reduced-vocabulary head ({vocab_map.MAP_FILE}), "
            "which llama.cpp cannot run; export the full-vocabulary checkpoint it was cut from"
        )


def written(spec: str, target_spec: str, quant: str) -> Path:
    """The GGUF file draftwise writes for `spec` (a model draftwise loads) with `target_spec`'s tokenizer, cached."""
    if quant not in GGUF_QUANTS:
        raise DraftwiseError(f"unknown GGUF quantization {quant!r}: choose one of {', '.join(GGUF_QUANTS)}")
    target_spec = origin(target_spec)
    sources = [spec, target_spec, quant]
    for named in map(parse, (spec, target_spec)):
        if not named.built:
            sources.append(digest(named.file) if named.file else stamp_of(named.directory()))
    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(spec.rstrip("/")).name)[:48]
    out = cache_dir("gguf") / f"{name}-{quant}-{key_of(*sources)}.gguf"
    if not out.is_file():
        export(spec, out, quant, target_spec)
        # what the file was written from: loading it as a target takes config and tokenizer from there (a tokenizer
        # llama.cpp reads is not always one transformers can rebuild from GGUF metadata)
        source(out).write_text(json.dumps({"spec": spec, "target": target_spec, "quant": quant}) + "\n")
    return out


def origin(spec: str) -> str:
    """What a model spec was made from: for a GGUF file draftwise wrote from a checkpoint, that checkpoint (so a
    drafter for a requantized target is cut from, and tokenized like, the original, with nothing dequantised)."""
    file = parse(spec).file
    made = note(file) if file is not None else {}
    return made["spec"] if made.get("spec") and made.get("spec") == made.get("target") else spec
