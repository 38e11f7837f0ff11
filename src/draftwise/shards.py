"""The teacher's shard format (gen-data's and the teacher cache's): sequences (token ids, prompt lengths) with the
target's top-k ids and probabilities at each scored ("continuation") position and, optionally, its feature there
(`hidden`: the final-normed last hidden state the LM head reads, bf16), one safetensors file per shard. Continuation
token j of a row is predicted at position prompt_len - 1 + j; text scored teacher-forced has prompt_len 1 (every
position after the first is scored). Below the decoding code, so a drafter
family (the suffix corpus) and the stages (distillation, draft vocabularies) read shards without depending on how
they were generated."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .errors import DraftwiseError
from .rundir import read_records


def write_shard(path: Path, rows: list[dict], topk: int) -> None:
    """Rows (tokens, prompt_len, topk_ids, topk_probs per continuation position; optionally hidden [c, D]) as one
    safetensors file, atomically."""
    n, T = len(rows), max(len(r["tokens"]) for r in rows)
    C = max(len(r["topk_ids"]) for r in rows)
    tokens = torch.full((n, T), -1, dtype=torch.int32)
    ids = torch.zeros(n, C, topk, dtype=torch.int32)
    probs = torch.zeros(n, C, topk, dtype=torch.float16)
    for i, r in enumerate(rows):
        tokens[i, : len(r["tokens"])] = torch.tensor(r["tokens"], dtype=torch.int32)
        c = len(r["topk_ids"])
        ids[i, :c] = torch.as_tensor(r["topk_ids"]).to(torch.int32)
        probs[i, :c] = torch.as_tensor(r["topk_probs"]).to(torch.float16)
    tensors = {
        "tokens": tokens,
        "lengths": torch.tensor([len(r["tokens"]) for r in rows], dtype=torch.int32),
        "prompt_lengths": torch.tensor([r["prompt_len"] for r in rows], dtype=torch.int32),
        "topk_ids": ids,
        "topk_probs": probs,
    }
    if "hidden" in rows[0]:  # the target's features at the scored positions
        hidden = torch.zeros(n, C, rows[0]["hidden"].shape[-1], dtype=torch.bfloat16)
        for i, r in enumerate(rows):
            hidden[i, : len(r["hidden"])] = r["hidden"].to(torch.bfloat16)
        tensors["hidden"] = hidden
    tmp = path.with_suffix(".tmp")
    save_file(tensors, tmp)
    tmp.replace(path)


def read_shard(path: Path) -> list[dict]:
    """Rows of a shard: tokens (prompt + continuation), prompt_len, and per continuation position topk ids/probs
    (and hidden [c, D] float, when the shard holds features)."""
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
            | ({"hidden": t["hidden"][i, :c].float()} if "hidden" in t else {})
        )
    return out


def load_rows(data_dir: Path, max_len: int) -> list[dict]:
    """Every row of a gen-data or teacher run folder's shards, each cut to its last `max_len` tokens (distillation's
    input)."""
    records = [r for r in read_records(Path(data_dir) / "records.jsonl") if "file" in r]
    if not records:
        raise DraftwiseError(
            f"no teacher shards in {data_dir}: run `draftwise gen-data` or `draftwise teacher --out {data_dir}` first"
        )
    rows = [r for rec in sorted(records, key=lambda r: r["shard"]) for r in read_shard(Path(data_dir) / rec["file"])]
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
        } | ({"hidden": row["hidden"][drop:]} if "hidden" in row else {})
    return {**row, "tokens": row["tokens"][cut:], "prompt_len": row["prompt_len"] - cut}
