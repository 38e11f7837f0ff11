"""Drafter specs: the strings `--drafter` takes, parsed and loaded into what the engine drafts with.

  DIR | FILE.gguf | layers:i,j,... | random:...     a model drafter (see `models.load_drafter`)
  ngram[:min=1,max=4]                               prompt lookup over the request (prompt + output so far)
  suffix[:DIR][,depth=32,factor=1,min_prob=0.1,max_n=8,learn=0]
                                                    the request's n-grams plus a suffix index over the target's own
                                                    outputs: DIR is a gen-data run folder (its continuations of
                                                    `train` prompts) or a folder holding a saved corpus
  hybrid:<model spec>+<ngram|suffix spec>[,model_gamma=k]
                                                    the lookup where it has a proposal, the model (≤ k steps) elsewhere

A spec says everything about a drafter, so run folders, grids and design records name drafters by spec alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import LOOKUP_DRAFTERS as LOOKUPS, drafter_kind as kind_of
from .errors import DraftwiseError
from .models import FINGERPRINT_FILE, Model, ModelOptions, describe as describe_model, fingerprint, load_drafter
from .sd.drafters import HybridDrafter, ModelDrafter
from .sd.lookup import NgramDrafter, SuffixDrafter
from .sd.suffix import SuffixTrie

CORPUS_FILE = "suffix_corpus.safetensors"
_MODEL_PREFIXES = ("layers:", "random:")


@dataclass
class Drafter:
    """A loaded drafter: what the engine drafts with, and its parts."""

    spec: str
    kind: str  # model | lookup | hybrid
    engine: object  # ModelDrafter | NgramDrafter | SuffixDrafter | HybridDrafter
    model: Model | None = None  # the model part (transformers baselines, shapes, accuracy)
    lookup: object | None = None  # the lookup part

    def describe(self) -> dict:
        out = {"spec": self.spec, "kind": self.kind}
        if self.model is not None:
            out.update(describe_model(self.model))
            out["spec"] = self.spec
        if self.lookup is not None:
            out["lookup"] = self.lookup.settings()
        return out


def _options(body: str, allowed: dict[str, type], spec: str) -> dict:
    out = {}
    for item in filter(None, (x.strip() for x in body.split(","))):
        key, eq, value = item.partition("=")
        if not eq or key not in allowed:
            raise DraftwiseError(f"bad drafter spec {spec!r}: unknown option {item!r} (options: {', '.join(allowed)})")
        try:
            out[key] = allowed[key](value) if allowed[key] is not bool else value.lower() in ("1", "true", "yes")
        except ValueError:
            raise DraftwiseError(f"bad drafter spec {spec!r}: {key} takes a {allowed[key].__name__}, got {value!r}") from None
    return out


def _body(spec: str, name: str) -> str:
    """What follows the kind: `ngram:min=2` and `ngram,min=2` both give `min=2`."""
    return spec[len(name):][1:] if spec[len(name):][:1] in (":", ",") else spec[len(name):]


def parse_ngram(spec: str) -> NgramDrafter:
    opts = _options(_body(spec, "ngram"), {"min": int, "max": int}, spec)
    lo, hi = opts.get("min", 1), opts.get("max", 4)
    if not 1 <= lo <= hi:
        raise DraftwiseError(f"bad drafter spec {spec!r}: need 1 <= min <= max")
    return NgramDrafter(lo, hi)


SUFFIX_OPTIONS = {"depth": int, "factor": float, "min_prob": float, "max_n": int, "learn": bool}
SUFFIX_DEFAULTS = {"depth": 32, "factor": 1.0, "min_prob": 0.1, "max_n": 8, "learn": False}


def split_suffix(spec: str) -> tuple[str | None, dict]:
    """`suffix:DIR,k=v,...` -> (DIR or None, every option, defaults filled in)."""
    parts = _body(spec, "suffix").split(",")
    folder = parts[0] if parts and parts[0] and "=" not in parts[0] else None
    opts = {**SUFFIX_DEFAULTS, **_options(",".join(parts[1:] if folder else parts), SUFFIX_OPTIONS, spec)}
    if opts["depth"] < 2 or opts["max_n"] < 1 or opts["factor"] <= 0 or not 0 <= opts["min_prob"] <= 1:
        raise DraftwiseError(f"bad drafter spec {spec!r}: need depth >= 2, max_n >= 1, factor > 0, 0 <= min_prob <= 1")
    return folder, opts


def parse_suffix(spec: str, target: Model | None) -> SuffixDrafter:
    folder, opts = split_suffix(spec)
    trie = SuffixTrie(opts.pop("depth"))
    if folder:
        for seq in read_corpus(Path(folder), target):
            trie.add(seq)
    return SuffixDrafter(trie, **opts)


def parse_lookup(spec: str, target: Model | None = None):
    if spec.split(":", 1)[0].split(",", 1)[0] == "ngram":
        return parse_ngram(spec)
    return parse_suffix(spec, target)


def split_hybrid(spec: str) -> tuple[str, str, int | None]:
    """`hybrid:MODEL+LOOKUP[,model_gamma=k]` -> (MODEL, LOOKUP, k)."""
    body = spec.removeprefix("hybrid:")
    cut = max(body.rfind("+" + name) for name in LOOKUPS)
    if cut <= 0:
        raise DraftwiseError(f"bad drafter spec {spec!r}: expected hybrid:<model drafter>+<ngram|suffix spec>")
    model, lookup = body[:cut], body[cut + 1 :]
    gamma = None
    if ",model_gamma=" in lookup:
        lookup, _, value = lookup.partition(",model_gamma=")
        try:
            gamma = int(value)
        except ValueError:
            raise DraftwiseError(f"bad drafter spec {spec!r}: model_gamma takes an integer") from None
        if gamma < 1:
            raise DraftwiseError(f"bad drafter spec {spec!r}: model_gamma must be >= 1")
    if kind_of(model) != "model":
        raise DraftwiseError(f"bad drafter spec {spec!r}: the part before '+' must be a model drafter")
    return model, lookup, gamma


def check_model_spec(spec: str) -> None:
    """An unknown `kind:` prefix is named as such instead of failing later as a missing path."""
    head, colon, _ = spec.partition(":")
    if colon and head.isidentifier() and not spec.startswith(_MODEL_PREFIXES) and not Path(spec).exists():
        raise DraftwiseError(f"unknown drafter kind {head!r} in {spec!r}: use a checkpoint folder, a .gguf file, "
                             "layers:i,j,..., random:..., ngram[:...], suffix[:DIR,...] or hybrid:<model>+<lookup>")


def load(spec: str, target: Model, options: ModelOptions = ModelOptions()) -> Drafter:
    kind = kind_of(spec)
    if kind == "lookup":
        lookup = parse_lookup(spec, target)
        return Drafter(spec, kind, lookup, lookup=lookup)
    if kind == "hybrid":
        model_spec, lookup_spec, gamma = split_hybrid(spec)
        check_model_spec(model_spec)
        model = load_drafter(model_spec, target, options)
        lookup = parse_lookup(lookup_spec, target)
        return Drafter(spec, kind, HybridDrafter(ModelDrafter(model.lm), lookup, gamma), model, lookup)
    check_model_spec(spec)
    model = load_drafter(spec, target, options)
    return Drafter(spec, kind, ModelDrafter(model.lm), model)


# --- the suffix corpus: the target's own continuations of train prompts ----------------------------------------------


def read_corpus(folder: Path, target: Model | None) -> list[list[int]]:
    """The continuations of a gen-data run folder (or a saved corpus), checked against the target's tokenizer and the
    train split: a corpus made of eval prompts' outputs would let a benchmark measure the target copying itself."""
    if not folder.is_dir():
        raise DraftwiseError(f"suffix corpus {folder}: no such folder (give a gen-data run folder)")
    if target is not None:
        _check_tokenizer(folder, target)
    if (folder / CORPUS_FILE).exists():
        return load_corpus(folder / CORPUS_FILE)
    return gen_data_corpus(folder)


def _check_tokenizer(folder: Path, target: Model) -> None:
    path = folder / FINGERPRINT_FILE
    if not path.exists():
        raise DraftwiseError(f"suffix corpus {folder}: not a gen-data run folder of this draftwise (no {FINGERPRINT_FILE}); "
                             "run `draftwise gen-data` to make one")
    saved = json.loads(path.read_text())["fingerprint"]
    if saved != fingerprint(target.tokenizer):
        raise DraftwiseError(f"suffix corpus {folder} was written with another tokenizer than the target's "
                             f"({target.name}): its token ids mean other text")


def gen_data_corpus(folder: Path) -> list[list[int]]:
    from . import data
    from .stages.gen_data import read_shard

    records_path = folder / "records.jsonl"
    config_path = folder / "config.json"
    if not records_path.exists() or not config_path.exists() or json.loads(config_path.read_text()).get("stage") != "GenDataConfig":
        raise DraftwiseError(f"suffix corpus {folder}: not a gen-data run folder (no GenDataConfig config.json and records)")
    records = [json.loads(line) for line in records_path.read_text().splitlines() if line.strip()]
    packaged = {p.id: p for p in data.load_prompts("all", "all")}
    out = []
    for rec in records:
        for prompt_id, _ in rec["prompts"]:
            p = packaged.get(prompt_id)
            if p is not None and data.split_of(p.text) != "train":
                raise DraftwiseError(f"suffix corpus {folder}: holds the output of eval prompt {prompt_id}")
        out += [row["tokens"][row["prompt_len"]:].tolist() for row in read_shard(folder / rec["file"])]
    if not out:
        raise DraftwiseError(f"suffix corpus {folder}: the gen-data run has no finished shard yet")
    return out


def save_corpus(path: Path, seqs: list[list[int]]) -> None:
    from safetensors.torch import save_file

    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    save_file({"tokens": flat, "lengths": lengths}, str(path))


def load_corpus(path: Path) -> list[list[int]]:
    from safetensors.torch import load_file

    t = load_file(str(path))
    flat, out, i = t["tokens"].tolist(), [], 0
    for n in t["lengths"].tolist():
        out.append(flat[i : i + n])
        i += n
    return out
