"""Prompt suites for benchmarking and training drafters, packaged with draftwise.

Why packaged: a benchmark is only comparable if everyone runs it on the same prompts, so the suites ship inside
the wheel (suites/<name>.jsonl, read through importlib.resources) instead of being fetched or read from a local
checkout. suites/README.md names the source, commit and licence of each, and scripts/build_suites.py regenerates
them from the source snapshots.

Why a text-hashed split: drafters are trained (or tuned) on some prompts and measured on others. The split is a
pure function of the prompt text, so it needs no stored lists, never changes when a suite is added, and a prompt
that appears in two suites (3 GSM8K problems are in both spec_bench and gsm8k) always falls on the same side:
no eval prompt is ever seen in training.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from draftwise.errors import DraftwiseError

__all__ = [
    "SUITES",
    "SPLITS",
    "EVAL_FRACTION",
    "SPLIT_SEED",
    "Prompt",
    "split_of",
    "load_suite",
    "load_prompts",
    "read_prompt_file",
]

SUITES: tuple[str, ...] = (
    "spec_bench",
    "mmlu",
    "hellaswag",
    "arena",
    "cnn_dm",
    "xsum",
    "alpaca",
    "gsm8k",
    "humaneval",
)
SPLITS = ("train", "eval")
EVAL_FRACTION: float = 0.4
# Changing the seed reshuffles every split and makes old results incomparable: bump the version only on purpose.
SPLIT_SEED: str = "draftwise-split-v1"

_ALL_SPLITS = (*SPLITS, "all")
TRAFFIC_DIR = Path(str(files("draftwise.data") / "traffic"))  # packaged traffics: `--prompts NAME`


class _FrozenMapping(Mapping):
    """A read-only, hashable, picklable mapping, so that a frozen Prompt stays hashable and safe to share."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping | None = None):
        object.__setattr__(self, "_data", {k: _freeze(v) for k, v in (data or {}).items()})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(frozenset(self._data.items()))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("read-only mapping")

    def __reduce__(self):
        return (_FrozenMapping, (self._data,))

    def __repr__(self) -> str:
        return repr(self._data)


def _freeze(value: Any) -> Any:
    """JSON values made immutable: lists become tuples, objects become _FrozenMapping."""
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, Mapping):
        return _FrozenMapping(value)
    return value


@dataclass(frozen=True)
class Prompt:
    """One prompt: the first user turn of a record, plus where it came from.

    `extra` holds suite-specific fields kept for later checks (mmlu: `choices` as a tuple, `answer` as an int).
    It is stored read-only and left out of the hash, so prompts can be set members and dict keys.
    """

    id: str  # "<suite>/<source id>", e.g. "spec_bench/81"; "user/<line>" for a user's file
    suite: str  # a name from SUITES, or "user"
    category: str
    text: str
    extra: Mapping = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not isinstance(self.extra, _FrozenMapping):
            object.__setattr__(self, "extra", _FrozenMapping(self.extra))

    @property
    def split(self) -> str:
        """'train' or 'eval' (see split_of)."""
        return split_of(self.text)


def split_of(text: str) -> str:
    """'train' or 'eval': sha256(SPLIT_SEED + '\\0' + text with whitespace runs collapsed) read as a fraction in
    [0, 1); below EVAL_FRACTION means 'eval'.

    It depends on the text only (case kept), so the same prompt in two suites always lands in the same split and
    train and eval never overlap; whitespace is normalised so that re-wrapping or a trailing newline does not
    move a prompt across.
    """
    normalised = " ".join(text.split())
    digest = hashlib.sha256(f"{SPLIT_SEED}\0{normalised}".encode()).digest()
    return "eval" if int.from_bytes(digest[:8], "big") / 2**64 < EVAL_FRACTION else "train"


def _check_split(split: str) -> None:
    if split not in _ALL_SPLITS:
        raise DraftwiseError(f"unknown split {split!r}; use one of: {', '.join(_ALL_SPLITS)}")


def _check_suite(name: str) -> None:
    if name not in SUITES:
        raise DraftwiseError(f"unknown suite {name!r}; valid suites: {', '.join(SUITES)} (or 'all')")


@functools.cache
def _read_suite(name: str) -> tuple[Prompt, ...]:
    """All prompts of a packaged suite, in file order; cached because suites are immutable and reused."""
    resource = files("draftwise.data") / "suites" / f"{name}.jsonl"
    prompts = []
    for line in resource.read_text(encoding="utf-8").split("\n"):
        if line.strip():
            record = json.loads(line)
            extra = {k: v for k, v in record.items() if k not in ("id", "category", "prompt")}
            prompts.append(Prompt(record["id"], name, record["category"], record["prompt"], extra))
    return tuple(prompts)


def load_suite(name: str, split: str = "all") -> list[Prompt]:
    """The prompts of one packaged suite in file order, restricted to `split` ('train', 'eval' or 'all')."""
    _check_suite(name)
    _check_split(split)
    return [p for p in _read_suite(name) if split == "all" or split_of(p.text) == split]


def _parse_suites(suites: str | Sequence[str]) -> list[str]:
    names = suites.split(",") if isinstance(suites, str) else list(suites)
    out: list[str] = []
    for name in (str(n).strip() for n in names):
        if not name:
            continue  # tolerate "a,,b" and a trailing comma
        for n in SUITES if name == "all" else (name,):
            _check_suite(n)
            if n not in out:
                out.append(n)
    if not out:
        raise DraftwiseError(f"no suite given; valid suites: {', '.join(SUITES)} (or 'all')")
    return out


def _interleave(seqs: Sequence[Sequence[Prompt]]) -> list[Prompt]:
    """Round-robin: the first item of each sequence, then the second of each, and so on."""
    return [s[i] for i in range(max(map(len, seqs), default=0)) for s in seqs if i < len(s)]


def spread(prompts: list[Prompt], limit: int | None) -> list[Prompt]:
    """At most `limit` of a user's prompts, picked round-robin over their categories (in order of first appearance)
    so that a small limit of a file grouped by category (8 code requests, then 8 chat ones) still holds each; in file
    order, so a smaller limit gives a subset of a larger one. A file of one category: its first `limit`."""
    if not limit or limit >= len(prompts):
        return list(prompts)
    chosen = {id(p) for p in _by_category(prompts)[:limit]}
    return [p for p in prompts if id(p) in chosen]


def _by_category(prompts: Sequence[Prompt]) -> list[Prompt]:
    """Round-robin over the prompts' categories, in order of first appearance."""
    groups: dict[str, list[Prompt]] = {}
    for p in prompts:
        groups.setdefault(p.category, []).append(p)
    return _interleave(list(groups.values()))


def load_prompts(suites: str | Sequence[str], split: str = "eval", limit: int | None = None) -> list[Prompt]:
    """Prompts of several suites: `suites` is 'all', a comma-separated string or a list of names.

    Without `limit`, every prompt of the split, suite by suite in the order given, each in file order.
    With `limit`, at most that many, picked round-robin so that a small limit stays representative: over the
    suites first, then within each suite over its categories (in order of first appearance). So 'all' with
    limit=9 gives one prompt per suite, and spec_bench with limit=13 one per category. The picked prompts are
    returned in the same order as without a limit, so a smaller limit always gives a subset of a larger one.
    Deterministic. A prompt that is in two suites is returned once per suite.
    """
    names = _parse_suites(suites)
    _check_split(split)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise DraftwiseError(f"limit must be a positive integer, got {limit!r}")
    per_suite = [load_suite(n, split) for n in names]
    if limit is None:
        return [p for ps in per_suite for p in ps]
    chosen = {id(p) for p in _interleave([_by_category(ps) for ps in per_suite])[:limit]}
    return [p for ps in per_suite for p in ps if id(p) in chosen]


def read_prompt_file(path: str | os.PathLike) -> list[Prompt]:
    """A user's own prompts, so draftwise can be measured on the traffic that matters to them.

    A `.jsonl` file holds one JSON object a line with a `prompt` string, a `turns` list of strings (the first turn is
    used, as for the packaged suites) or a chat `messages` list ({role, content} objects, as in an OpenAI request
    log: their contents joined by blank lines, so the prompt is as long as the conversation — the chat template's few
    tokens are not added); optional `id` (or `question_id`) and `category`. Any other file is plain text, one prompt
    per non-blank line. Blank lines are skipped. Prompts get suite 'user', category 'user' unless given, and id
    'user/<given id>' or 'user/<line number>' (1-based). An optional `max_tokens` (a positive integer: the answer's
    length) and `temperature` (a number ≥ 0) are kept in `extra`: the request's own, which the benchmarks and the load
    test honour (`traffic`). The name of a packaged traffic (`data/traffic/`, e.g. `code-chat`) reads that file.
    """
    p = Path(path)
    if not p.exists() and (TRAFFIC_DIR / f"{path}.jsonl").is_file():  # a packaged traffic, by name
        p = TRAFFIC_DIR / f"{path}.jsonl"
    if not p.exists():
        packaged = ", ".join(sorted(f.stem for f in TRAFFIC_DIR.glob("*.jsonl")))
        raise DraftwiseError(f"prompt file not found: {p} (packaged traffics: {packaged})")
    if p.is_dir():
        raise DraftwiseError(f"prompt file is a directory, not a file: {p}")
    try:
        content = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise DraftwiseError(f"prompt file is not UTF-8 text: {p} (byte {e.start})") from None
    except OSError as e:
        raise DraftwiseError(f"cannot read prompt file: {p} ({e.strerror})") from None
    # split on "\n" only: str.splitlines would also split on U+2028 etc., which JSON may hold unescaped
    lines = [(n, line.rstrip("\r")) for n, line in enumerate(content.split("\n"), 1) if line.strip()]
    if p.suffix.lower() == ".jsonl":
        prompts, seen = [], set()
        for n, line in lines:
            prompt = _parse_jsonl_line(p, n, line)
            if prompt.id in seen:
                raise DraftwiseError(f"{p} line {n}: duplicate id {prompt.id[len('user/') :]!r}")
            seen.add(prompt.id)
            prompts.append(prompt)
    else:
        prompts = [Prompt(f"user/{n}", "user", "user", line.strip()) for n, line in lines]
    if not prompts:
        raise DraftwiseError(f"prompt file has no prompts: {p}")
    return prompts


def _parse_jsonl_line(path: Path, n: int, line: str) -> Prompt:
    where = f"{path} line {n}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise DraftwiseError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
    if not isinstance(record, dict):
        raise DraftwiseError(f"{where}: expected a JSON object with a `prompt`, `turns` or `messages` field")
    if "prompt" in record:
        text = record["prompt"]
        if not isinstance(text, str):
            raise DraftwiseError(f"{where}: `prompt` must be a string")
    elif "turns" in record:
        turns = record["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise DraftwiseError(f"{where}: `turns` must be a non-empty list of strings")
        text = turns[0]
    elif "messages" in record:
        text = _chat_text(record["messages"], where)
    else:
        raise DraftwiseError(f"{where}: has none of `prompt`, `turns` or `messages`")
    if not text.strip():
        raise DraftwiseError(f"{where}: empty prompt")
    given_id = record.get("id", record.get("question_id"))
    category = record.get("category")
    max_tokens, temperature = record.get("max_tokens"), record.get("temperature")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise DraftwiseError(f"{where}: `max_tokens` must be a positive integer, got {max_tokens!r}")
    if temperature is not None and (type(temperature) not in (int, float) or not 0 <= temperature <= 2):
        raise DraftwiseError(f"{where}: `temperature` must be a number from 0 to 2, got {temperature!r}")
    extra = {"max_tokens": max_tokens, "temperature": None if temperature is None else float(temperature)}
    return Prompt(
        id=f"user/{n if given_id is None else given_id}",
        suite="user",
        category="user" if category in (None, "") else str(category),
        text=text,
        extra={k: v for k, v in extra.items() if v is not None},
    )


def _chat_text(messages, where: str) -> str:
    """A chat request's prompt text: its messages' contents in order, joined by blank lines."""
    if not isinstance(messages, list) or not messages:
        raise DraftwiseError(f"{where}: `messages` must be a non-empty list of {{role, content}} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("content"), str) or not isinstance(m.get("role"), str):
            raise DraftwiseError(f"{where}: message {i} must be an object with string `role` and `content`")
    return "\n\n".join(m["content"] for m in messages)
