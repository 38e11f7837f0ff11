"""`draftwise agree`: how often a drafter's top-1 token matches the target's, teacher-forced on the target's own
greedy continuations of `eval` prompts — a cheap, exact stand-in for greedy SD.

Exact because greedy SD drafts from the target's accepted prefix: position t's draft is accepted iff the drafter's
argmax after the target's tokens 0..t−1 equals the target's token t. Replaying rounds of γ over each sequence's
match pattern (`greedy_rounds`) therefore gives the TAR a real greedy SD run would measure on those continuations.
Continuations and matches are raw records (one per prompt); agree.json is derived.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from tqdm import tqdm

from .. import continuations
from ..config import AgreeConfig
from ..models import ModelOptions, load, load_drafter
from ..rundir import RunDir


def greedy_rounds(matches: list[bool], gamma: int) -> tuple[int, int]:
    """(rounds, tokens) of greedy SD with lookahead γ over a continuation whose position t the drafter gets right
    iff matches[t]: each round accepts the leading matches (≤ γ) and emits one more token."""
    rounds = tokens = t = 0
    while t < len(matches):
        accepted = 0
        while accepted < gamma and t + accepted < len(matches) and matches[t + accepted]:
            accepted += 1
        emitted = min(accepted + 1, len(matches) - t)
        rounds, tokens, t = rounds + 1, tokens + emitted, t + emitted
    return rounds, tokens


def greedy_tar(matches: list[list[bool]], gamma: int) -> float | None:
    """Tokens per round of greedy SD with lookahead γ replayed over every sequence's match pattern."""
    rounds, tokens = map(sum, zip(*(greedy_rounds(m, gamma) for m in matches))) if matches else (0, 0)
    return tokens / rounds if rounds else None


def run(config: AgreeConfig, out: str | Path) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = RunDir(out, config)
    options = ModelOptions(config.dtype, config.device)
    target = load(config.target, options)
    drafter = load_drafter(config.drafter, target, options)
    done = {r["prompt_id"] for r in run_dir.records()}
    prompts = continuations.prompts_for(target, config.split, config.suites, config.max_prompt_tokens, config.limit)
    todo = [(p, ids) for p, ids in prompts if p.id not in done]
    bar = tqdm(total=len(todo), desc="agree", unit="prompt", file=sys.stderr, dynamic_ncols=True, disable=not todo)
    for i in range(0, len(todo), config.batch_size):
        chunk = todo[i : i + config.batch_size]
        seqs = continuations.generate(target, chunk, config.max_new_tokens, batch_size=config.batch_size, desc="target")
        matches = continuations.top1_matches(drafter.lm, seqs, len(seqs))
        for (p, _), seq, match in zip(chunk, seqs, matches):
            run_dir.append({"prompt_id": p.id, "suite": p.suite, "category": p.category, "prompt_tokens": seq.prompt_len,
                            "continuation": seq.continuation, "matches": [int(m) for m in match]})
        bar.update(len(chunk))
    bar.close()
    summary = summarize(run_dir.records(), config)
    run_dir.write_json("agree.json", summary)
    print(format_agree(summary))
    return run_dir.path


def summarize(records: list[dict], config: AgreeConfig) -> dict:
    matches = [r["matches"] for r in records]
    total = sum(len(m) for m in matches)
    by_suite: dict[str, list] = {}
    for r in records:
        by_suite.setdefault(r["suite"], []).append(r["matches"])

    def agreement(ms):
        n = sum(len(m) for m in ms)
        return sum(map(sum, ms)) / n if n else None

    tar = {g: greedy_tar(matches, g) for g in config.gammas}
    return {"definitions": "agreement: fraction of continuation positions where the drafter's argmax (teacher-forced on "
                           "the target's greedy continuation) equals the target's token. predicted_greedy_tar[γ]: tokens "
                           "per round of greedy SD replayed over those match patterns (counts the recovered/bonus token).",
            "prompts": len(records), "positions": total, "agreement": agreement(matches),
            "agreement_by_suite": {s: agreement(ms) for s, ms in sorted(by_suite.items())},
            "predicted_greedy_tar": tar}


def format_agree(summary: dict) -> str:
    lines = [f"top-1 agreement {summary['agreement']:.3f} over {summary['positions']} positions of {summary['prompts']} prompts"]
    lines.append("predicted greedy TAR: " + ", ".join(f"γ={g}: {t:.2f}" for g, t in summary["predicted_greedy_tar"].items() if t))
    lines += [f"  {s:<12} {a:.3f}" for s, a in summary["agreement_by_suite"].items() if a is not None]
    return "\n".join(lines)
