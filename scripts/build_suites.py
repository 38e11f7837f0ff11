#!/usr/bin/env python3
"""Regenerate the packaged prompt suites, src/draftwise/data/suites/<suite>.jsonl, from the source snapshots.

One-off maintenance script; the draftwise package never imports it and never reads /work/shared at run time.

Usage:
    python scripts/build_suites.py [--src /work/shared/data] [--out src/draftwise/data/suites]

Each output line is one compact JSON object: {"id", "category", "prompt"} plus, for mmlu, "choices" and "answer".
Prompt text is derived exactly as documented in suites/README.md (kept in sync by hand). The script checks each
suite's record count and fails loudly if a source file changed, so a silent drift cannot reach the package.
The train/eval split is not stored: draftwise.data.split_of computes it from the prompt text.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_SRC = Path("/work/shared/data")
DEFAULT_OUT = REPO / "src" / "draftwise" / "data" / "suites"

EXPECTED = {
    "spec_bench": 480,
    "mmlu": 285,
    "hellaswag": 500,
    "arena": 500,
    "cnn_dm": 100,
    "xsum": 100,
    "alpaca": 80,
    "gsm8k": 80,
    "humaneval": 80,
}

MMLU_TEMPLATE = (
    "The following is a multiple choice question about {subject}.\n\n{question}\n"
    "A. {c0}\nB. {c1}\nC. {c2}\nD. {c3}\nAnswer with the letter of the correct option."
)
CNN_DM_TEMPLATE = "Summarize the following news article in a few sentences.\n\n{document}"
XSUM_TEMPLATE = "Summarize the following article in one sentence.\n\n{document}"


def read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def spec_bench(src: Path) -> list[dict]:
    return [
        {"id": f"spec_bench/{r['question_id']}", "category": r["category"], "prompt": r["turns"][0]}
        for r in read_jsonl(src / "spec_bench" / "question.jsonl")
    ]


def mmlu(src: Path) -> list[dict]:
    out, seen = [], {}
    for r in read_jsonl(src / "mmlu_sample" / "test_sample.jsonl"):
        subject = r["subject"]
        n = seen[subject] = seen.get(subject, -1) + 1  # row index within the subject, 0-4
        c = r["choices"]
        assert len(c) == 4 and r["answer"] in range(4), r
        prompt = MMLU_TEMPLATE.format(
            subject=subject.replace("_", " "), question=r["question"], c0=c[0], c1=c[1], c2=c[2], c3=c[3]
        )
        out.append(
            {
                "id": f"mmlu/{subject}/{n}",
                "category": subject,
                "prompt": prompt,
                "choices": list(c),
                "answer": int(r["answer"]),
            }
        )
    return out


def hellaswag(src: Path) -> list[dict]:
    return [
        {"id": f"hellaswag/{i}", "category": "hellaswag", "prompt": r["prompt"]}
        for i, r in enumerate(read_jsonl(src / "hellaswag_prompts" / "prompts.jsonl"))
    ]


def arena(src: Path) -> list[dict]:
    return [
        {"id": f"arena/{r['uid']}", "category": r["cluster"], "prompt": r["prompt"]}
        for r in read_jsonl(src / "arena_hard" / "question.jsonl")
    ]


def _summaries(src: Path, folder: str, suite: str, template: str) -> list[dict]:
    return [
        {"id": f"{suite}/{r['id']}", "category": suite, "prompt": template.format(document=r["document"])}
        for r in read_jsonl(src / folder / "samples.jsonl")
    ]


def eagle(src: Path, suite: str) -> list[dict]:
    return [
        {"id": f"{suite}/{r['question_id']}", "category": suite, "prompt": r["turns"][0]}
        for r in read_jsonl(src / "eagle_bench" / f"{suite}.jsonl")
    ]


def build(src: Path) -> dict[str, list[dict]]:
    return {
        "spec_bench": spec_bench(src),
        "mmlu": mmlu(src),
        "hellaswag": hellaswag(src),
        "arena": arena(src),
        "cnn_dm": _summaries(src, "cnn_dm_realsumm", "cnn_dm", CNN_DM_TEMPLATE),
        "xsum": _summaries(src, "xsum_pyrxsum", "xsum", XSUM_TEMPLATE),
        "alpaca": eagle(src, "alpaca"),
        "gsm8k": eagle(src, "gsm8k"),
        "humaneval": eagle(src, "humaneval"),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=DEFAULT_SRC, help="folder with the source snapshots")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder to write <suite>.jsonl into")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, records in build(args.src).items():
        if len(records) != EXPECTED[name]:
            raise SystemExit(f"{name}: {len(records)} records, expected {EXPECTED[name]}")
        ids = [r["id"] for r in records]
        if len(set(ids)) != len(ids):
            raise SystemExit(f"{name}: duplicate ids")
        if any(not r["prompt"].strip() for r in records):
            raise SystemExit(f"{name}: empty prompt")
        path = args.out / f"{name}.jsonl"
        with path.open("w", encoding="utf-8", newline="\n") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
        print(f"{name:11s} {len(records):4d} records  {path.stat().st_size / 1e3:8.1f} kB  {path}")


if __name__ == "__main__":
    main()
