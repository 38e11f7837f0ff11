"""Write a traffic file (`draftwise design --prompts`, `bench --prompts`, `load-test --prompts`): chat requests as an
OpenAI request log holds them, one JSON object a line — `messages`, `max_tokens`, `temperature` — from a JSONL of
questions (`prompt`, or `turns` whose first turn is the user's message).

  python scripts/traffic_file.py QUESTIONS.jsonl OUT.jsonl --max-tokens 400 --temperature 1 [--limit N]
      [--code] [--target T --prompt-tokens MIN-MAX]

E.g. the Vicuna-bench questions (FastChat, Apache-2.0; not in the packaged suites) as chat requests asking 400 new
tokens at T = 1, what an OpenAI client sends by default. `--code` keeps the questions that hold code (a fence, a
`def`, an `#include`, a `function`, an `import`); `--prompt-tokens 150-400` those whose request is that many tokens
through `--target`'s chat template, as a benchmark encodes it. The code prompts of issue 60's real-pair figures:

  python scripts/traffic_file.py src/draftwise/data/suites/arena.jsonl runs/code.jsonl --code \
      --target qwen2.5-coder-1.5b --prompt-tokens 150-400 --max-tokens 96 --temperature 0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

CODE = ("```", "def ", "#include", "function ", "import ")


def question(q: dict) -> str:
    return q["prompt"] if "prompt" in q else q["turns"][0]


def encoder(target: str | None):
    """A user message's token ids as `Model.encode` makes them for `target` (its tokenizer alone, not its weights)."""
    if not target:
        raise SystemExit("--prompt-tokens needs --target (whose chat template counts them)")
    from draftwise.runtimes.base import ModelOptions
    from draftwise.targets.checkpoint import config_and_tokenizer
    from draftwise.targets.spec import parse

    _, tok = config_and_tokenizer(parse(target).directory(), ModelOptions())

    def encode(text: str) -> list[int]:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    return encode


def parser() -> argparse.ArgumentParser:
    """The command line (docs checks parse the commands they show with it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("questions")
    ap.add_argument("out")
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--limit", type=int, default=0)
    ap.add_argument("--code", action="store_true", help="only questions that hold code")
    ap.add_argument("--target", help="whose chat template counts --prompt-tokens")
    ap.add_argument("--prompt-tokens", help="MIN-MAX tokens a request encodes to (with --target)")
    return ap


def main() -> None:
    args = parser().parse_args()
    lines = [json.loads(x) for x in Path(args.questions).read_text(encoding="utf-8").splitlines() if x.strip()]
    if args.code:
        lines = [q for q in lines if any(mark in question(q) for mark in CODE)]
    if args.prompt_tokens:
        lo, hi = map(int, args.prompt_tokens.split("-"))
        encode = encoder(args.target)
        lines = [q for q in lines if lo <= len(encode(question(q))) <= hi]
    lines = lines[: args.limit] if args.limit else lines
    with open(args.out, "w", encoding="utf-8") as f:
        for i, q in enumerate(lines, 1):
            text = question(q)
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
