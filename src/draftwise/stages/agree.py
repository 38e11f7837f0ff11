"""`draftwise agree`: how often a drafter's top-1 token matches the target's, teacher-forced on the target's own
greedy continuations of `eval` prompts — a cheap, exact stand-in for greedy SD. A lookup (or hybrid) drafter is
replayed over the same continuations: its proposals depend on the text alone, so its greedy rounds are exact too.

Exact because greedy SD drafts from the target's accepted prefix: position t's draft is accepted iff the drafter's
argmax after the target's tokens 0..t−1 equals the target's token t. Replaying rounds of γ over each sequence's
match pattern (`greedy_rounds`) therefore gives the TAR a real greedy SD run would measure on those continuations.
Continuations and matches are raw records (one per prompt); agree.json is derived. With `shared`, the target's
continuations are kept in that folder under a key of what makes them (target, runtime, prompts, lengths) and read back
by the next agree with the same key: a design's candidates are scored on one generation (on a 1.7B target that
generation is most of an agree stage).
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .. import continuations, metrics, specs
from ..config import AgreeConfig
from ..rundir import RunDir
from ..runtimes.base import ModelOptions
from ..runtimes.registry import load
from ..sd.families import feature
from ..sd.roles import Draft


def replay_rounds(
    prompt: list[int],
    continuation: list,
    gamma: int,
    lookup=None,
    matches: list[bool] | None = None,
    model_gamma: int | None = None,
) -> list[dict]:
    """Greedy SD rounds replayed exactly over the target's greedy continuation (greedy SD emits exactly that text, so
    every round drafts from the same sequence as a real run would). Each round: the lookup's proposal, if it has one,
    keeps its longest prefix the continuation agrees with; else a model drafter (its teacher-forced top-1 `matches`)
    drafts up to `model_gamma` tokens and keeps the leading matches; else nothing is drafted. One more token (recovered
    or bonus) is emitted. Round records as the engine's: drafted, accepted, emitted, source, draft_s (the lookup's)."""
    session = lookup.start([prompt]) if lookup is not None else None
    seq, rounds, t, n = list(prompt), [], 0, len(continuation)
    while t < n:
        g = min(gamma, n - t - 1)  # as the engine: never draft past the end
        start = time.perf_counter()
        draft = session.propose({0: seq}, g)[0].tokens if session is not None and g > 0 else []
        draft_s = time.perf_counter() - start if session is not None else 0.0
        accepted, source = 0, "lookup" if draft else ""
        if draft:
            while accepted < len(draft) and draft[accepted] == continuation[t + accepted]:
                accepted += 1
        elif matches is not None and g > 0:
            draft, source = [None] * min(g, model_gamma or g), "model"
            while accepted < len(draft) and matches[t + accepted]:
                accepted += 1
        rounds.append(
            {"drafted": len(draft), "accepted": accepted, "emitted": accepted + 1, "source": source, "draft_s": draft_s}
        )
        seq += continuation[t : t + accepted + 1]
        t += accepted + 1
        if session is not None:
            session.keep(0, len(seq) - 1)
    return rounds


class _Drafts:
    """Drafts known in advance per continuation index (a feature drafter's, unrolled along the text), offered to
    `replay_rounds` as a lookup offers its proposals: the round that starts at index t drafts drafts[t][:γ]."""

    def __init__(self, drafts: list[list[int]], prompt_len: int):
        self.drafts, self.prompt_len = drafts, prompt_len

    def start(self, prompts):
        return self

    def propose(self, seqs, gamma, *args):
        return {0: Draft(self.drafts[len(seqs[0]) - self.prompt_len][:gamma])}

    def keep(self, row, length):
        pass


def feature_score(drafter, seq: continuations.Sequence, gammas, features=None) -> tuple[list[bool], dict]:
    """A feature drafter (`sd.families.feature.FeatureDrafter`) on one continuation: its first draft step's matches
    (the target's feature at P−2 and the true token at P−1 against the target's token at P) and, per γ, the greedy
    rounds replayed with its drafts unrolled from each round's start (`unrolled_drafts`: the head's own features
    after the first step). `features`: the target's over seq.tokens, teacher-forced (computed when not given)."""
    features = feature.target_features(drafter.lm, seq.tokens) if features is None else features
    drafts = feature.unrolled_drafts(drafter.head, features, seq.tokens, seq.prompt_len, max(gammas))
    matches = [bool(d) and d[0] == t for d, t in zip(drafts, seq.continuation)]
    lookup = _Drafts(drafts, seq.prompt_len)
    return matches, {g: replay_rounds(seq.tokens[: seq.prompt_len], seq.continuation, g, lookup) for g in gammas}


def greedy_rounds(matches: list[bool], gamma: int) -> tuple[int, int]:
    """(rounds, tokens) of greedy SD with lookahead γ over a continuation whose position t the drafter gets right
    iff matches[t]: each round accepts the leading matches (≤ γ) and emits one more token."""
    rounds = replay_rounds([], [None] * len(matches), gamma, matches=matches)
    return len(rounds), sum(r["emitted"] for r in rounds)


def greedy_tar(matches: list[list[bool]], gamma: int) -> float | None:
    """Tokens per round of greedy SD with lookahead γ replayed over every sequence's match pattern."""
    rounds, tokens = map(sum, zip(*(greedy_rounds(m, gamma) for m in matches))) if matches else (0, 0)
    return tokens / rounds if rounds else None


def _opened(config: AgreeConfig, out: str | Path):
    """(run folder, runtime options, the target, its prompts): what `run` and `share` both start from."""
    if config.threads:
        torch.set_num_threads(config.threads)
    options = ModelOptions(config.dtype, config.device, config.backend, gguf_quant=config.gguf_quant)
    target = load(config.target, options)
    prompts = continuations.prompts_for(
        target, config.split, config.suites, config.max_prompt_tokens, config.limit, config.prompts
    )
    return RunDir(out, config), options, target, prompts


def run(config: AgreeConfig, out: str | Path) -> Path:
    run_dir, options, target, prompts = _opened(config, out)
    drafter = specs.load(config.drafter, target, options)
    done = {r["prompt_id"] for r in run_dir.records()}
    todo = [(p, ids) for p, ids in prompts if p.id not in done]
    kept = _shared(config, target, todo) if config.shared and todo else {}
    bar = tqdm(total=len(todo), desc="agree", unit="prompt", file=sys.stderr, dynamic_ncols=True, disable=not todo)
    for i in range(0, len(todo), config.batch_size):
        chunk = todo[i : i + config.batch_size]
        seqs = (
            [kept[p.id] for p, _ in chunk]
            if kept
            else continuations.generate(
                target, chunk, config.max_new_tokens, batch_size=config.batch_size, desc="target"
            )
        )
        matches = continuations.top1_matches(drafter.model.lm, seqs, len(seqs)) if drafter.model else [None] * len(seqs)
        scored = (
            [feature_score(drafter.loop_drafter, s, config.gammas) for s in seqs] if drafter.kind == "feature" else None
        )
        for i, ((p, ids), seq, match) in enumerate(zip(chunk, seqs, matches)):
            rec = {
                "prompt_id": p.id,
                "suite": p.suite,
                "category": p.category,
                "prompt_tokens": seq.prompt_len,
                "prompt": ids,
                "continuation": seq.continuation,
            }
            if match is not None:
                rec["matches"] = [int(m) for m in match]
            if scored is not None:  # a feature drafter: its first steps' matches, its unrolled drafts' rounds per γ
                rec["matches"] = [int(m) for m in scored[i][0]]
                rec["rounds"] = {g: [[r["drafted"], r["accepted"]] for r in rs] for g, rs in scored[i][1].items()}
            if drafter.lookup is not None:  # a lookup proposes from the text itself: its rounds, replayed per γ
                rec["rounds"] = {
                    g: [
                        [r["drafted"], r["accepted"]]
                        for r in replay_rounds(
                            ids,
                            seq.continuation,
                            g,
                            drafter.lookup,
                            match,
                            getattr(drafter.loop_drafter, "model_gamma", None),
                        )
                    ]
                    for g in config.gammas
                }
            run_dir.append(rec)
        bar.update(len(chunk))
    bar.close()
    summary = summarize(run_dir.records(), config)
    run_dir.write_json("agree.json", summary)
    print(format_agree(summary))
    return run_dir.path


def share(config: AgreeConfig, out: str | Path) -> Path:
    """The target's continuations that an agree of `config` scores its drafter on, generated into `config.shared`
    (its drafter is not loaded): a design's stage before its candidates' agreement, so that they share them."""
    run_dir, _, target, prompts = _opened(config, out)
    seqs = _shared(config, target, prompts)
    run_dir.append({"sequences": len(seqs), "tokens": sum(len(s.continuation) for s in seqs.values())})
    return run_dir.path


def _shared(config: AgreeConfig, target, todo: list) -> dict[str, continuations.Sequence]:
    """The target's continuations of every prompt still to score, by prompt id: read from `config.shared` when an
    agree with the same key wrote them, else generated (as the stage would, in batches) and written there."""
    key = {
        k: getattr(config, k)
        for k in ("target", "dtype", "device", "backend", "gguf_quant", "max_new_tokens", "batch_size")
    } | {
        "prompts": [ids for _, ids in todo],
        "stamp": Path(config.target).stat().st_mtime_ns if Path(config.target).is_file() else 0,
    }
    name = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    folder = Path(config.shared)
    folder.mkdir(parents=True, exist_ok=True)
    seqs = continuations.cached(
        folder / f"{name}.jsonl",
        lambda: continuations.generate(
            target, todo, config.max_new_tokens, batch_size=config.batch_size, desc="target"
        ),
    )
    return {s.prompt_id: s for s in seqs}


def summarize(records: list[dict], config: AgreeConfig) -> dict:
    matches = [r["matches"] for r in records if "matches" in r]
    by_suite: dict[str, list] = {}
    for r in records:
        if "matches" in r:
            by_suite.setdefault(r["suite"], []).append(r["matches"])

    def agreement(ms):
        n = sum(len(m) for m in ms)
        return sum(map(sum, ms)) / n if n else None

    out = {
        "definitions": "agreement: fraction of continuation positions where the drafter's argmax (teacher-forced on "
        "the target's greedy continuation) equals the target's token (model drafters; a feature drafter's first "
        "step, from the target's feature). "
        "predicted_greedy_tar[γ]: tokens per round of greedy SD replayed over those match patterns, or, "
        "for a lookup, hybrid or feature drafter (its steps unrolled on its own features), over its own "
        "proposals on the same text (counts the "
        "recovered/bonus token). alpha and proposed_fraction: of those replayed rounds.",
        "prompts": len(records),
        "positions": sum(len(r["continuation"]) for r in records),
        "agreement": agreement(matches) if matches else None,
        "agreement_by_suite": {s: agreement(ms) for s, ms in sorted(by_suite.items())},
    }
    if records and "rounds" in records[0]:
        rounds = {
            g: [{"drafted": d, "accepted": a, "emitted": a + 1} for r in records for d, a in r["rounds"][str(g)]]
            for g in config.gammas
        }
        out["predicted_greedy_tar"] = {g: metrics.tar(rs) for g, rs in rounds.items()}
        out["alpha"] = {g: metrics.alpha(rs) for g, rs in rounds.items()}
        out["proposed_fraction"] = {g: metrics.proposals(rs)["proposed_fraction"] for g, rs in rounds.items()}
    else:
        out["predicted_greedy_tar"] = {g: greedy_tar(matches, g) for g in config.gammas}
    return out


def format_agree(summary: dict) -> str:
    lines = []
    if summary["agreement"] is not None:
        lines.append(
            f"top-1 agreement {summary['agreement']:.3f} over {summary['positions']} positions of "
            f"{summary['prompts']} prompts"
        )
    lines.append(
        "predicted greedy TAR: " + ", ".join(f"γ={g}: {t:.2f}" for g, t in summary["predicted_greedy_tar"].items() if t)
    )
    if "proposed_fraction" in summary:
        lines.append(
            "rounds that drafted: "
            + ", ".join(f"γ={g}: {100 * f:.0f} %" for g, f in summary["proposed_fraction"].items() if f is not None)
        )
    lines += [f"  {s:<12} {a:.3f}" for s, a in summary["agreement_by_suite"].items() if a is not None]
    return "\n".join(lines)
