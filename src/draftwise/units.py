"""Counts and sizes as people write them: '15M' parameters, '16GiB' of memory (a leaf: configs and the cost model
both read them)."""

from __future__ import annotations

import os

from .errors import DraftwiseError

_UNITS = {
    "k": 1e3,
    "m": 1e6,
    "b": 1e9,
    "g": 1e9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
}


def parse_count(text: str) -> int:
    """'15M' -> 15_000_000; '1.5B', '800k', '16GiB', '512MB' likewise (binary suffixes for *iB)."""
    t = text.strip().lower()
    for suffix in sorted(_UNITS, key=len, reverse=True):
        if t.endswith(suffix):
            try:
                return int(float(t[: -len(suffix)]) * _UNITS[suffix])
            except ValueError:
                break
    try:
        return int(float(t))
    except ValueError:
        raise DraftwiseError(f"not a count: {text!r} (e.g. 15M, 1.5B, 16GiB)") from None


def memory_budget(text: str) -> int:
    """A `--memory` budget in bytes: a size ('16GiB'), or auto: this machine's physical memory (what a server alone
    on it could hold)."""
    if text == "auto":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return parse_count(text)
