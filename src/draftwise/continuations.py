"""Target-generated text: packaged prompts of one split, continued by the target in batches.

A drafter is judged by how well it predicts the target, so calibration (pruning), distillation and agreement
measurements all use the target's own continuations, never reference answers. Pruning and training read the
`train` split only; agreement and benchmarks read `eval`; the split is a function of the prompt text, so the two
never share a prompt. A gen-data run keeps them in shards (`shards`: token ids, prompt lengths and the target's top-k at
each continuation position), which distillation and a suffix drafter's corpus read.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from . import data
from .errors import DraftwiseError
from .rundir import write_atomic
from .sd.batched import generate_batch
from .sd.sampling import SamplingParams, argmax


@dataclass(frozen=True)
class Sequence:
    prompt_id: str
    tokens: list[int]  # prompt (through the chat template) + the target's continuation
    prompt_len: int

    @property
    def continuation(self) -> list[int]:
        return self.tokens[self.prompt_len :]


def prompts_for(
    target,
    split: str,
    suites: str = "all",
    max_prompt_tokens: int = 256,
    limit: int | None = None,
    file: str | None = None,
) -> list[tuple[data.Prompt, list[int]]]:
    """Prompts of `split`, taken round-robin over the suites and, within each suite, over its categories, so any prefix
    is varied (a suite with many categories, such as MMLU's subjects, does not crowd out the others), encoded; longer
    ones than `max_prompt_tokens` are skipped (they would dominate the cost of calibration). `file`: the user's own
    prompts (their traffic) instead of the suites, round-robin over their categories likewise."""
    by_suite: dict[str, dict[str, list[data.Prompt]]] = {}
    for p in data.read_prompt_file(file) if file else data.load_prompts(suites, split):
        by_suite.setdefault(p.suite, {}).setdefault(p.category, []).append(p)
    order = _interleave([_interleave(list(cats.values())) for cats in by_suite.values()])
    out = []
    for p in order:
        ids = target.encode(p.text)
        if 0 < len(ids) <= max_prompt_tokens:
            out.append((p, ids))
            if limit and len(out) >= limit:
                break
    if not out:
        raise DraftwiseError(f"no {split} prompt of {file or suites} fits in {max_prompt_tokens} tokens")
    return out


def _interleave(lists: list[list]) -> list:
    return [x[i] for i in range(max(map(len, lists), default=0)) for x in lists if i < len(x)]


def generate(
    target,
    prompts: list[tuple[data.Prompt, list[int]]],
    max_new_tokens: int,
    n_tokens: int | None = None,
    params: SamplingParams = SamplingParams(),
    batch_size: int = 8,
    seed: int = 0,
    desc: str = "target continuations",
) -> list[Sequence]:
    """Continue prompts in batches until every prompt is done or `n_tokens` new tokens exist."""
    gen = torch.Generator(device=target.lm.device).manual_seed(seed)
    out: list[Sequence] = []
    total = 0
    bar = tqdm(
        total=n_tokens or len(prompts) * max_new_tokens, desc=desc, unit="tok", file=sys.stderr, dynamic_ncols=True
    )
    for i in range(0, len(prompts), batch_size):
        chunk = prompts[i : i + batch_size]
        conts = generate_batch(target.lm, [ids for _, ids in chunk], params, max_new_tokens, gen, target.eos_ids)
        for (p, ids), c in zip(chunk, conts):
            out.append(Sequence(p.id, ids + c.tokens, len(ids)))
            total += len(c.tokens)
            bar.update(len(c.tokens))
        if n_tokens and total >= n_tokens:
            break
    bar.close()
    return out


def cached(path: Path, make: Callable[[], list[Sequence]]) -> list[Sequence]:
    """The sequences saved at `path` (JSONL), or `make()`'s, written atomically first: a rerun reads the same ones."""
    if path.exists():
        return [Sequence(**json.loads(line)) for line in path.read_text().splitlines()]
    seqs = make()
    write_atomic(path, "".join(json.dumps(s.__dict__) + "\n" for s in seqs))
    return seqs


def held_out(path: Path, target, suites: str, prompts: int, tokens: int) -> list[Sequence]:
    """The target's greedy continuations of `prompts` eval prompts (`tokens` each), cached at `path`: what a training
    stage measures held-out agreement on."""
    return cached(
        path,
        lambda: generate(target, prompts_for(target, "eval", suites, 256, prompts), tokens, desc="eval continuations"),
    )


def batches(seqs: list[Sequence], batch_size: int, pad_id: int = 0):
    """Left-padded batches for teacher-forced passes: (ids [B, T], start [B], scored [B, n] bool, n).

    The last n = 1 + max continuation length positions of each row are returned as logits by
    `forward(..., n_logits=n)`; `scored` marks those that predict a continuation token (from the last prompt token
    to the second-to-last token of each row)."""
    for i in range(0, len(seqs), batch_size):
        chunk = seqs[i : i + batch_size]
        T = max(len(s.tokens) for s in chunk)
        n = max(len(s.continuation) for s in chunk) + 1
        ids = torch.tensor([[pad_id] * (T - len(s.tokens)) + s.tokens for s in chunk])
        start = [T - len(s.tokens) for s in chunk]
        # logit j of the last n (absolute T-n+j) predicts token T-n+j+1: scored when that token is a continuation one
        scored = torch.tensor([[T - len(s.continuation) - 1 <= T - n + j < T - 1 for j in range(n)] for s in chunk])
        yield ids, start, scored, n


@torch.no_grad()
def top1_matches(lm, seqs: list[Sequence], batch_size: int = 8) -> list[list[bool]]:
    """Per sequence, whether `lm`'s argmax after each prefix equals the next continuation token (teacher-forced)."""
    out = []
    for ids, start, scored, n in batches(seqs, batch_size):
        lm.reset(ids.shape[0], ids.shape[1])
        predicted = argmax(lm.forward(ids, 0, n, start).float())  # [B, n]: the token lm puts after each position
        following = ids[:, -n + 1 :]  # [B, n-1]: the token that follows each of those positions but the last
        out += [(predicted[b, :-1] == following[b])[scored[b, :-1]].tolist() for b in range(ids.shape[0])]
    return out
