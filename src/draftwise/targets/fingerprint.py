"""A tokenizer's identity: folders of token ids (gen-data, teacher data) say whose ids they hold, and are refused
under another tokenizer; a drafter must speak its target's vocabulary (`check_compatible`)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..errors import DraftwiseError

FINGERPRINT_FILE = "tokenizer.json"


def fingerprint(tokenizer) -> str:
    """A tokenizer's identity: the hash of its vocabulary (string -> id). Token ids written by one tokenizer mean other
    text under another, so folders of token ids say whose they are."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def write_fingerprint(folder: Path, tokenizer) -> None:
    (Path(folder) / FINGERPRINT_FILE).write_text(
        json.dumps({"fingerprint": fingerprint(tokenizer), "vocab_size": len(tokenizer)}) + "\n"
    )


def check_fingerprint(folder: Path, target, what: str) -> None:
    """Refuse, in one line, a folder of token ids written with another tokenizer than the target's (or by no
    draftwise stage: no fingerprint)."""
    path = Path(folder) / FINGERPRINT_FILE
    if not path.exists():
        raise DraftwiseError(
            f"{what} {folder}: not a gen-data run folder of this draftwise (no {FINGERPRINT_FILE}); run `draftwise "
            f"gen-data` (or `draftwise teacher`) to make one"
        )
    if json.loads(path.read_text())["fingerprint"] != fingerprint(target.tokenizer):
        raise DraftwiseError(
            f"{what} {folder} was written with another tokenizer than the target's ({target.name}): its token ids "
            f"mean other text"
        )


def check_compatible(target, drafter) -> None:
    """The drafter must map the same strings to the same token ids as the target, or its tokens mean nothing."""
    if drafter.tokenizer is target.tokenizer:
        return
    tv, dv = target.tokenizer.get_vocab(), drafter.tokenizer.get_vocab()
    if tv == dv:
        return
    differ = sorted(tok for tok in set(tv) | set(dv) if tv.get(tok) != dv.get(tok))
    example = differ[0]
    raise DraftwiseError(
        f"drafter vocabulary incompatible with target: {len(differ)} tokens differ "
        f"(e.g. {example!r}: target id {tv.get(example)}, drafter id {dv.get(example)}); "
        "a drafter must use the target's tokenizer"
    )
