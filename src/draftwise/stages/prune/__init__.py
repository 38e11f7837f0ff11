"""`draftwise prune`: carve a drafter of an exact shape out of the target.

  calibration   the target's continuations of `train` prompts (never `eval`), or with `--data` the sequences of a
                teacher folder (`draftwise teacher`: scored at prefill speed), saved as calibration.jsonl
  scores        importance: greedy layer elimination by output TVD (or KL), then Taylor scores of heads, FFN channels
                and hidden dimensions (scores.py); l0: hard-concrete gates under a Lagrangian shape constraint (l0.py)
  selection     exactly the requested count per dimension, GQA groups kept whole (slicing.select)
  slicing       the physical cut (slicing.slice_checkpoint), saved as a standard checkpoint in checkpoint/
The run folder also holds prune.json (kept indices, scores, parameter counts) and records.jsonl (elimination steps,
L0 steps). A rerun skips calibration once saved and resumes the layer elimination from its last finished step.
"""

from __future__ import annotations

from itertools import accumulate
from pathlib import Path

import torch

from ... import continuations
from ...config import PruneConfig
from ...rundir import RunDir
from ...runtimes.base import ModelOptions
from ...runtimes.hf.model import save_checkpoint
from ...runtimes.registry import load
from ...shapes import Shape
from ...shards import load_rows
from ...targets.checkpoint import read_weights
from ...targets.fingerprint import check_fingerprint
from ..draft_vocab import ensure_reduced
from . import l0, scores
from .slicing import PruneShape, select, slice_checkpoint


def from_teacher(folder: str, target, n_tokens: int, max_len: int) -> list[continuations.Sequence]:
    """The first sequences of a teacher (or gen-data) folder holding `n_tokens` scored positions: text the target
    scored at prefill speed, so calibration needs no generation and can be as large as the cache."""
    check_fingerprint(Path(folder), target, "calibration data")
    out, total = [], 0
    for row in load_rows(Path(folder), max_len):
        out.append(continuations.Sequence("", row["tokens"].tolist(), row["prompt_len"]))
        total += len(row["topk_ids"])
        if total >= n_tokens:
            break
    return out


def calibration(run_dir: RunDir, target, config: PruneConfig) -> list[continuations.Sequence]:
    """The calibration sequences, made once (calibration.jsonl): a teacher folder's, or continuations generated."""

    def make() -> list[continuations.Sequence]:
        if config.data:
            max_len = config.max_prompt_tokens + config.max_new_tokens
            return from_teacher(config.data, target, config.calib_tokens, max_len)
        prompts = continuations.prompts_for(target, "train", config.calib_suites, config.max_prompt_tokens)
        return continuations.generate(
            target,
            prompts,
            config.max_new_tokens,
            config.calib_tokens,
            batch_size=config.batch_size,
            seed=config.seed,
            desc="calibration",
        )

    return continuations.cached(run_dir.path / "calibration.jsonl", make)


def _subset(calib, n_scored: int):
    """The first calibration rows holding at least `n_scored` scored positions (the last batch cut to its rows)."""
    out, total = [], 0
    for (ids, start, scored, n), log_p in calib:
        per_row = scored.sum(1).tolist()
        k = next((i + 1 for i, upto in enumerate(accumulate(per_row)) if total + upto >= n_scored), len(per_row))
        rows = sum(per_row[:k])
        out.append(((ids[:k], start[:k], scored[:k], n), log_p[:rows]))  # log_p: the scored positions, row by row
        total += rows
        if total >= n_scored:
            break
    return out


def _resume_layers(records: list[dict]) -> list[int] | None:
    steps = [r for r in records if r.get("event") == "eliminate"]
    if not steps:
        return None
    return [l for l in steps[-1]["kept_before"] if l not in steps[-1]["removed"]]


def run(config: PruneConfig, out: str | Path) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)
    run_dir = RunDir(out, config)
    if (run_dir.path / "prune.json").exists() and (run_dir.path / "checkpoint" / "config.json").exists():
        print(f"already pruned: {run_dir.path / 'checkpoint'}")
        ensure_reduced(run_dir.path, config.draft_vocab, config.vocab_data)
        return run_dir.path
    target = load(config.target, ModelOptions(config.dtype, config.device, "lean"))
    shape = PruneShape.parse(config.shape, target.config)
    seqs = calibration(run_dir, target, config)
    calib = scores.teacher(target.lm, seqs, batch_size=4)
    weights = read_weights(target.path)
    info: dict = {"method": config.method, "shape": shape.__dict__}
    if config.method == "importance":
        info["block_influence"] = scores.block_influence(target.lm, calib)
        layers = scores.eliminate_layers(
            target.lm,
            shape.layers,
            _subset(calib, config.elimination_tokens),
            run_dir.append,
            kept=_resume_layers(run_dir.records()),
            criterion=config.layer_criterion,
        )
        units = scores.taylor_scores(target.config, weights, layers, calib)
        kept = select(shape, target.config, layers, units.head, units.intermediate, units.hidden)
        info["unit_scores"] = scores.describe_scores(units)
    else:
        log_alpha = l0.train(target.config, weights, shape, calib, config.l0_steps, run_dir.append, config.seed)
        kept = select(
            shape, target.config, log_alpha["layer"], log_alpha["head"], log_alpha["intermediate"], log_alpha["hidden"]
        )
        info["log_alpha"] = {k: v.tolist() for k, v in log_alpha.items()}
    new_config, new_weights = slice_checkpoint(target.config, weights, kept)
    save_checkpoint(run_dir.path / "checkpoint", new_config, new_weights, target.tokenizer)
    info.update(
        kept=kept.as_dict(),
        params=Shape.of(new_config).params(),
        calibration={
            "split": "train",
            "source": config.data or "generated",
            "sequences": len(seqs),
            "new_tokens": sum(len(s.continuation) for s in seqs),
        },
    )
    run_dir.write_json("prune.json", info)
    p = info["params"]
    print(
        f"pruned to {shape.__dict__}: layers {kept.layers}; {p['non_embedding'] / 1e6:.1f}M non-embedding, "
        f"{p['total'] / 1e6:.1f}M total parameters\ncheckpoint: {run_dir.path / 'checkpoint'}"
    )
    ensure_reduced(run_dir.path, config.draft_vocab, config.vocab_data)
    return run_dir.path
