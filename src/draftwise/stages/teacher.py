"""`draftwise teacher`: the target's top-k distribution and feature at every position of text it scores teacher-forced
— the data distillation, feature-level drafters and pruning learn from, at the speed the machine allows.

Why teacher-forced: generating the target's continuations runs at decode speed (one token per forward); scoring text
the target did not have to generate is one prefill-like pass over many tokens at once, which a CPU does at a large
multiple of decode speed. Sources, in order (a `--tokens` cap keeps the first): a gen-data run's sequences (the
target's own text: its continuations are scored, prompts are context), a user's `--text` file, and the packaged
suites' train split (round-robin over suites and categories, so any prefix is varied). Long texts are cut into pieces
of `seq_len` tokens. Eval prompts never enter: suites by split, a user's text by exact match with a packaged eval
prompt.

Caching: work is cut into shards of `shard_size` sequences in a fixed order; a shard's file is named by the hash of
what decides it (the model: tokenizer and weight files; precision, top-k, features, its token ids) and kept under
`$DRAFTWISE_CACHE/teacher`, so every candidate, rerun and later design on the same target and text reads it instead
of computing it again. The run folder's records.jsonl lists its shards (source, tokens, seconds, cached) and is
appended shard by shard: a killed run resumes where it stopped. The shard format is `shards`' (with `hidden`).

Precision: `auto` scores at bf16 where the CPU computes bf16 natively (AVX-512 BF16 or AMX: ~4× fp32 matmul speed
measured on an EPYC Zen 5) and fp32 elsewhere; a lossy teacher is a labelled choice, so its top-1 agreement with the
fp32 target is measured on the first batch and recorded (`fidelity`; kept in the cache with the shards).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from .. import continuations, data, memory
from ..config import INTEGER, TeacherConfig
from ..errors import DraftwiseError
from ..paths import cache_dir
from ..rundir import RunDir, read_records, write_atomic
from ..runtimes.base import ModelOptions, put_down
from ..runtimes.registry import load
from ..shards import read_shard, write_shard
from ..targets.fingerprint import check_fingerprint, fingerprint, write_fingerprint
from ..targets.source import key_of, stamp_of
from ..timing import native_bf16

KERNEL_ROWS = 512  # tokens a teacher pass on the int8 kernel (int8, q4) takes at most, by default


@dataclass(frozen=True)
class Piece:
    """One sequence to score: `prompt_len` - 1 is its first scored position (1: every position after the first)."""

    source: str  # continuations | text | suites
    tokens: tuple[int, ...]
    prompt_len: int = 1

    @property
    def scored(self) -> int:
        return len(self.tokens) - self.prompt_len


def precision(config: TeacherConfig) -> str:
    if config.precision != "auto":
        return config.precision
    return "bf16" if native_bf16(config.device) else "fp32"


def batch_size(config: TeacherConfig, prec: str) -> int:
    """Sequences per pass: the config's, or by what computes the pass (`TeacherConfig.batch_size`): the int8 kernel
    reads every pass's activations once per group of weight rows, so past ~512 rows they no longer stay in the cache;
    torch's matmul gains from the largest pass."""
    if config.batch_size:
        return config.batch_size
    return max(1, KERNEL_ROWS // config.seq_len) if prec in INTEGER else 8


def _cut(tokens: list[int], config: TeacherConfig, source: str) -> list[Piece]:
    pieces = [tuple(tokens[i : i + config.seq_len]) for i in range(0, len(tokens), config.seq_len)]
    return [Piece(source, p) for p in pieces if len(p) >= config.min_len]


def read_text(path: str, target) -> list[list[int]]:
    """A user's text as token ids (the tokenizer alone, no chat template): .jsonl rows with a `text` or `prompt`
    field, or plain text cut at blank lines; items equal to a packaged eval prompt are dropped (held out)."""
    p = Path(path)
    if not p.is_file():
        raise DraftwiseError(f"text file not found: {p}")
    try:
        content = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DraftwiseError(f"text file is not UTF-8: {p} (byte {e.start})") from None
    if p.suffix.lower() == ".jsonl":
        items = []
        for n, line in enumerate(content.split("\n"), 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    items.append(row.get("text") or row["prompt"])
                except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
                    raise DraftwiseError(
                        f"{p} line {n}: expected a JSON object with a 'text' or 'prompt' string"
                    ) from None
    else:
        items = [block.strip() for block in content.split("\n\n") if block.strip()]
    held_out = {" ".join(q.text.split()) for q in data.load_prompts("all", "eval")}
    kept = [t for t in items if " ".join(t.split()) not in held_out]
    if len(kept) < len(items):
        print(f"teacher: dropped {len(items) - len(kept)} item(s) of {p} equal to eval prompts", file=sys.stderr)
    return [target.tokenizer(t)["input_ids"] for t in kept]


def pieces(config: TeacherConfig, target) -> list[Piece]:
    """Every sequence to score, sources in order, cut to `config.tokens` scored positions."""
    out: list[Piece] = []
    if config.continuations:
        folder = Path(config.continuations)
        check_fingerprint(folder, target, "gen-data run folder")
        for rec in sorted((r for r in read_records(folder / "records.jsonl") if "file" in r), key=lambda r: r["shard"]):
            for row in read_shard(folder / rec["file"]):
                toks = row["tokens"].tolist()[-config.seq_len :]  # keep the continuation, cut the prompt's left
                start = max(1, row["prompt_len"] - (len(row["tokens"]) - len(toks)))
                if len(toks) - start >= 1:
                    out.append(Piece("continuations", tuple(toks), start))
    if config.text:
        out += [piece for ids in read_text(config.text, target) for piece in _cut(ids, config, "text")]
    if config.suites != "none":
        prompts = continuations.prompts_for(target, "train", config.suites, max_prompt_tokens=10**9)
        out += [piece for _, ids in prompts for piece in _cut(ids, config, "suites")]
    if not out:
        raise DraftwiseError("teacher: no text to score (every source empty or shorter than --min-len)")
    if config.tokens:
        total = 0
        for i, piece in enumerate(out):
            total += piece.scored
            if total >= config.tokens:
                return out[: i + 1]
    return out


def model_key(target) -> str:
    """Whose scores a shard holds: the tokenizer's fingerprint and the weights' files (paths, sizes, modification
    times). Why both: models of one family share a tokenizer (the 0.5B and 1.5B Qwen2.5-Coder), and a key of the
    tokenizer alone served one model's top-k as the other's."""
    weights = stamp_of(target.path) if target.path else ""
    return key_of(fingerprint(target.tokenizer), weights)


def shard_key(shard: list[Piece], model: str, prec: str, config: TeacherConfig) -> str:
    """What decides a shard's content, hashed: its file name in the cache (`model`: `model_key`)."""
    h = hashlib.sha256(json.dumps([model, prec, config.topk, config.features]).encode())
    for piece in shard:
        h.update(json.dumps([piece.prompt_len, piece.tokens]).encode())
    return h.hexdigest()[:32]


@torch.inference_mode()
def score(lm, batch: list[Piece], topk: int, features: bool) -> list[dict]:
    """One teacher-forced pass over left-padded sequences: per sequence its shard row (top-k and features at the
    scored positions)."""
    T = max(len(p.tokens) for p in batch)
    ids = torch.tensor([[0] * (T - len(p.tokens)) + list(p.tokens) for p in batch])
    start = [T - len(p.tokens) for p in batch]
    lm.reset(len(batch), T)
    # the head only where a position is scored (a continuation's prompt is context): at Qwen's 152k rows it costs as
    # much as a 1.5B's layers, and left padding puts every scored position in the last n
    n = max(len(p.tokens) - p.prompt_len + 1 for p in batch)
    logits = lm.forward(ids, 0, n, start)  # [B, n, V] at the teacher's precision (a float copy: slower by ~15 %)
    hidden = lm.features(lm.last_hidden) if features else None  # [B, T, D]
    rows = []
    for b, p in enumerate(batch):
        first = start[b] + p.prompt_len - 1  # the positions predicting tokens prompt_len .. end
        lg = logits[b, first - (T - n) : n - 1]
        top = lg.topk(topk, dim=-1)
        row = {
            "tokens": list(p.tokens),
            "prompt_len": p.prompt_len,
            "topk_ids": top.indices,
            "topk_probs": torch.exp(top.values.float() - torch.logsumexp(lg.float(), -1, keepdim=True)),
        }
        if hidden is not None:
            row["hidden"] = hidden[b, first : T - 1].float()
        rows.append(row)
    return rows


def compute(lm, shard: list[Piece], config: TeacherConfig, prec: str, bar) -> list[dict]:
    order = sorted(range(len(shard)), key=lambda i: len(shard[i].tokens))  # similar lengths: less padding
    rows: dict[int, dict] = {}
    n = batch_size(config, prec)
    for i in range(0, len(order), n):
        part = order[i : i + n]
        for j, row in zip(part, score(lm, [shard[j] for j in part], config.topk, config.features)):
            rows[j] = row
        bar.update(sum(shard[j].scored for j in part))
    return [rows[i] for i in range(len(shard))]


def top1(lm, batch: list[Piece], config: TeacherConfig, prec: str) -> list[torch.Tensor]:
    """Each piece's greedy token at its scored positions, in passes of the teacher's batch size (a pass over all 8
    fidelity pieces held 1.2 GB of logits at Qwen's 152k vocabulary)."""
    n = batch_size(config, prec)
    return [row["topk_ids"] for i in range(0, len(batch), n) for row in score(lm, batch[i : i + n], 1, False)]


def fidelity(config: TeacherConfig, batch: list[Piece], teacher: list[torch.Tensor], prec: str) -> dict:
    """Top-1 agreement of the teacher (a lossy precision; `teacher`: its `top1` on `batch`) with the fp32 target, and
    the seconds the fp32 target took (what a design's plan prices: `design.costs.FIDELITY_STEPS`)."""
    start = time.perf_counter()
    ref = load(config.target, ModelOptions("fp32", config.device)).lm
    fp32 = top1(ref, batch, config, prec)
    del ref
    memory.release()
    same = sum(int((x == y).sum()) for x, y in zip(teacher, fp32))
    n = sum(len(x) for x in teacher)
    seconds = round(time.perf_counter() - start, 2)
    return {"event": "fidelity", "top1_agreement": same / n, "positions": n, "seconds": seconds}


def fidelity_path(store: Path | None, model: str, prec: str, batch: list[Piece], config: TeacherConfig) -> Path | None:
    """Where `fidelity` on `batch` is kept beside the shards, under the same kind of key: a later run on the same
    target, precision and text reads it instead of loading the fp32 target again (most of a minute on 2 cores)."""
    return store / f"{shard_key(batch, model, prec, config)}.fidelity.json" if store else None


def run(config: TeacherConfig, out: str | Path) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = RunDir(out, config)
    prec = precision(config)
    options = ModelOptions(prec, config.device, "lean")
    target = load(config.target, options)
    write_fingerprint(run_dir.path, target.tokenizer)
    work = pieces(config, target)
    shards = [work[i : i + config.shard_size] for i in range(0, len(work), config.shard_size)]
    records = run_dir.records()
    done = {r["shard"] for r in records if "shard" in r}
    model = model_key(target)
    store = cache_dir("teacher") if config.cache else run_dir.path / "shards"
    store.mkdir(parents=True, exist_ok=True)
    todo = [i for i in range(len(shards)) if i not in done]
    bar = tqdm(total=sum(p.scored for i in todo for p in shards[i]), desc="teacher", unit="tok", file=sys.stderr)
    if prec != "fp32" and not any(r.get("event") == "fidelity" for r in records):
        batch = work[: min(8, len(work))]
        path = fidelity_path(store if config.cache else None, model, prec, batch, config)
        if path and path.exists():
            record = {**json.loads(path.read_text()), "cached": True}
        else:
            # the teacher is put down while the fp32 target runs, then loaded again: the 1.5B at fp32 is 7.2 GB, and
            # beside its q4 teacher (2.4 GB) a design's teacher stage peaked at 17.7 GB
            mine = top1(target.lm, batch, config, prec)
            with put_down(target, lambda: load(config.target, options)):
                record = fidelity(config, batch, mine, prec)
            if path:
                write_atomic(path, json.dumps(record))
        run_dir.append(record)
    for index in todo:
        shard = shards[index]
        path = store / f"{shard_key(shard, model, prec, config)}.safetensors"
        start, cached = time.perf_counter(), path.exists()
        if not cached:
            write_shard(path, compute(target.lm, shard, config, prec, bar), config.topk)
        else:
            bar.update(sum(p.scored for p in shard))
        seconds = time.perf_counter() - start
        tokens = sum(p.scored for p in shard)
        sources = {s: sum(p.scored for p in shard if p.source == s) for s in dict.fromkeys(p.source for p in shard)}
        run_dir.append(
            {
                "shard": index,
                "file": str(path.resolve()),
                "sequences": len(shard),
                "tokens": tokens,
                "sources": sources,
                "seconds": seconds,
                "cached": cached,
                "precision": prec,
            }
        )
        bar.set_postfix_str("cached" if cached else f"{tokens / seconds:.0f} tok/s")
    bar.close()
    print(summary(run_dir.records()) + f"\ndata: {run_dir.path}")
    return run_dir.path


def throughput(records: list[dict]) -> dict[str, dict]:
    """Per source: tokens scored and tokens/s of the shards computed in this folder (cached ones cost nothing)."""
    out: dict[str, dict] = {}
    for r in records:
        if "shard" not in r:
            continue
        for source, n in r["sources"].items():
            s = out.setdefault(source, {"tokens": 0, "computed": 0, "seconds": 0.0})
            s["tokens"] += n
            if not r["cached"]:
                s["computed"] += n
                s["seconds"] += r["seconds"] * n / r["tokens"]
    for s in out.values():
        s["tokens_per_s"] = s["computed"] / s["seconds"] if s["seconds"] else None
    return out


def summary(records: list[dict]) -> str:
    parts = []
    for source, s in throughput(records).items():
        rate = f", {s['tokens_per_s']:.0f} tokens/s" if s["tokens_per_s"] else ""
        parts.append(f"{source} {s['tokens']} tokens ({s['tokens'] - s['computed']} cached{rate})")
    fid = next((r for r in records if r.get("event") == "fidelity"), None)
    tail = f"; teacher top-1 = fp32 target's at {fid['top1_agreement']:.1%} of positions" if fid else ""
    return "teacher data: " + "; ".join(parts) + tail
