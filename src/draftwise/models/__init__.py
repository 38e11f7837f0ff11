"""Loading targets and drafters.

`load(spec, options)` gives a `Model`: its config, tokenizer and `lm`, the object the engine runs — `LeanLM` for the
families `family.FAMILIES` describes, else `HFCausalLM` over transformers. `load_drafter(spec, target, options)` also
accepts `layers:i,j,...` (a fresh model made of some of the target's layers) and checks that the drafter speaks the
target's vocabulary. Both are local only: nothing is fetched from a hub, and remote code runs only when asked.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import torch

from ..errors import DraftwiseError
from . import gguf_export, hf, int8, kernels, llamacpp_load, packed, q4, random, vocab
from .base import (  # noqa: F401
    LazyWeights,
    Model,
    ModelOptions,
    check_compatible,
    config_and_tokenizer,
    layer_subset,
    parse_layers,
    read_weights,
)
from .lean import LeanLM, unsupported_reason
from .llamacpp_load import LLAMA_CPP
from .source import resolve

BACKENDS = ("auto", "lean", "transformers", "llama.cpp")


def _check_device(device: str) -> None:
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise DraftwiseError(f"device {device!r} asked for, but torch sees no CUDA GPU on this machine")
    if not (device == "cpu" or device.startswith("cuda")):
        raise DraftwiseError(f"unknown device {device!r}: use cpu, cuda or cuda:N")


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
        return q4.build(config, state_dict, gguf, options.compile), "lean"
    return LeanLM(config, state_dict, compile=options.compile, precision=options.dtype), "lean"


def _to(state_dict: dict[str, torch.Tensor], options: ModelOptions) -> dict[str, torch.Tensor]:
    dtype = hf.torch_dtype(options.dtype)
    return {
        k: (v.to(options.device, dtype) if v.is_floating_point() else v.to(options.device))
        for k, v in state_dict.items()
    }


def load(spec: str, options: ModelOptions = ModelOptions()) -> Model:
    """Load a target or drafter: 'default', a .gguf file, or a local Hugging Face directory."""
    if options.backend not in BACKENDS:
        raise DraftwiseError(f"unknown backend {options.backend!r}: choose one of {', '.join(BACKENDS)}")
    _check_device(options.device)
    hf.torch_dtype(options.dtype)  # an unknown precision: one line, before anything loads
    if options.dtype in (int8.NAME, q4.NAME):
        int8.check_supported(options.device, options.backend, options.dtype)
    if options.backend == LLAMA_CPP:
        if options.device != "cpu":
            raise DraftwiseError("the llama.cpp backend runs on the CPU here (device cpu)")
        return llamacpp_load.load(spec, options)
    start = time.perf_counter()
    if spec.startswith(random.PREFIX):
        return _random_model(spec, None, options)
    path = resolve(spec)
    gguf = _q4_source(path, options)
    config, tokenizer = config_and_tokenizer(path, options)
    dtype = hf.torch_dtype(options.dtype)  # int8: the transformers twin (baselines) in fp32, as users run it
    factory = lambda: hf.from_pretrained(path, dtype, options.device, options.trust_remote_code)  # noqa: E731
    reduced = vocab.read_map(path)
    if reduced is not None:  # a reduced-vocabulary drafter: the lean forward, seen through the target's vocabulary
        lm = _reduced_head_lm(path, config, options, *reduced)
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
    return Model(spec, config, tokenizer, lm, backend, path, time.perf_counter() - start, factory)


def _pack_file(path: Path, config, options: ModelOptions, gguf: Path | None) -> Path | None:
    """Where the lean model at int8 or q4 is kept once built (`packed`); None where no pack is kept: other
    precisions (their load is a file read already), torch.compile, a model the lean engine does not run."""
    lean = options.backend in ("auto", "lean") and unsupported_reason(config) is None
    if options.dtype not in packed.PRECISIONS or options.compile or not lean:
        return None
    return packed.pack_file(path, options.dtype, gguf)


def random_weights(spec: str) -> bool:
    """Whether a target's weights are random, so that acceptance measured on it means nothing (its costs are real): a
    `random:` shape, or a GGUF file draftwise wrote with random weights (`scripts/shape_gguf.py`)."""
    if spec.startswith(random.PREFIX):
        return True
    path = llamacpp_load.gguf_file(spec)
    return path is not None and gguf_export.has_random_weights(path)


def _q4_source(path: Path, options: ModelOptions) -> Path | None:
    """The GGUF file whose 4-bit blocks a q4 model runs (None at other precisions); one line where there is none."""
    if options.dtype != q4.NAME:
        return None
    source = path / "draftwise-source.json"
    if not source.is_file() or vocab.read_map(path) is not None:
        raise DraftwiseError(
            f"--dtype q4 runs a GGUF file's own 4-bit blocks, and {path} was not read from one "
            "(give a .gguf file, or use --dtype int8)"
        )
    return Path(json.loads(source.read_text())["gguf"])


def _drafter_q4(spec: str, options: ModelOptions) -> ModelOptions:
    """A q4 target's drafter: its own file's 4-bit blocks where it is a GGUF file with some, else int8 (a pruned or
    distilled checkpoint, a random shape: no blocks of a file to run)."""
    if options.dtype != q4.NAME or (spec.endswith(".gguf") and q4.has_blocks(Path(spec))):
        return options
    return dataclasses.replace(options, dtype=int8.NAME)


def _reduced_head_lm(path: Path, config, options: ModelOptions, ids: list[int], vocab_size: int) -> vocab.ReducedHead:
    reason = unsupported_reason(config)
    if reason or options.backend == "transformers":
        raise DraftwiseError(
            f"{path}: reduced-vocabulary drafters run on the lean forward only ({reason or 'backend transformers'})"
        )
    state = _to(read_weights(path), options)
    if state["lm_head.weight"].shape[0] != len(ids):
        raise DraftwiseError(
            f"{path}: LM head has {state['lm_head.weight'].shape[0]} rows but {vocab.MAP_FILE} maps {len(ids)}"
        )
    return vocab.ReducedHead(LeanLM(config, state, compile=options.compile, precision=options.dtype), ids, vocab_size)


def _no_hf_twin(path: Path):
    def refuse():
        raise DraftwiseError(
            f"{path} has a reduced-vocabulary head that transformers cannot load: use the "
            "full-vocabulary checkpoint it was cut from for transformers baselines"
        )

    return refuse


def _random_model(spec: str, target: Model | None, options: ModelOptions) -> Model:
    """`random:...` (see models.random): a target, or a drafter whose left-out dimensions are its target's."""
    if options.backend == "transformers":
        raise DraftwiseError(f"{spec}: random-weight models run on the lean engine only")
    if options.dtype == q4.NAME:
        raise DraftwiseError(f"{spec}: --dtype q4 runs a GGUF file's own 4-bit blocks, and a random model has none")
    start = time.perf_counter()
    shape = random.parse(spec, random.shape_of(target.config) if target else None)
    config = random.llama_config(shape, target.config if target else None)
    lm = random.random_lm(
        config, hf.torch_dtype(options.dtype), options.device, shape["seed"], options.compile, options.dtype
    )
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


def load_drafter(spec: str, target: Model, options: ModelOptions = ModelOptions()) -> Model:
    """A drafter for `target`: a checkpoint (as `load`), `layers:i,j,...` of the target itself, or `random:...`."""
    if (target.backend == LLAMA_CPP) != (options.backend == LLAMA_CPP):
        raise DraftwiseError(
            f"drafter {spec}: target and drafter run on one engine (target: {target.backend}, "
            f"drafter: {options.backend})"
        )
    if options.backend == LLAMA_CPP:
        drafter = llamacpp_load.load_drafter(spec, target, options)
    elif spec.startswith("layers:"):
        drafter = _layers_drafter(spec, target, options)
    elif spec.startswith(random.PREFIX):
        drafter = _random_model(spec, target, _drafter_q4(spec, options))
    else:
        drafter = load(spec, _drafter_q4(spec, options))
    check_compatible(target, drafter)
    return drafter


FINGERPRINT_FILE = "tokenizer.json"


def fingerprint(tokenizer) -> str:
    """A tokenizer's identity: the hash of its vocabulary (string -> id). Token ids written by one tokenizer mean other
    text under another, so folders of token ids say whose they are."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def write_fingerprint(folder: Path, tokenizer) -> None:
    (Path(folder) / FINGERPRINT_FILE).write_text(
        json.dumps({"fingerprint": fingerprint(tokenizer), "vocab_size": len(tokenizer)}) + "\n"
    )


def check_fingerprint(folder: Path, target: Model, what: str) -> None:
    """Refuse, in one line, a folder of token ids written with another tokenizer than the target's (or by no
    draftwise stage: no fingerprint)."""
    path = Path(folder) / FINGERPRINT_FILE
    if not path.exists():
        raise DraftwiseError(
            f"{what} {folder}: not a gen-data run folder of this draftwise (no {FINGERPRINT_FILE}); run `draftwise "
            f"gen-data` (or `draftwise teacher`) to make one"
        )
    if json.loads(path.read_text())["fingerprint"] != fingerprint(target.tokenizer):
        raise DraftwiseError(
            f"{what} {folder} was written with another tokenizer than the target's ({target.name}): its token ids "
            f"mean other text"
        )


def save_checkpoint(path: Path, config, state_dict: dict[str, torch.Tensor], tokenizer) -> Path:
    """A standard transformers checkpoint (config, safetensors, tokenizer with its chat template) that
    `AutoModelForCausalLM.from_pretrained`, draftwise and assisted generation all load."""
    model = hf.from_state_dict(config, state_dict, next(iter(state_dict.values())).dtype, "cpu")
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return Path(path)


def engine(model: Model, options: ModelOptions) -> str:
    """The code path a timing of `model` measures: backend, the CPU C kernels when they run, torch.compile."""
    name = model.backend
    if name == LLAMA_CPP:
        return name
    if options.dtype in (int8.NAME, q4.NAME):  # which path the integer matrices take (torch's: the same, slower)
        return f"{name}+{options.dtype}-{kernels.INT8_ISAS.get(kernels.int8_isa(), 'torch')}"
    if options.device == "cpu" and options.dtype == "fp32" and not options.compile and kernels.kernel_available():
        name += "+c-kernels"  # the transformers fallback's linear layers run on them too (`hf.route_linears`)
    return name + ("+compile" if options.compile else "")


def fill_cache(lm, batch: int, context: int, room: int, generator: torch.Generator) -> None:
    """Make `lm`'s cache hold `context` positions of `batch` rows, with `room` more to time passes at `context`. The
    lean forward's preallocated cache costs the same whatever it holds; a DynamicCache or llama.cpp's cache must
    really hold them (random tokens)."""
    lm.reset(batch, context + room)
    if not isinstance(lm, (LeanLM, vocab.ReducedHead)):
        lm.forward(torch.randint(0, lm.vocab_size, (batch, context), generator=generator).to(lm.device), 0, 0)


def stamp(model: Model, options: ModelOptions) -> dict:
    """What a timing of `model` is taken on (`timing.machine`); on llama.cpp also its build, the file's quantization
    (as the dtype) and llama.cpp's threads."""
    from ..timing import machine

    if model.backend == LLAMA_CPP:
        extra = llamacpp_load.stamp(model)
        return {**machine(options.device, extra["quant"], LLAMA_CPP), **extra}
    return machine(options.device, options.dtype, engine(model, options))


def describe(model: Model) -> dict:
    """What a run folder records about a model."""
    return {
        "spec": model.name,
        "path": str(model.path) if model.path else None,
        "backend": model.backend,
        "model_type": model.config.model_type,
        "layers": model.config.num_hidden_layers,
        "hidden_size": model.config.hidden_size,
        "vocab_size": model.vocab_size,
        "load_seconds": round(model.load_seconds, 3),
        **({"gguf": str(model.gguf), "quant": llamacpp_load.quant_name(model.gguf)} if model.gguf else {}),
    }


__all__ = [
    "ModelOptions",
    "Model",
    "engine",
    "stamp",
    "fill_cache",
    "load",
    "load_drafter",
    "check_compatible",
    "layer_subset",
    "parse_layers",
    "describe",
    "read_weights",
    "save_checkpoint",
    "check_fingerprint",
    "fingerprint",
    "write_fingerprint",
    "FINGERPRINT_FILE",
]
