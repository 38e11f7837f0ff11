"""A run folder: `config.json`, raw `records.jsonl` appended as work finishes, `machine.json` (the machine its figures
come from: `machine.facts`), and derived artefacts.

Records are written one JSON line at a time and flushed, so a killed run loses at most the record in flight;
reopening the folder with the same config resumes it (stages skip what `records()` already holds). A folder that
holds a different config is refused rather than mixed. config.json and the derived JSON files are written to a
temporary file and renamed over, so a kill never leaves one half written.

Fault injection (tests only): `DRAFTWISE_FAULT=append:N` makes this process write the first half of its N-th
record's line (N counts from 1, per process) and then SIGKILL itself: a kill inside a record write, on demand.
`DRAFTWISE_FAULT=file:NAME:N` does the same inside its N-th atomic write of a file called NAME (a stage's final file:
summary.json, grid.json, done.json, ...), half of it in the temporary file, before the rename.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from . import config as cfg
from . import machine
from .errors import DraftwiseError


def read_records(path: Path) -> list[dict]:
    """All complete records of a records.jsonl; a last line cut short by a crash is ignored (it is redone). Any other
    line that does not parse is corruption, not a crash: refused, since resuming past it would redo its work twice."""
    if not path.exists():
        return []
    out, lines = [], path.read_text().splitlines()
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                break
            raise DraftwiseError(
                f"{path}: line {i + 1} is not a JSON record (the folder is corrupt, not merely "
                "interrupted): repair or delete that line, or start over with another --out"
            ) from None
    return out


class RunDir:
    def __init__(self, path: str | os.PathLike, config):
        self.path = Path(path)
        _make_folder(self.path)
        self.records_path = self.path / "records.jsonl"
        saved = self.path / "config.json"
        if saved.exists():
            old, new = _with_defaults(_read_config(saved), config), json.loads(json.dumps(cfg.to_dict(config)))
            if old.get("stage") != new["stage"]:
                raise DraftwiseError(
                    f"{self.path} holds a {old['stage']} run, not a {new['stage']} one: use another "
                    "--out, or delete the folder to start over"
                )
            if old != new:
                changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
                raise DraftwiseError(
                    f"{self.path} holds a run with a different config ({', '.join(changed)} differ): "
                    "use another --out, or delete the folder to start over"
                )
        else:
            self.write_json(saved.name, cfg.to_dict(config))
        if not (self.path / "machine.json").exists():  # what its figures come from (`machine`)
            threads = getattr(config, "threads", None) or getattr(getattr(config, "bench", None), "threads", None)
            self.write_json("machine.json", machine.facts(threads))
        self._drop_partial_line()

    def records(self) -> list[dict]:
        return read_records(self.records_path)

    def append(self, record: dict) -> None:
        line = json.dumps(record) + "\n"
        with open(self.records_path, "a") as f:
            if _fault_now("append"):
                line = line[: len(line) // 2]  # the torn line a kill mid-write leaves, then the kill
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        if not line.endswith("\n"):
            os.kill(os.getpid(), signal.SIGKILL)

    def _drop_partial_line(self) -> None:
        """A crash mid-write leaves a last line without its newline: cut it off (one truncate, so a kill here
        loses nothing more) before appending after it."""
        if self.records_path.exists():
            data = self.records_path.read_bytes()
            if data and not data.endswith(b"\n"):
                os.truncate(self.records_path, data.rfind(b"\n") + 1)

    def write_json(self, name: str, obj) -> Path:
        return write_atomic(self.path / name, json.dumps(obj, indent=2) + "\n")


def _make_folder(path: Path) -> None:
    """Create a run folder (and its parents), refusing in one line a path that is, or lies under, a file."""
    if path.exists() and not path.is_dir():
        raise DraftwiseError(f"--out {path}: is a file, not a run folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        file = next((p for p in path.parents if p.exists() and not p.is_dir()), None)
        raise DraftwiseError(
            f"--out {path}: {file} is a file, not a folder"
            if file is not None
            else f"--out {path}: cannot create the run folder ({e.strerror or e})"
        ) from None


def _read_config(saved: Path) -> dict:
    """A run folder's saved config; a config.json that is not one draftwise wrote (another tool's, hand-edited into
    invalid JSON) is refused in one line rather than mixed with."""
    try:
        data = json.loads(saved.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        data = None
    if not isinstance(data, dict) or "stage" not in data:
        raise DraftwiseError(f"{saved} is not a draftwise run's config: use another --out")
    return data


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """Write `text` to a temporary file beside `path` and rename it over `path`: a kill leaves the old file or the
    new one, never half of one."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    if _fault_now("file", path.name):
        tmp.write_text(text[: len(text) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


FAULT = "DRAFTWISE_FAULT"
_counts: dict[tuple[str, str], int] = {}  # this process's appends (any run folder) and atomic writes per file name


def _fault_now(kind: str, name: str = "") -> bool:
    """Count one `kind` event (an append; an atomic write of file `name`); True when `DRAFTWISE_FAULT` names this
    one: `append:N` or `file:NAME:N`."""
    key = (kind, name)
    _counts[key] = _counts.get(key, 0) + 1
    want, _, rest = os.environ.get(FAULT, "").partition(":")
    target, _, n = rest.rpartition(":")
    return want == kind and target == name and n.strip().isdigit() and int(n) == _counts[key]


def _with_defaults(saved: dict, config) -> dict:
    """A saved config as this version reads it: fields added since then take their defaults (so an older run folder
    still resumes when nothing it recorded differs); one that no longer parses is returned as it is."""
    if saved.get("stage") != type(config).__name__:
        return saved
    try:
        return json.loads(json.dumps(cfg.to_dict(cfg.from_dict(type(config), saved))))
    except (DraftwiseError, TypeError):
        return saved
