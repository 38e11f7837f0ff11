"""A reduced-vocabulary copy of a drafter checkpoint (see `runtimes.lean.reduced`): the head cut to the N tokens the
target emits most in gen-data (`train` prompts only), with the id map beside the weights."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from ..errors import DraftwiseError
from ..shards import load_rows
from ..targets import vocab_map as vocab
from ..targets.checkpoint import read_weights
from ..targets.source import resolve


def write_reduced(drafter: str | Path, data_dir: str | Path, size: int, out: str | Path) -> Path:
    """Write `out`: `drafter`'s checkpoint with its head cut to the `size` hottest tokens of gen-data `data_dir`."""
    from transformers import AutoConfig, AutoTokenizer

    source, out = resolve(str(drafter)), Path(out)
    if vocab.read_map(source) is not None:
        raise DraftwiseError(f"{source} already has a reduced head: cut from its full-vocabulary checkpoint")
    config, tokenizer = AutoConfig.from_pretrained(source), AutoTokenizer.from_pretrained(source)
    ids = hot_ids(data_dir, size, config.vocab_size, tokenizer.all_special_ids)
    sub, state = vocab.slice_head(config, read_weights(source), ids)
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors")
    sub.save_pretrained(out)
    tokenizer.save_pretrained(out)
    vocab.write_map(out, ids, config.vocab_size)
    return out


def hot_ids(data_dir: str | Path, size: int, vocab_size: int, special_ids) -> list[int]:
    """The head's rows of a `size`-token draft vocabulary: the hottest target tokens of gen-data `data_dir` (the
    same ids whether a distillation trains with them or `write_reduced` cuts a checkpoint to them)."""
    data_dir = Path(data_dir)
    saved = data_dir / "config.json"
    if not saved.exists() or json.loads(saved.read_text()).get("stage") != "GenDataConfig":
        raise DraftwiseError(
            f"{data_dir} is not a gen-data run folder: the draft vocabulary is counted on the "
            "target's continuations of train prompts only"
        )
    if size >= vocab_size:
        raise DraftwiseError(f"draft vocabulary {size} is not smaller than the vocabulary ({vocab_size})")
    return vocab.hot_vocab(load_rows(data_dir, 10**9), size, vocab_size, special_ids)


def ensure_reduced(folder: Path, size: int, data_dir: str | Path | None) -> None:
    """A pruning or distillation run folder's `reduced/` copy of its `checkpoint/`, when asked for (size > 0) and
    not written yet."""
    if size and not (folder / "reduced" / "config.json").exists():
        print(f"reduced head: {write_reduced(folder / 'checkpoint', data_dir, size, folder / 'reduced')}")
