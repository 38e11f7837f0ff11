"""`suffix[:DIR][,depth=32,factor=1,min_prob=0.1,max_n=8,learn=0]`: the request's n-grams plus a suffix index over
the target's own outputs (SuffixDecoding; the drafter is `sd.lookup.SuffixDrafter`). DIR is a gen-data run folder
(its continuations of `train` prompts) or a folder holding a saved corpus.

Its counterparts elsewhere: vLLM's `suffix` method (its tree grows from the requests it serves: it cannot load the
corpus), llama-server's `ngram-cache` (an n-gram cache that grows with what the server generates).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ... import data
from ...errors import DraftwiseError
from ...rundir import read_records
from ...runtimes.base import Model
from ...shards import read_shard
from ...targets.fingerprint import check_fingerprint
from ..lookup import SuffixDrafter
from ..suffix import SuffixTrie
from .base import Builtin, LookupFamily, Setting, body, options

CORPUS_FILE = "suffix_corpus.safetensors"
EXPORT_DIR = "suffix-corpus"  # where an export copies the corpus
OPTIONS = {"depth": int, "factor": float, "min_prob": float, "max_n": int, "learn": bool}
DEFAULTS = {"depth": 32, "factor": 1.0, "min_prob": 0.1, "max_n": 8, "learn": False}
GRID = ((0.5, 0.1), (1.0, 0.1), (1.0, 0.3), (2.0, 0.1), (2.0, 0.3))  # (factor, min_prob) the design replays
VLLM_NOTE = """vLLM's suffix method grows its global suffix tree from the requests it serves; draftwise starts it from
`suffix-corpus/` (the target's own continuations of train prompts), which vLLM cannot load: expect vLLM to reach the
measured acceptance once it has served comparable traffic.
"""


def split(spec: str) -> tuple[str | None, dict]:
    """`suffix:DIR,k=v,...` -> (DIR or None, every option, defaults filled in)."""
    parts = body(spec, "suffix").split(",")
    folder = parts[0] if parts and parts[0] and "=" not in parts[0] else None
    opts = {**DEFAULTS, **options(",".join(parts[1:] if folder else parts), OPTIONS, spec)}
    if opts["depth"] < 2 or opts["max_n"] < 1 or opts["factor"] <= 0 or not 0 <= opts["min_prob"] <= 1:
        raise DraftwiseError(f"bad drafter spec {spec!r}: need depth >= 2, max_n >= 1, factor > 0, 0 <= min_prob <= 1")
    return folder, opts


def parse(spec: str, target: Model | None = None) -> SuffixDrafter:
    folder, opts = split(spec)
    trie = SuffixTrie(opts.pop("depth"))
    if folder:
        for seq in read_corpus(Path(folder), target):
            trie.add(seq)
    return SuffixDrafter(trie, **opts)


class Suffix(LookupFamily):
    name = "suffix"
    description = "the request's n-grams plus a suffix index over the target's own outputs (SuffixDecoding)"
    usage = "suffix[:DIR,...]"
    where = "in the request or in a corpus of the target's own outputs (`suffix-corpus/`)"

    def lookup(self, spec: str, target: Model | None = None) -> SuffixDrafter:
        return parse(spec, target)

    def grid(self, data: Path | None, target: Model | None) -> list[Setting]:
        """One trie over the corpus, shared by every setting."""
        trie = parse(f"suffix:{data}" if data else "suffix", target).trie
        head = f"suffix:{data}," if data else "suffix,"
        return [
            Setting(
                f"{head}factor={factor:g},min_prob={min_prob:g}",
                {"factor": factor, "min_prob": min_prob},
                SuffixDrafter(trie, factor, min_prob),
            )
            for factor, min_prob in GRID
        ]

    def vllm(self, spec: str, gamma: int) -> dict:
        s = split(spec)[1]
        return {
            "method": "suffix",
            "num_speculative_tokens": gamma,
            "suffix_decoding_max_tree_depth": s["depth"],
            "suffix_decoding_max_spec_factor": s["factor"],
            "suffix_decoding_min_token_prob": s["min_prob"],
        }

    def vllm_note(self, spec: str) -> str:
        return VLLM_NOTE if split(spec)[0] else ""

    def llama_server(self, spec: str, gamma: int, gguf: Callable[[str], Path]) -> Builtin:
        return Builtin("ngram-cache", f"--spec-draft-n-max {gamma}")

    def relocate(self, spec: str, prefix: str = "") -> str:
        folder = split(spec)[0]
        return spec.replace(folder, prefix + EXPORT_DIR, 1) if folder else spec

    def copy_data(self, spec: str, out: Path) -> None:
        folder = split(spec)[0]
        if folder:
            copy_corpus(Path(folder), out / EXPORT_DIR)


FAMILY = Suffix()


# --- the corpus: the target's own continuations of train prompts ------------------------------------------------------


def read_corpus(folder: Path, target: Model | None) -> list[list[int]]:
    """The continuations of a gen-data run folder (or a saved corpus), checked against the target's tokenizer and the
    train split: a corpus made of eval prompts' outputs would let a benchmark measure the target copying itself."""
    if not folder.is_dir():
        raise DraftwiseError(f"suffix corpus {folder}: no such folder (give a gen-data run folder)")
    if target is not None:
        check_fingerprint(folder, target, "suffix corpus")
    if (folder / CORPUS_FILE).exists():
        return load_corpus(folder / CORPUS_FILE)
    return gen_data_corpus(folder)


def gen_data_corpus(folder: Path) -> list[list[int]]:
    """The continuations (outputs only) of a gen-data run folder, refusing one that holds an eval prompt's output."""
    records_path, config_path = folder / "records.jsonl", folder / "config.json"
    stage = json.loads(config_path.read_text()).get("stage") if config_path.exists() else None
    if not records_path.exists() or stage != "GenDataConfig":
        raise DraftwiseError(
            f"suffix corpus {folder}: not a gen-data run folder (no GenDataConfig config.json and records)"
        )
    records = read_records(records_path)
    packaged = {p.id: p for p in data.load_prompts("all", "all")}
    out = []
    for rec in records:
        for prompt_id, _ in rec["prompts"]:
            p = packaged.get(prompt_id)
            if p is not None and data.split_of(p.text) != "train":
                raise DraftwiseError(f"suffix corpus {folder}: holds the output of eval prompt {prompt_id}")
        out += [row["tokens"][row["prompt_len"] :].tolist() for row in read_shard(folder / rec["file"])]
    if not out:
        raise DraftwiseError(f"suffix corpus {folder}: the gen-data run has no finished shard yet")
    return out


def save_corpus(path: Path, seqs: list[list[int]]) -> None:
    flat = torch.tensor([t for s in seqs for t in s], dtype=torch.int32)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.int32)
    save_file({"tokens": flat, "lengths": lengths}, str(path))


def load_corpus(path: Path) -> list[list[int]]:
    t = load_file(str(path))
    flat, out, i = t["tokens"].tolist(), [], 0
    for n in t["lengths"].tolist():
        out.append(flat[i : i + n])
        i += n
    return out


def copy_corpus(folder: Path, dest: Path) -> None:
    """A corpus's own files only: a design stage's done.json names the run folder, which an export must not."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (CORPUS_FILE, "tokenizer.json"):
        if (folder / name).exists():
            shutil.copy2(folder / name, dest / name)
