"""A lean model at int8 or q4 is kept as built (a pack) and read back instead of built again: the same tensors, the
same logits bit for bit, and a pack that is stale or broken is never what a load returns."""

import os

import pytest
import torch

from draftwise.runtimes import checkpoint
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean import packed
from draftwise.runtimes.lean.int8 import Int8Weight
from draftwise.runtimes.lean.q4 import Q4Weight
from draftwise.runtimes.registry import load


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "packed"


def no_building(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("built again: the pack was not read")

    monkeypatch.setattr(checkpoint, "_engine_lm", refuse)


def same_model(a, b) -> None:
    named = lambda lm: dict(lm.named_buffers(remove_duplicate=False))  # noqa: E731
    assert named(a).keys() == named(b).keys()
    for name, t in named(a).items():
        assert (t is None and named(b)[name] is None) or torch.equal(t, named(b)[name]), name
    kinds = lambda lm: {name: type(m) for name, m in lm.named_modules()}  # noqa: E731
    assert kinds(a) == kinds(b)
    ids = torch.tensor([[1, 5, 9, 5, 9, 5, 3]])
    for lm in (a, b):
        lm.reset(1, 16)
    assert torch.equal(a(ids, 0), b(ids, 0))  # a prefill
    assert torch.equal(a(ids[:, :3], 7), b(ids[:, :3], 7))  # a verify pass after it


@pytest.mark.parametrize("fixture,dtype", [("small_q4_gguf", "q4"), ("tiny_dir", "int8"), ("tiny_gemma_dir", "int8")])
def test_a_pack_is_the_model_as_built(fixture, dtype, cache, request, monkeypatch):
    spec, options = request.getfixturevalue(fixture), ModelOptions(dtype=dtype)
    built = load(spec, options)
    assert len(list(cache.glob("*.safetensors"))) == 1
    no_building(monkeypatch)
    read = load(spec, options)
    assert read.lm.precision == dtype and isinstance(read.lm.layers[0].wqkv, Q4Weight if dtype == "q4" else Int8Weight)
    same_model(built.lm, read.lm)


def test_fp32_and_compiled_models_are_not_packed(tiny_dir, cache):
    load(tiny_dir, ModelOptions(dtype="fp32"))
    load(tiny_dir, ModelOptions(dtype="int8", compile=True))
    assert not list(cache.glob("*.safetensors"))


def test_a_changed_checkpoint_is_built_again_and_its_old_pack_removed(tiny_dir, tmp_path, cache):
    import shutil

    copy = shutil.copytree(tiny_dir, tmp_path / "copy")
    load(str(copy), ModelOptions(dtype="int8"))
    (old,) = cache.glob("*.safetensors")
    weights = next(copy.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    load(str(copy), ModelOptions(dtype="int8"))
    (new,) = cache.glob("*.safetensors")
    assert new != old


def test_a_broken_pack_is_built_again(tiny_dir, cache, capsys):
    first = load(tiny_dir, ModelOptions(dtype="int8"))
    (pack,) = cache.glob("*.safetensors")
    pack.write_bytes(pack.read_bytes()[:100])
    again = load(tiny_dir, ModelOptions(dtype="int8"))
    assert "could not be read" in capsys.readouterr().err
    same_model(first.lm, again.lm)
    assert packed.read(pack, again.config, "int8") is not None  # written afresh
