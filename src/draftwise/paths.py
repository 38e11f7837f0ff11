"""Where draftwise keeps things between runs: converted models and compiled kernels.

`$DRAFTWISE_CACHE` if set, else `$XDG_CACHE_HOME/draftwise`, else `~/.cache/draftwise`."""

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    root = (
        os.environ.get("DRAFTWISE_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "draftwise"
    )
    path = Path(root, *parts)
    path.mkdir(parents=True, exist_ok=True)
    return path
