"""A run folder: `config.json`, raw `records.jsonl` appended as work finishes, and derived artefacts.

Records are written one JSON line at a time and flushed, so a killed run loses at most the record in flight;
reopening the folder with the same config resumes it (stages skip what `records()` already holds). A folder that
holds a different config is refused rather than mixed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from . import config as cfg
from .errors import DraftwiseError


def read_records(path: Path) -> list[dict]:
    """All complete records of a records.jsonl; a last line cut short by a crash is ignored (it is redone)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


class RunDir:
    def __init__(self, path: str | os.PathLike, config):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.records_path = self.path / "records.jsonl"
        saved = self.path / "config.json"
        if saved.exists():
            old, new = _with_defaults(json.loads(saved.read_text()), config), json.loads(json.dumps(cfg.to_dict(config)))
            if old != new:
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise DraftwiseError(
                    f"{self.path} holds a run with a different config ({', '.join(changed)} differ): "
                    "use another --out, or delete the folder to start over"
                )
        else:
            cfg.save(config, saved)
        self._drop_partial_line()

    def records(self) -> list[dict]:
        return read_records(self.records_path)

    def append(self, record: dict) -> None:
        with open(self.records_path, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def _drop_partial_line(self) -> None:
        """A crash mid-write leaves a last line without its newline: remove it before appending after it."""
        if self.records_path.exists():
            data = self.records_path.read_bytes()
            if data and not data.endswith(b"\n"):
                self.records_path.write_bytes(data[: data.rfind(b"\n") + 1])

    def write_json(self, name: str, obj) -> Path:
        path = self.path / name
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(obj, indent=2) + "\n")
        os.replace(tmp, path)
        return path


def _with_defaults(saved: dict, config) -> dict:
    """A saved config as this version reads it: fields added since then take their defaults (so an older run folder
    still resumes when nothing it recorded differs); one that no longer parses is returned as it is."""
    if saved.get("stage") != type(config).__name__:
        return saved
    try:
        return json.loads(json.dumps(cfg.to_dict(cfg.from_dict(type(config), saved))))
    except (DraftwiseError, TypeError):
        return saved
