"""`draftwise gen-data`: the target's own continuations of `train` prompts, with its top-k distribution at every
generated position — the data distillation learns from.

Why the target's text: a drafter is useful only where it predicts the target, and the target's continuations are
exactly the contexts SD will draft in; greedy (T=0) and sampled (T=1) continuations of varied prompts cover both
decoding modes. Work units are (prompt, temperature) pairs in a fixed order, cut into shards; each shard is written
atomically (safetensors: token ids, prompt lengths, top-k ids and probabilities) and then recorded, so a killed run
resumes shard by shard. Prompts in the `eval` split never enter: packaged ones are filtered by split and a user's
file is filtered by the same text hash. The continuations are also a suffix drafter's corpus (`suffix:<this folder>`);
tokenizer.json names the tokenizer that wrote them. The shard format is `shards`'.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .. import data
from ..config import GenDataConfig
from ..rundir import RunDir
from ..runtimes.base import ModelOptions
from ..runtimes.registry import load
from ..sd.batched import generate_batch
from ..sd.sampling import SamplingParams
from ..shards import write_shard
from ..targets.fingerprint import write_fingerprint


def units(config: GenDataConfig, target) -> list[tuple[data.Prompt, list[int], float]]:
    prompts = data.load_prompts(config.suites, "train")
    if config.prompts:
        user = data.read_prompt_file(config.prompts)
        kept = [p for p in user if data.split_of(p.text) == "train"]
        if len(kept) < len(user):
            print(
                f"gen-data: dropped {len(user) - len(kept)} prompt(s) of {config.prompts} that fall in the eval split",
                file=sys.stderr,
            )
        prompts += kept
    encoded = [(p, target.encode(p.text)) for p in prompts]
    encoded = [(p, ids) for p, ids in encoded if 0 < len(ids) <= config.max_prompt_tokens][config.skip :]
    if config.limit:
        encoded = encoded[: config.limit]
    return [(p, ids, t) for p, ids in encoded for t in config.temperatures]  # a prompt's temperatures side by side


def batches(shard: list, batch_size: int):
    """(temperatures, [(prompt, ids)]) batches of about `batch_size` sequences: each prompt with the temperatures it
    has in the shard (one prefill for all of them), prompts of similar length together (less left padding)."""
    seen: dict[tuple, tuple] = {}  # (prompt id, ids) -> (prompt, ids, its temperatures)
    for p, ids, t in shard:
        seen.setdefault((p.id, tuple(ids)), (p, ids, []))[2].append(t)
    groups: dict[tuple[float, ...], list] = {}
    for p, ids, ts in seen.values():
        groups.setdefault(tuple(ts), []).append((p, ids))
    for ts, part in groups.items():
        part.sort(key=lambda x: len(x[1]))
        per = max(1, batch_size // len(ts))
        for i in range(0, len(part), per):
            yield ts, part[i : i + per]


def run(config: GenDataConfig, out: str | Path) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = RunDir(out, config)
    (run_dir.path / "shards").mkdir(exist_ok=True)
    target = load(config.target, ModelOptions(config.dtype, config.device))
    write_fingerprint(run_dir.path, target.tokenizer)  # whose token ids these are (a suffix corpus checks it)
    work = units(config, target)
    shards = [work[i : i + config.shard_size] for i in range(0, len(work), config.shard_size)]
    done = {r["shard"] for r in run_dir.records()}
    gen = torch.Generator(device=target.lm.device)
    bar = tqdm(
        total=sum(len(s) for i, s in enumerate(shards) if i not in done),
        desc="gen-data",
        unit="seq",
        file=sys.stderr,
        dynamic_ncols=True,
    )
    for index, shard in enumerate(shards):
        if index in done:
            continue
        gen.manual_seed(config.seed * 1_000_003 + index)  # each shard's randomness is its own: resumes match
        start, rows = time.perf_counter(), []
        for temps, part in batches(shard, config.batch_size):
            conts = generate_batch(
                target.lm,
                [ids for _, ids in part],
                [SamplingParams(t) for t in temps],  # each prompt prefilled once, continued at each temperature
                config.max_new_tokens,
                gen,
                target.eos_ids,
                topk=config.topk,
            )
            rows += [
                {
                    "prompt_id": p.id,
                    "temperature": t,
                    "tokens": ids + c.tokens,
                    "prompt_len": len(ids),
                    "topk_ids": c.topk_ids,
                    "topk_probs": c.topk_probs,
                }
                for k, (p, ids) in enumerate(part)
                for j, t in enumerate(temps)
                for c in [conts[k * len(temps) + j]]
            ]
            bar.update(len(part) * len(temps))
        write_shard(run_dir.path / "shards" / f"shard-{index:05d}.safetensors", rows, config.topk)
        new = sum(len(r["topk_ids"]) for r in rows)
        seconds = time.perf_counter() - start
        run_dir.append(
            {
                "shard": index,
                "file": f"shards/shard-{index:05d}.safetensors",
                "sequences": len(rows),
                "new_tokens": new,
                "seconds": seconds,
                "prompts": [[r["prompt_id"], r["temperature"]] for r in rows],
            }
        )
        bar.set_postfix_str(f"{new / seconds:.0f} tok/s")
    bar.close()
    records = run_dir.records()
    tokens, seconds = sum(r["new_tokens"] for r in records), sum(r["seconds"] for r in records)
    print(
        f"{len(records)} shards, {sum(r['sequences'] for r in records)} sequences, {tokens} target tokens "
        f"({tokens / max(seconds, 1e-9):.0f} tokens/s); data: {run_dir.path}"
    )
    return run_dir.path
