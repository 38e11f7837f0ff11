"""Write a traffic file (`draftwise design --prompts`, `bench --prompts`, `load-test --prompts`): chat requests as an
OpenAI request log holds them, one JSON object a line — `messages`, `max_tokens`, `temperature` — from a JSONL of
questions (`prompt`, or `turns` whose first turn is the user's message).

  python scripts/traffic_file.py QUESTIONS.jsonl OUT.jsonl --max-tokens 400 --temperature 1 [--limit N]

E.g. the Vicuna-bench questions (FastChat, Apache-2.0; not in the packaged suites) as chat requests asking 400 new
tokens at T = 1, what an OpenAI client sends by default.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("questions")
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()
    lines = [json.loads(x) for x in Path(args.questions).read_text(encoding="utf-8").splitlines() if x.strip()]
    lines = lines[: args.limit] if args.limit else lines
    with open(args.out, "w", encoding="utf-8") as f:
        for i, q in enumerate(lines, 1):
            text = q["prompt"] if "prompt" in q else q["turns"][0]
            request = {
                "id": str(q.get("question_id", q.get("id", i))),
                "category": q.get("category", "chat"),
                "messages": [{"role": "user", "content": text}],
                "max_tokens": args.max_tokens,
                "temperature": args.temperature,
            }
            f.write(json.dumps(request, ensure_ascii=False) + "\n")
    print(f"{len(lines)} requests: {args.out}")


if __name__ == "__main__":
    main()
