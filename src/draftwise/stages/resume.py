"""`distill --resume-from RUN`: a finished distillation trained further, and its learning curve's projection checked.

Why: a design's report projects how much more training a drafter needs ("it would pay after about N minutes more");
continuing that very run for those minutes — its weights, optimizer, data order and learning curve — is what tests
the projection. The new folder starts with the source's state and records (its evaluations and steps; not a stop
the rule made, which training further overrides) and its held-out set; its `--minutes` / `--tokens` count what it
adds. A `projection` record holds the source's fitted curve and what it predicts at the end of the added budget; at
the end, a `projection-check` record sets the agreement measured there beside the curve's value at the tokens
actually reached.

A continuation trains on as its source did: `settings` fills every setting the command line leaves out from the
source's config.json, so `distill --resume-from RUN --drafter D --data G --minutes 20` does not fall back to the
defaults (another loss, learning rate, head or held-out set). Its own are only the added budget, the stop rule (which
training further overrides) and where it runs; a given setting that would make it another run is refused.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

from safetensors import safe_open

from .. import learning
from ..config import DistillConfig
from ..errors import DraftwiseError
from ..rundir import RunDir, read_records

KEPT = ("train", "eval")  # the source's records a continuation carries on
OWN = ("minutes", "tokens", "resume_from", "stop_below", "threads", "device")  # never taken from the source
# settings whose change would break the continuation: its data order, its head's rows, its held-out set and curve
FIXED = (
    "target",
    "drafter",
    "data",
    "loss",
    "draft_vocab",
    "vocab_data",
    "eval_prompts",
    "eval_tokens",
    "eval_suites",
    "seed",
)


def settings(given: dict) -> dict:
    """The settings of `distill --resume-from`: those `given` on the command line, the rest the source's."""
    if not given.get("resume_from"):
        return given
    saved = source_config(Path(given["resume_from"]))
    changed = [k for k in FIXED if k in given and k in saved and given[k] != saved[k]]
    if changed:
        said = ", ".join(f"--{k.replace('_', '-')} {given[k]} (it trained with {saved[k]})" for k in changed)
        raise DraftwiseError(f"a continuation of {given['resume_from']} trains on as it did: drop {said}")
    fields = {f.name for f in dataclasses.fields(DistillConfig)} - set(OWN) - set(given)
    inherited = {k: v for k, v in saved.items() if k in fields}
    return {**inherited, **given}


def source_config(source: Path) -> dict:
    """The config a distill run folder to resume from was trained with (refused if it is no such folder)."""
    path = source / "config.json"
    if not path.exists():
        raise DraftwiseError(f"{source}: not a distill run folder to resume from (no config.json)")
    saved = json.loads(path.read_text())
    if saved.get("stage") != "DistillConfig":
        raise DraftwiseError(f"{source} is a {saved.get('stage')} run, not a distillation to resume from")
    return saved


def seed(run_dir: RunDir, source: Path, config) -> dict:
    """Copy `source`'s state, records and held-out set into a fresh continuation folder (once: a rerun finds them)
    and return its projection record."""
    done = next((r for r in run_dir.records() if r.get("event") == "projection"), None)
    state = source / "state" / "state.safetensors"
    if not state.exists():
        raise DraftwiseError(f"{source}: no distillation state to resume from ({state.relative_to(source)} missing)")
    if source_config(source).get("drafter") != config.drafter:
        raise DraftwiseError(f"{source} is not a distillation of {config.drafter}: resume from the run that trained it")
    if done is None:
        records = [r for r in read_records(source / "records.jsonl") if r.get("event") in KEPT]
        with safe_open(state, "pt") as f:
            base = json.loads(f.metadata()["meta"])
        done = projection(records, base, config, str(source))
        for r in records:
            run_dir.append(r)
        run_dir.append(done)
    if (source / "eval.jsonl").exists() and not (run_dir.path / "eval.jsonl").exists():
        shutil.copyfile(source / "eval.jsonl", run_dir.path / "eval.jsonl")
    own = run_dir.path / "state" / "state.safetensors"
    if not own.exists():  # copied last: a kill before it leaves a folder the rerun completes
        own.parent.mkdir(exist_ok=True)
        shutil.copyfile(state, own.with_suffix(".tmp"))
        own.with_suffix(".tmp").replace(own)
    return done


def projection(records: list[dict], base: dict, config, source: str) -> dict:
    """The source's curve and its prediction where the added budget ends (tokens: exact; minutes: at the source's
    measured training rate)."""
    curve = learning.fit(records)
    rate = learning.rate(records) or 0.0
    added = config.tokens if config.tokens else rate * 60 * config.minutes
    end = base["tokens"] + added
    return {
        "event": "projection",
        "step": base["step"],
        "from": source,
        "base": base,
        "curve": curve.as_dict(),
        "tokens_at_end": round(end),
        "predicted": float(curve.predict(end)) if curve.valid else None,
    }


def budget(config, proj: dict | None) -> tuple[float | None, int | None]:
    """The budget as totals the loop counts against (minutes, tokens): the source's plus what this run adds."""
    if proj is None:
        return config.minutes, config.tokens
    base = proj["base"]
    if config.tokens:
        return None, base["tokens"] + config.tokens
    return base["seconds"] / 60 + config.minutes, None


def check(proj: dict, meta: dict, measured: float) -> dict:
    """The projection against the agreement measured at the end (the curve read at the tokens actually reached)."""
    curve = learning.Curve.from_dict(proj["curve"])
    predicted = float(curve.predict(meta["tokens"])) if curve.valid else None
    return {
        "event": "projection-check",
        "step": meta["step"],
        "tokens": meta["tokens"],
        "predicted": predicted,
        "measured": measured,
        "delta": None if predicted is None else measured - predicted,
    }


def sentence(rec: dict) -> str:
    if rec["predicted"] is None:
        return "no projection to check: the source's curve had too few evaluations or did not rise"
    return (
        f"the source's learning curve projected {rec['predicted']:.3f} at {learning.tokens_text(rec['tokens'])} "
        f"tokens; measured {rec['measured']:.3f} (Δ {rec['delta']:+.3f})"
    )
