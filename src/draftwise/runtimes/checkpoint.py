"""The loader the lean and transformers runtimes share: a checkpoint (a Hugging Face directory, a GGUF file converted
once, 'default') or a `random:` shape read into torch weights, and run by the lean forward at its precision where
the model's family allows (`targets.family`), else by transformers. A q4 model runs its GGUF file's own blocks; an
int8 or q4 model is packed once (`lean.packed`). Nothing is fetched from a hub, and remote code runs only when asked.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import torch

from ..errors import DraftwiseError
from ..targets import random, vocab_map
from ..targets.checkpoint import LazyWeights, config_and_tokenizer, read_weights
from ..targets.family import unsupported_reason
from ..targets.layers import layer_subset, parse_layers
from ..targets.source import converted_from
from ..targets.spec import parse
from .base import Model, ModelOptions
from .hf import model as hf
from .lean import activations, bank, int8, packed, prompt, q4, reduced
from .lean.forward import LeanLM


def _engine_lm(config, state_dict, options: ModelOptions, hf_factory, gguf: Path | None = None) -> tuple[object, str]:
    """The model's forward: the lean engine at its precision (q4: on `gguf`'s blocks, taking `state_dict`'s layers as
    it goes), or transformers where the lean engine cannot run it."""
    reason = unsupported_reason(config)
    if options.backend == "lean" and reason:
        raise DraftwiseError(f"backend 'lean' cannot run this model: {reason}")
    if options.dtype in (int8.NAME, q4.NAME) and reason:
        raise DraftwiseError(f"--dtype {options.dtype} runs on the lean engine, which cannot run this model: {reason}")
    if options.backend == "transformers" or reason:
        if options.backend == "auto":
            print(f"draftwise: using the transformers backend ({reason})", file=sys.stderr)
        return hf.HFCausalLM(hf_factory()), "transformers"
    if gguf is not None:
        return bank.build(config, state_dict, gguf, options.compile), "lean"
    return LeanLM(config, state_dict, compile=options.compile, precision=options.dtype), "lean"


def _to(state_dict: dict[str, torch.Tensor], options: ModelOptions) -> dict[str, torch.Tensor]:
    dtype = hf.torch_dtype(options.dtype)
    return {
        k: (v.to(options.device, dtype) if v.is_floating_point() else v.to(options.device))
        for k, v in state_dict.items()
    }


def load(spec: str, options: ModelOptions) -> Model:
    """A target or drafter from a checkpoint: 'default', a .gguf file, a local Hugging Face directory, `random:`
    (`options` checked by `registry`)."""
    start = time.perf_counter()
    target = parse(spec)
    if target.kind == "random":
        return _random_model(spec, None, options)
    path = target.directory()
    gguf = _q4_source(path, options)
    config, tokenizer = config_and_tokenizer(path, options)
    dtype = hf.torch_dtype(options.dtype)  # int8: the transformers twin (baselines) in fp32, as users run it
    factory = lambda: hf.from_pretrained(path, dtype, options.device, options.trust_remote_code)  # noqa: E731
    kept = vocab_map.read_map(path)
    if kept is not None:  # a reduced-vocabulary drafter: the lean forward, seen through the target's vocabulary
        lm = _reduced_head_lm(path, config, options, *kept)
        return Model(spec, config, tokenizer, lm, "lean", path, time.perf_counter() - start, _no_hf_twin(path))
    pack = _pack_file(path, config, options, gguf)
    lm, backend = (packed.read(pack, config, options.dtype), "lean") if pack else (None, None)
    if lm is None:
        if unsupported_reason(config) is not None:
            state = {}
        else:  # q4: read a layer at a time as the model is built, never the whole fp32 file at once
            state = LazyWeights(path) if gguf is not None else _to(read_weights(path), options)
        lm, backend = _engine_lm(config, state, options, factory, gguf)
        if pack:
            packed.write(lm, pack)
    if gguf is not None and isinstance(lm, LeanLM):
        activations.with_activations(lm, activations.chosen(gguf))
        lm.prompt_lossy = prompt.allowed(gguf)
    return Model(spec, config, tokenizer, lm, backend, path, time.perf_counter() - start, factory)


def _pack_file(path: Path, config, options: ModelOptions, gguf: Path | None) -> Path | None:
    """Where the lean model at int8 or q4 is kept once built (`packed`); None where no pack is kept: other
    precisions (their load is a file read already), torch.compile, a model the lean engine does not run."""
    lean = options.backend in ("auto", "lean") and unsupported_reason(config) is None
    if options.dtype not in packed.PRECISIONS or options.compile or not lean:
        return None
    return packed.pack_file(path, options.dtype, gguf)


def _q4_source(path: Path, options: ModelOptions) -> Path | None:
    """The GGUF file whose 4-bit blocks a q4 model runs (None at other precisions); one line where there is none."""
    if options.dtype != q4.NAME:
        return None
    gguf = converted_from(path)
    if gguf is None or vocab_map.read_map(path) is not None:
        raise DraftwiseError(
            f"--dtype q4 runs a GGUF file's own 4-bit blocks, and {path} was not read from one "
            "(give a .gguf file, or use --dtype int8)"
        )
    return gguf


def drafter_options(spec: str, options: ModelOptions) -> ModelOptions:
    """A q4 target's drafter: its own file's 4-bit blocks where it is a GGUF file with some, else int8 (a pruned or
    distilled checkpoint, a random shape: no blocks of a file to run)."""
    if options.dtype != q4.NAME or (spec.endswith(".gguf") and bank.has_blocks(Path(spec))):
        return options
    return dataclasses.replace(options, dtype=int8.NAME)


def _reduced_head_lm(path: Path, config, options: ModelOptions, ids: list[int], vocab_size: int) -> reduced.ReducedHead:
    reason = unsupported_reason(config)
    if reason or options.backend == "transformers":
        raise DraftwiseError(
            f"{path}: reduced-vocabulary drafters run on the lean forward only ({reason or 'backend transformers'})"
        )
    state = _to(read_weights(path), options)
    if state["lm_head.weight"].shape[0] != len(ids):
        raise DraftwiseError(
            f"{path}: LM head has {state['lm_head.weight'].shape[0]} rows but {vocab_map.MAP_FILE} maps {len(ids)}"
        )
    return reduced.ReducedHead(LeanLM(config, state, compile=options.compile, precision=options.dtype), ids, vocab_size)


def _no_hf_twin(path: Path):
    def refuse():
        raise DraftwiseError(
            f"{path} has a reduced-vocabulary head that transformers cannot load: use the "
            "full-vocabulary checkpoint it was cut from for transformers baselines"
        )

    return refuse


def _random_model(spec: str, target: Model | None, options: ModelOptions) -> Model:
    """`random:...` (see `targets.random`): a target, or a drafter whose left-out dimensions are its target's."""
    if options.backend == "transformers":
        raise DraftwiseError(f"{spec}: random-weight models run on the lean engine only")
    if options.dtype == q4.NAME:
        raise DraftwiseError(f"{spec}: --dtype q4 runs a GGUF file's own 4-bit blocks, and a random model has none")
    start = time.perf_counter()
    shape = random.parse(spec, random.shape_of(target.config) if target else None)
    config = random.llama_config(shape, target.config if target else None)
    lm = random_lm(config, hf.torch_dtype(options.dtype), options.device, shape["seed"], options.compile, options.dtype)
    tokenizer = target.tokenizer if target else random.ByteTokenizer(shape["vocab"])

    def refuse():
        raise DraftwiseError(
            f"{spec} has random weights in the lean engine only: transformers baselines need a checkpoint"
        )

    return Model(spec, config, tokenizer, lm, "lean", None, time.perf_counter() - start, refuse)


def _layers_drafter(spec: str, target: Model, options: ModelOptions) -> Model:
    lean = isinstance(target.lm, LeanLM) and options.backend != "transformers"
    if target.path is None and not lean:
        raise DraftwiseError(f"{spec}: the target must be loaded from a checkpoint")
    ids = parse_layers(spec, target.config.num_hidden_layers)
    dtype = hf.torch_dtype(options.dtype)

    def subset_weights():
        return layer_subset(target.config, _to(read_weights(target.path), options), ids)

    # a target without a checkpoint (random weights) has no transformers twin: its own factory says so
    factory = (
        target.hf_model if target.path is None else lambda: hf.from_state_dict(*subset_weights(), dtype, options.device)
    )
    if lean:
        sub_config = layer_subset(target.config, {}, ids)[0]
        lm, backend = target.lm.subset(ids, sub_config), "lean"  # shares the target's weights
    else:
        lm, backend = hf.HFCausalLM(factory()), "transformers"
        sub_config = lm.config
    return Model(spec, sub_config, target.tokenizer, lm, backend, None, 0.0, factory)


def load_drafter(spec: str, target: Model, options: ModelOptions) -> Model:
    """A drafter for `target`: a checkpoint (as `load`), `layers:i,j,...` of the target itself, or `random:...`."""
    kind = parse(spec).kind
    if kind == "layers":
        return _layers_drafter(spec, target, options)
    if kind == "random":
        return _random_model(spec, target, drafter_options(spec, options))
    return load(spec, drafter_options(spec, options))


def random_lm(
    config, dtype: torch.dtype, device: str, seed: int = 0, compile: bool = False, precision: str = "fp32"
) -> LeanLM:
    """A LeanLM of `config`'s shape and family with the weights of `random_state_dict` (`precision` int8: its
    matrices quantized from them)."""
    return LeanLM(config, random.random_state_dict(config, dtype, device, seed), compile=compile, precision=precision)
