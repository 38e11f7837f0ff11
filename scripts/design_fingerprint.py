"""Print a design run folder's fingerprint: its stages, decisions and record keys, timings aside.

Used to show a refactor kept behaviour: run it on a tiny random target before and after, then diff the two outputs.
    python scripts/design_fingerprint.py OUT.json            # builds a tiny target, runs `design`, fingerprints it
    python scripts/design_fingerprint.py OUT.json --folder F # fingerprints an existing design folder
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

DECISION_KEYS = ("chosen", "recommend", "option", "runtime", "kept", "dropped", "max_batch", "batch")


def fingerprint(folder: Path) -> dict:
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    stages = {}
    for sub in sorted((folder / "stages").iterdir()):
        lines = (sub / "records.jsonl").read_text().splitlines() if (sub / "records.jsonl").exists() else []
        keys = sorted({k for line in lines for k in json.loads(line)})
        files = sorted(str(f.relative_to(sub)) for f in sub.rglob("*") if f.is_file())
        stages[sub.name] = {"record_keys": keys, "files": files}
    return {
        "stages": [r["stage"] for r in records],
        "record_keys": {r["stage"]: sorted(r) for r in records},
        "decisions": {r["stage"]: {k: r[k] for k in DECISION_KEYS if k in r} for r in records},
        "stage_folders": stages,
        "top_files": sorted(
            str(f.relative_to(folder))
            for f in folder.rglob("*")
            if f.is_file() and "stages" not in f.relative_to(folder).parts
        ),
    }


def run_tiny(out: Path) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import save_checkpoint, tiny_config, tiny_model, tiny_tokenizer

    try:
        from draftwise.design import DesignConfig, run
    except ImportError:
        from draftwise.config import DesignConfig
        from draftwise.design import run
    target = save_checkpoint(out / "target", tiny_model(tiny_config(layers=4), seed=1), tiny_tokenizer())
    config = DesignConfig(
        target=str(target),
        minutes=0.3,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=3,
        refine_limit=2,
        headline_limit=2,
        tune_prompts=6,
        max_new_tokens=8,
        accuracy_items=3,
        draft_vocabs=(32, 16),
        context=64,
        batch_cap=2,
        threads=1,
    )
    run(config, out / "design")
    return out / "design"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--folder", type=Path)
    args = parser.parse_args()
    folder = args.folder or run_tiny(Path(tempfile.mkdtemp()))
    args.out.write_text(json.dumps(fingerprint(folder), indent=1, sort_keys=True))
    print(f"fingerprint of {folder} written to {args.out}")


if __name__ == "__main__":
    main()
