"""A lean model at int8 or q4 kept as built (a *pack*), so that a later load reads it instead of building it again.

Building is most of a load at these precisions: int8 quantizes every matrix; q4 reads the fp32 conversion of the GGUF
file and finds each row of each matrix among the file's blocks (a 1.7B Q4_1 file: 58 s on 2 cores). A design loads
its target afresh in every stage, so at 1.7B the building was most of each small stage (an agree stage took 47–65 s
for about 8 s of work). A pack holds every tensor of the built model as the engine holds it (packed matrices, norms,
embedding) in one safetensors file under `$DRAFTWISE_CACHE/packed`, named by what it was built from: the checkpoint's
files (path, size, modification time), the precision, the bytes of the GGUF file whose blocks q4 runs, and the code
that lays the tensors out (`LAYOUT`: a change there is a new name, never a stale pack). Reading one reads its tensors
(1.7B q4: about 1.2 GB), nothing more. A newer pack of the same model and precision replaces the older ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ...paths import cache_dir
from ...targets import family as family_module
from ...targets.family import FAMILIES, Shape, rope_keys, windows
from ...targets.source import digest
from . import bank, int8, q4, q56
from . import forward as lean
from .forward import Layer, LeanLM
from .int8 import Int8Weight

PRECISIONS = (int8.NAME, q4.NAME)
LAYOUT = (int8, q4, q56, bank, lean, family_module)  # the modules whose code decides what a built model's tensors are
KINDS = {cls.__name__: cls for cls in (Int8Weight, q4.Q4Weight, q56.Q5Weight, q56.Q6Weight)}
KEY = "draftwise"  # the safetensors metadata entry that describes the pack


def pack_file(path: Path, precision: str, gguf: Path | None = None) -> Path:
    """Where the pack of the checkpoint directory `path` at `precision` (q4: on `gguf`'s blocks) lives."""
    parts = [precision, *(Path(m.__file__).read_text() for m in (*LAYOUT, sys.modules[__name__]))]
    for f in sorted(path.glob("*.safetensors")):
        st = f.stat()
        parts += [str(f.resolve()), str(st.st_size), str(st.st_mtime_ns)]
    if gguf:
        parts.append(digest(gguf))  # its bytes: the same file in another place keeps the pack
    where = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    built = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return cache_dir("packed") / f"{path.name}-{where}-{precision}-{built}.safetensors"


def write(lm: LeanLM, file: Path) -> None:
    """Keep `lm` (built at int8 or q4) as `file`, written whole or not at all; older packs of it are removed."""
    tensors: dict[str, torch.Tensor] = {}
    meta: dict = {"layers": len(lm.layers), "names": [], "weights": {}, "none": []}

    def put(name: str, t) -> None:
        if t is None:
            meta["none"].append(name)
        elif isinstance(t, Int8Weight):
            meta["weights"][name] = [type(t).__name__, t.out_features, t.in_features]
            tensors.update({f"{name}.{b}": getattr(t, b).contiguous() for b in Int8Weight.BUFFERS})
        else:
            tensors[name] = t.contiguous()

    put("embed", lm.embed)
    put("norm_weight", lm.norm_weight)
    put("head", lm.head)
    meta["names"] = list(lm.layers[0].tensor_names)
    for i, layer in enumerate(lm.layers):
        for name in meta["names"]:
            put(f"layers.{i}.{name}", getattr(layer, name))
    tmp = file.with_name(f"{file.name}.{os.getpid()}.tmp")
    save_file(tensors, tmp, metadata={KEY: json.dumps(meta)})
    os.replace(tmp, file)
    for older in file.parent.glob(file.name.rsplit("-", 1)[0] + "-*.safetensors"):
        if older != file:
            older.unlink(missing_ok=True)


def read(file: Path, config, precision: str) -> LeanLM | None:
    """The model `file` keeps (`write`), or None when there is no such pack or it is not one."""
    if not file.is_file():
        return None
    try:
        with safe_open(file, framework="pt", backend="pread") as f:
            return _model(f, json.loads(f.metadata()[KEY]), config, precision)
    except Exception as e:  # noqa: BLE001  (a pack is a cache: one that cannot be read is built again)
        print(f"draftwise: rebuilding the model, its pack {file} could not be read ({e})", file=sys.stderr)
        return None


def _model(f, meta: dict, config, precision: str) -> LeanLM | None:
    if meta["layers"] != config.num_hidden_layers:
        return None

    def get(name: str):
        if name in meta["none"]:
            return None
        if name in meta["weights"]:
            kind, n, k = meta["weights"][name]
            return KINDS[kind].of_buffers({b: f.get_tensor(f"{name}.{b}") for b in Int8Weight.BUFFERS}, n, k)
        return f.get_tensor(name)

    shape, fam = Shape.of(config), FAMILIES[config.model_type]
    layers = [
        Layer({n: get(f"layers.{i}.{n}") for n in meta["names"]}, shape, fam, window, key, precision)
        for i, (window, key) in enumerate(zip(windows(config), rope_keys(config)))
    ]
    sd = {"model.embed_tokens.weight": get("embed"), "model.norm.weight": get("norm_weight")}
    sd["lm_head.weight"] = get("head")
    lm = LeanLM(config, sd, layers=layers, precision=precision)
    return lm
