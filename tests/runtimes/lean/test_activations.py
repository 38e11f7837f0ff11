"""Which activation bits a q4 model runs at on a file: the variable, this machine's kept measurement of that file, a
named model's measured choice, else 16 — and a switch after a pass taking effect."""

import os

import pytest
import torch

from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean.activations import chosen, keep, kept, with_activations
from draftwise.runtimes.registry import load
from draftwise.targets import named


def test_activation_bits_set_after_a_pass_take_effect(small_q4_gguf):
    """The fused C layer copies each matrix's activation bits: `with_activations` after a pass must still change them
    (a model at 8 bits from its load gives the same logits as one switched to 8 after a pass at 16)."""
    ids = torch.tensor([[1, 5, 9, 5, 9, 5, 7, 3]])

    def logits(lm):
        lm.reset(1, 16)
        return lm.forward(ids, 0)

    switched = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    at16 = logits(switched)
    at8 = logits(with_activations(switched, 8))
    fresh = with_activations(load(small_q4_gguf, ModelOptions(dtype="q4")).lm, 8)
    assert not torch.equal(at16, at8) and torch.equal(at8, logits(fresh))
    assert torch.equal(at16, logits(with_activations(switched, 16)))


def test_activation_bits_are_a_named_models_measured_choice_or_the_variables(tmp_path, monkeypatch):
    """Per block (8) on the GGUF file of a named model that records it (its name and size: a sparse stand-in here),
    16 on any other file; DRAFTWISE_ACTIVATION_BITS decides for every file, and a value other than 8 or 16 is one
    line."""
    monkeypatch.delenv("DRAFTWISE_ACTIVATION_BITS", raising=False)
    model = named.NAMED["qwen2.5-coder-1.5b"]
    stand_in = tmp_path / model.file
    with open(stand_in, "wb") as f:
        f.truncate(model.size)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    assert model.activations == 8 and chosen(stand_in) == 8 and chosen(other) == 16
    with open(stand_in, "r+b") as f:
        f.truncate(model.size - 1)  # not that file
    assert chosen(stand_in) == 16
    monkeypatch.setenv("DRAFTWISE_ACTIVATION_BITS", "8")
    assert chosen(other) == 8
    monkeypatch.setenv("DRAFTWISE_ACTIVATION_BITS", "4")
    with pytest.raises(DraftwiseError, match="must be 8"):
        chosen(other)


def test_a_files_kept_measurement_decides_its_bits_until_the_file_changes(tmp_path, monkeypatch):
    """`draftwise quality --runtimes lean:q4-a8` keeps its verdict per file (`keep`): per block where it kept the bar,
    16 where it did not — over a named model's own choice — until the file changes; the variable still decides for
    every file, and a measurement at 16 bits changes nothing."""
    monkeypatch.delenv("DRAFTWISE_ACTIVATION_BITS", raising=False)
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    mine = tmp_path / "mine.gguf"
    mine.write_bytes(b"GGUF")
    assert kept(mine) is None and chosen(mine) == 16
    assert not keep(mine, 16, 1.0, 0.0) and kept(mine) is None  # says nothing about 8 bits
    assert keep(mine, 8, 0.995, 0.004) and kept(mine) == 8 and chosen(mine) == 8
    assert not keep(mine, 8, 0.995, 0.006) and chosen(mine) == 16  # ΔNLL over the bar
    assert not keep(mine, 8, 0.985, 0.0) and chosen(mine) == 16  # agreement under it
    keep(mine, 8, 0.999, 0.0)
    monkeypatch.setenv("DRAFTWISE_ACTIVATION_BITS", "16")
    assert chosen(mine) == 16
    monkeypatch.delenv("DRAFTWISE_ACTIVATION_BITS")
    stat = mine.stat()
    os.utime(mine, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # another file now: measured again
    assert kept(mine) is None and chosen(mine) == 16
    model = named.NAMED["qwen2.5-coder-1.5b"]
    stand_in = tmp_path / model.file
    with open(stand_in, "wb") as f:
        f.truncate(model.size)
    assert chosen(stand_in) == 8
    keep(stand_in, 8, 0.95, 0.02)  # this machine's own measurement of that file missed the bar
    assert chosen(stand_in) == 16
