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

import functools
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

from ..config import GGUF_QUANTS
from ..errors import DraftwiseError
from ..paths import cache_dir
from .base import Model, ModelOptions, config_and_tokenizer, layer_subset, parse_layers
from .source import check_gguf, default_gguf, resolve

LLAMA_CPP = "llama.cpp"


def gguf_file(spec: str) -> Path | None:
    """The GGUF file a spec names as it is ('default' or a .gguf path), else None (draftwise writes one); one cut
    short is refused in one line."""
    if spec == "default":
        path = default_gguf()
    else:
        path = Path(spec).expanduser()
        if path.suffix != ".gguf":
            return None
        if not path.is_file():
            raise DraftwiseError(f"model not found: {spec} (no such .gguf file)")
        path = path.resolve()
    _checked(path, _stamp(path))
    return path


@functools.cache
def _checked(path: Path, stamp: str) -> None:
    """`check_gguf`, once per version of a file (`stamp`) in a process: specs are resolved to files many times."""
    check_gguf(path)


def _stamp(path: Path) -> str:
    """What a file or folder of weights is, for cache keys: paths, sizes and modification times."""
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors")) + sorted(path.glob("config.json"))
    return "|".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


def _key(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def metadata(gguf: Path, tokenizer: bool = True):
    """(transformers config, tokenizer or None) of a GGUF file, read from its metadata once and cached; of a file
    draftwise wrote from a checkpoint, that checkpoint's own."""
    from transformers import AutoConfig, AutoTokenizer

    note = json.loads(source(gguf).read_text()) if source(gguf).is_file() else {}
    if note.get("spec") == note.get("target") and not note.get("spec", "layers:").startswith(("layers:", "random:")):
        config, tok = config_and_tokenizer(resolve(note["spec"]), ModelOptions())
        return config, tok if tokenizer else None

    out = cache_dir("gguf-meta") / f"{gguf.stem}-{_key(_stamp(gguf))}"
    want = "tokenizer_config.json" if tokenizer else "config.json"
    if not (out / want).is_file():
        tmp = out.with_name(out.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True).save_pretrained(tmp)
            if tokenizer:
                AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True).save_pretrained(
                    tmp
                )
        except Exception as e:  # transformers raises many types for GGUF metadata it cannot read
            raise DraftwiseError(f"cannot read the metadata of {gguf}: {str(e).splitlines()[0]}") from e
        shutil.rmtree(out, ignore_errors=True)
        try:
            os.replace(tmp, out)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)  # another process wrote it first
    config = AutoConfig.from_pretrained(out, local_files_only=True)
    return config, AutoTokenizer.from_pretrained(out, local_files_only=True) if tokenizer else None


def check_vocab(target: Path, drafter: Path) -> None:
    """A GGUF drafter must hold the target's vocabulary (the same text for every token id), or its drafts mean other
    tokens: the check llama-server makes before it accepts `-md`, done on the files themselves."""
    from .gguf_vocab import read_tokenizer

    ours, theirs = (read_tokenizer(p)["tokenizer.ggml.tokens"][0] for p in (target, drafter))
    if ours != theirs:
        differ = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        raise DraftwiseError(
            f"drafter {drafter.name} has another vocabulary than the target {target.name} "
            f"({len(theirs)} vs {len(ours)} tokens, first difference at id {differ}): a drafter must "
            "use the target's tokenizer"
        )


def written(spec: str, target_spec: str, quant: str) -> Path:
    """The GGUF file draftwise writes for `spec` (a model draftwise loads) with `target_spec`'s tokenizer, cached."""
    from . import spec_export

    if quant not in GGUF_QUANTS:
        raise DraftwiseError(f"unknown GGUF quantization {quant!r}: choose one of {', '.join(GGUF_QUANTS)}")
    target_spec = origin(target_spec)
    sources = [spec, target_spec, quant]
    for s in (spec, target_spec):
        if s.startswith(("layers:", "random:")):
            continue
        file = gguf_file(s)
        sources.append(_stamp(file) if file else _stamp(resolve(s)))
    name = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in Path(spec.rstrip("/")).name)[:48]
    out = cache_dir("gguf") / f"{name}-{quant}-{_key(*sources)}.gguf"
    if not out.is_file():
        spec_export.export(spec, out, quant, target_spec)
        # what the file was written from: loading it as a target takes config and tokenizer from there (a tokenizer
        # llama.cpp reads is not always one transformers can rebuild from GGUF metadata)
        source(out).write_text(json.dumps({"spec": spec, "target": target_spec, "quant": quant}) + "\n")
    return out


def source(gguf: Path) -> Path:
    """The note beside a GGUF file draftwise wrote, naming what it was written from."""
    return gguf.with_suffix(".source.json")


def origin(spec: str) -> str:
    """What a model spec was made from: for a GGUF file draftwise wrote from a checkpoint, that checkpoint (so a
    drafter for a requantized target is cut from, and tokenized like, the original, with nothing dequantised)."""
    file = gguf_file(spec)
    note = json.loads(source(file).read_text()) if file is not None and source(file).is_file() else {}
    return note["spec"] if note.get("spec") and note.get("spec") == note.get("target") else spec


def _model(spec: str, gguf: Path, config, tokenizer, options, hf_factory, path: Path | None):
    from .llamacpp import LlamaCppLM, LlamaCppModel

    start = time.perf_counter()
    lm = LlamaCppLM(LlamaCppModel(gguf), config, exact=options.llama_exact)
    return Model(spec, config, tokenizer, lm, LLAMA_CPP, path, time.perf_counter() - start, hf_factory, gguf=gguf)


def load(spec: str, options):
    """A target on llama.cpp (see the module docstring)."""
    from . import hf

    dtype = hf.torch_dtype("fp32")
    file = gguf_file(spec)
    if file is not None:
        config, tokenizer = metadata(file)
        # baselines that need transformers get the dequantised weights (converted once, on first use)
        factory = lambda: hf.from_pretrained(resolve(spec), dtype, "cpu")  # noqa: E731
        return _model(spec, file, config, tokenizer, options, factory, None)
    if spec.startswith("random:"):
        raise DraftwiseError(
            f"{spec}: random-weight targets run on the lean engine (a random drafter can run on llama.cpp)"
        )
    path = resolve(spec)
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
    from . import random, vocab

    file = gguf_file(spec)
    if file is not None:
        check_vocab(Path(target.gguf), file)
        config, _ = metadata(file, tokenizer=False)
        return _model(spec, file, config, target.tokenizer, options, _no_twin(spec), None)
    if spec.startswith("layers:"):
        config = layer_subset(target.config, {}, parse_layers(spec, target.config.num_hidden_layers))[0]
        tokenizer = target.tokenizer
    elif spec.startswith(random.PREFIX):
        config = random.llama_config(random.parse(spec, random.shape_of(target.config)), target.config)
        tokenizer = target.tokenizer
    else:
        path = resolve(spec)
        if vocab.read_map(path) is not None:
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


def quant_name(gguf: Path) -> str:
    """The GGUF's file type as llama.cpp names it (F32, F16, Q8_0, Q4_1, ...)."""
    import gguf as gg

    reader = gg.GGUFReader(str(gguf))
    field = reader.fields.get("general.file_type")
    if field is None:
        return "unknown"
    name = gg.LlamaFileType(int(field.contents())).name
    return name.removeprefix("MOSTLY_").replace("ALL_", "")


def stamp(model) -> dict:
    """What a llama.cpp timing was taken with: engine, llama.cpp's build, the file's quantization, the threads."""
    from .llamacpp import build_info

    return {
        "engine": LLAMA_CPP,
        "llama_cpp": build_info(),
        "quant": quant_name(model.gguf),
        "threads": model.lm.model.threads,
        "gguf": Path(model.gguf).name,
    }


__all__ = [
    "LLAMA_CPP",
    "GGUF_QUANTS",
    "gguf_file",
    "metadata",
    "written",
    "load",
    "load_drafter",
    "quant_name",
    "stamp",
]
