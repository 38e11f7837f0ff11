"""Targets and drafters on the llama.cpp engine: GGUF files run at their own quantization.

  target   'default'     the GGUF the default target ships as (Q4_1), not a conversion of it
           FILE.gguf     as it is
           an HF dir     written as GGUF first (at `options.gguf_quant`, cached), then run
  drafter  FILE.gguf     as it is (its vocabulary must be the target's)
           a checkpoint, a prune / distill run folder, layers:i,j,..., random:...
                         written as GGUF with the target's tokenizer metadata (cached), then run

The config and tokenizer of a GGUF file come from its metadata alone (no weights are dequantised), cached under
`<cache>/gguf-meta/`; files draftwise writes live under `<cache>/gguf/`, keyed by what they were made from, so a
changed checkpoint is written again and an unchanged one is not.
"""

from __future__ import annotations

import time
from pathlib import Path

from ...errors import DraftwiseError
from ...gguf.export import written
from ...gguf.read import quant_name
from ...gguf.vocab import check_vocab
from ...targets import random, vocab_map
from ...targets.checkpoint import config_and_tokenizer
from ...targets.layers import layer_subset, parse_layers
from ...targets.source import metadata
from ...targets.spec import parse
from ...timing import machine
from ..base import Model, ModelOptions
from ..hf import model as hf

LLAMA_CPP = "llama.cpp"
GGUF_BYTES = {"f32": 4, "f16": 2, "q8_0": 34 / 32}  # bytes per weight of the GGUF types (Q8_0: 32 int8 + an f16 scale)


def _model(spec: str, gguf: Path, config, tokenizer, options, hf_factory, path: Path | None):
    from .lm import LlamaCppLM, LlamaCppModel

    start = time.perf_counter()
    lm = LlamaCppLM(LlamaCppModel(gguf), config, exact=options.llama_exact)
    return Model(spec, config, tokenizer, lm, LLAMA_CPP, path, time.perf_counter() - start, hf_factory, gguf=gguf)


def load(spec: str, options):
    """A target on llama.cpp (see the module docstring)."""
    dtype = hf.torch_dtype("fp32")
    target = parse(spec)
    if target.file is not None:
        config, tokenizer = metadata(target.file)
        # baselines that need transformers get the dequantised weights (converted once, on first use)
        factory = lambda: hf.from_pretrained(target.directory(), dtype, "cpu")  # noqa: E731
        return _model(spec, target.file, config, tokenizer, options, factory, None)
    if target.built:
        raise DraftwiseError(
            f"{spec}: random-weight targets run on the lean engine (a random drafter can run on llama.cpp)"
        )
    path = target.directory()
    config, tokenizer = config_and_tokenizer(path, options)
    return _model(
        spec,
        written(spec, spec, options.gguf_quant),
        config,
        tokenizer,
        options,
        lambda: hf.from_pretrained(path, dtype, "cpu"),
        path,
    )


def load_drafter(spec: str, target, options):
    """A model drafter on llama.cpp for a llama.cpp `target` (see the module docstring)."""
    drafter = parse(spec)
    if drafter.file is not None:
        check_vocab(Path(target.gguf), drafter.file)
        config, _ = metadata(drafter.file, tokenizer=False)
        return _model(spec, drafter.file, config, target.tokenizer, options, _no_twin(spec), None)
    if drafter.kind == "layers":
        config = layer_subset(target.config, {}, parse_layers(spec, target.config.num_hidden_layers))[0]
        tokenizer = target.tokenizer
    elif drafter.kind == "random":
        config = random.llama_config(random.parse(spec, random.shape_of(target.config)), target.config)
        tokenizer = target.tokenizer
    else:
        path = drafter.directory()
        if vocab_map.read_map(path) is not None:
            raise DraftwiseError(
                f"{spec}: reduced-vocabulary drafters run on the lean engine only (llama.cpp verifies "
                "against the target's whole vocabulary); use the full-vocabulary checkpoint"
            )
        config, tokenizer = config_and_tokenizer(path, options)
    return _model(
        spec, written(spec, target.name, options.gguf_quant), config, tokenizer, options, _no_twin(spec), None
    )


def _no_twin(spec: str):
    def refuse():
        raise DraftwiseError(
            f"{spec} runs on llama.cpp: transformers baselines of a drafter need the lean or transformers backend"
        )

    return refuse


def stamp(model: Model, options: ModelOptions) -> dict:
    """What a llama.cpp timing was taken with: engine, llama.cpp's build, the file's quantization (as the dtype), the
    threads."""
    from .lm import build_info

    quant = quant_name(model.gguf)
    return {
        **machine(options.device, quant, LLAMA_CPP),
        "engine": LLAMA_CPP,
        "llama_cpp": build_info(),
        "quant": quant,
        "threads": model.lm.model.threads,
        "gguf": Path(model.gguf).name,
    }


class LlamaCpp:
    name = LLAMA_CPP
    lm_heads = False  # llama.cpp runs a whole forward or nothing: no LM head timed alone
    cpu_only = True
    file_drafters = True  # a drafter is a GGUF file, written from its spec (`layers:`, `random:`, a checkpoint)
    features = False
    reduced_heads = False  # llama.cpp verifies against the target's whole vocabulary

    load = staticmethod(load)
    load_drafter = staticmethod(load_drafter)
    stamp = staticmethod(stamp)

    def engine(self, model: Model, options: ModelOptions) -> str:
        return LLAMA_CPP

    def bytes_per_value(self, options: ModelOptions) -> float:
        return GGUF_BYTES[options.gguf_quant]


RUNTIME = LlamaCpp()
