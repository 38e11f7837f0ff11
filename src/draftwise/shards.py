"""gen-data's shard format: the target's continuations (token ids, prompt lengths) with its top-k ids and
probabilities at each continuation position, one safetensors file per shard. Below the decoding code, so a drafter
family (the suffix corpus) and the stages (distillation, draft vocabularies) read shards without depending on how
they were generated."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .errors import DraftwiseError
from .rundir import read_records


def write_shard(path: Path, rows: list[dict], topk: int) -> None:
    """Rows (tokens, prompt_len, topk_ids, topk_probs per continuation position) as one safetensors file, atomically."""
    n, T = len(rows), max(len(r["tokens"]) for r in rows)
    C = max(len(r["topk_ids"]) for r in rows)
    tokens = torch.full((n, T), -1, dtype=torch.int32)
    ids = torch.zeros(n, C, topk, dtype=torch.int32)
    probs = torch.zeros(n, C, topk, dtype=torch.float16)
    for i, r in enumerate(rows):
        tokens[i, : len(r["tokens"])] = torch.tensor(r["tokens"], dtype=torch.int32)
        c = len(r["topk_ids"])
        ids[i, :c] = torch.tensor(r["topk_ids"], dtype=torch.int32)
        probs[i, :c] = torch.tensor(r["topk_probs"], dtype=torch.float16)
    tensors = {
        "tokens": tokens,
        "lengths": torch.tensor([len(r["tokens"]) for r in rows], dtype=torch.int32),
        "prompt_lengths": torch.tensor([r["prompt_len"] for r in rows], dtype=torch.int32),
        "topk_ids": ids,
        "topk_probs": probs,
    }
    tmp = path.with_suffix(".tmp")
    save_file(tensors, tmp)
    tmp.replace(path)


def read_shard(path: Path) -> list[dict]:
    """Rows of a shard: tokens (prompt + continuation), prompt_len, and per continuation position topk ids/probs."""
    t = load_file(path)
    out = []
    for i in range(len(t["lengths"])):
        n, p = int(t["lengths"][i]), int(t["prompt_lengths"][i])
        c = n - p
        out.append(
            {
                "tokens": t["tokens"][i, :n].long(),
                "prompt_len": p,
                "topk_ids": t["topk_ids"][i, :c].long(),
                "topk_probs": t["topk_probs"][i, :c].float(),
            }
        )
    return out


def load_rows(data_dir: Path, max_len: int) -> list[dict]:
    """Every row of a gen-data run folder's shards, each cut to its last `max_len` tokens (distillation's input)."""
    records = read_records(data_dir / "records.jsonl")
    if not records:
        raise DraftwiseError(f"no gen-data shards in {data_dir}: run `draftwise gen-data --out {data_dir}` first")
    rows = [r for rec in sorted(records, key=lambda r: r["shard"]) for r in read_shard(data_dir / rec["file"])]
    return [_truncate(r, max_len) for r in rows if len(r["topk_ids"])]


def _truncate(row: dict, max_len: int) -> dict:
    """Keep the last max_len tokens (a long prompt is cut from the left; continuation positions are kept)."""
    cut = max(0, len(row["tokens"]) - max_len)
    if cut > row["prompt_len"] - 1:
        drop = cut - (row["prompt_len"] - 1)
        return {
            **row,
            "tokens": row["tokens"][cut:],
            "prompt_len": 1,
            "topk_ids": row["topk_ids"][drop:],
            "topk_probs": row["topk_probs"][drop:],
        }
    return {**row, "tokens": row["tokens"][cut:], "prompt_len": row["prompt_len"] - cut}
