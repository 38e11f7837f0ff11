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
