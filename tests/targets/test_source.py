from pathlib import Path

from draftwise.targets import source
from draftwise.targets.checkpoint import config_and_tokenizer


def test_a_large_file_converts_in_a_child_to_what_converting_here_gives(small_q4_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "here"))
    here = source.resolve(small_q4_gguf)
    calls = []
    run = source.isolate.run
    monkeypatch.setattr(source.isolate, "run", lambda *a, **k: calls.append(k["label"]) or run(*a, **k))
    monkeypatch.setattr(source, "CHILD_BYTES", 0)
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "child"))
    child = source.resolve(small_q4_gguf)
    assert calls == ["converting small-q4_1.gguf"] and child != here
    assert sorted(p.name for p in child.iterdir()) == sorted(p.name for p in here.iterdir())
    assert (child / "model.safetensors").read_bytes() == (here / "model.safetensors").read_bytes()
    child_config, here_config = (config_and_tokenizer(d)[0].to_dict() for d in (child, here))
    assert child_config.pop("_name_or_path") != here_config.pop("_name_or_path")  # each its own folder
    assert child_config == here_config


def test_the_same_file_elsewhere_reuses_its_conversion_and_a_changed_one_does_not(small_q4_gguf, tmp_path, monkeypatch):
    """Conversions are keyed by the file's bytes: another clone's copy of the default target reuses the conversion
    (and its packs) instead of converting again, and the folder points at a copy that still exists."""
    import shutil

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    a, b = tmp_path / "a" / "small-q4_1.gguf", tmp_path / "b" / "small-q4_1.gguf"
    for copy in (a, b):
        copy.parent.mkdir()
        shutil.copy(small_q4_gguf, copy)
    first = source.resolve(str(a))
    assert source.resolve(str(b)) == first and source.converted_from(first) == a
    assert len(list((tmp_path / "cache" / "models").iterdir())) == 1
    a.unlink()  # the first clone removed: the conversion now names the copy that is left
    assert source.resolve(str(b)) == first and source.converted_from(first) == b
    assert source.digest(b) == source.digest(small_q4_gguf)
    from draftwise.runtimes.lean import packed

    assert packed.pack_file(first, "q4", b) == packed.pack_file(first, "q4", Path(small_q4_gguf))  # one pack for both
    with open(b, "ab") as f:  # other bytes (GGUF readers ignore what follows the tensor data)
        f.write(b"\0" * 64)
    assert source.digest(b) != source.digest(small_q4_gguf)
    assert source.resolve(str(b)) != first


def test_a_conversion_under_the_old_path_key_is_adopted_not_converted_again(small_q4_gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    gguf = Path(small_q4_gguf).resolve()
    new = source.resolve(str(gguf))
    legacy = new.with_name(f"{gguf.stem}-{source._legacy_key(gguf, gguf.stat())}")
    new.rename(legacy)  # as an older draftwise left it, with a pack named after it
    pack = tmp_path / "cache" / "packed" / f"{legacy.name}-0000-q4-0000.safetensors"
    pack.parent.mkdir(parents=True, exist_ok=True)
    pack.write_bytes(b"old")
    converted = []
    monkeypatch.setattr(source, "_convert_gguf", lambda *a: converted.append(a))
    assert source.resolve(str(gguf)) == new and (new / "config.json").is_file() and not legacy.exists()
    assert not converted and not pack.exists()


def test_a_new_conversion_removes_older_ones_whose_file_is_gone(small_q4_gguf, tmp_path, monkeypatch):
    import shutil

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    gone, kept, new = (tmp_path / d / "small-q4_1.gguf" for d in ("gone", "kept", "new"))
    for copy in (gone, kept, new):
        copy.parent.mkdir()
        shutil.copy(small_q4_gguf, copy)
    with open(kept, "ab") as f:  # three versions of the file: other bytes, other conversions
        f.write(b"\0" * 64)
    with open(new, "ab") as f:
        f.write(b"\0" * 128)
    orphan, alive = source.resolve(str(gone)), source.resolve(str(kept))
    pack = tmp_path / "cache" / "packed" / f"{orphan.name}-0000-q4-0000.safetensors"
    pack.parent.mkdir(parents=True, exist_ok=True)
    pack.write_bytes(b"old")
    gone.unlink()
    fresh = source.resolve(str(new))
    assert fresh.is_dir() and alive.is_dir() and not orphan.exists() and not pack.exists()
