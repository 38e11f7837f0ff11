"""The precision a design studies its target at (design/study.py): fp32 where the budget's plan at fp32 keeps every
row and the weights fit, else the target file's own 4-bit blocks; the decision kept by the run folder."""

import pytest

from draftwise import machine
from draftwise.config import DesignConfig
from draftwise.design import study


def _bandwidth(monkeypatch, gb_per_s: float) -> None:
    monkeypatch.setattr(machine, "bandwidth", lambda threads=None: {"read_gb_per_s": gb_per_s})


def test_a_target_whose_fp32_plan_keeps_every_row_is_studied_at_fp32(small_q4_gguf, monkeypatch):
    _bandwidth(monkeypatch, 30.0)  # the small file's fp32 step: well under a millisecond
    decision = study.decide(DesignConfig(target=small_q4_gguf, minutes=30))
    assert decision["dtype"] == "fp32" and decision["fp32_plan_left_out"] == []


def test_a_target_too_slow_at_fp32_is_studied_on_its_files_4_bit_blocks(small_q4_gguf, monkeypatch):
    _bandwidth(monkeypatch, 1e-4)  # an fp32 step of minutes: no plan at fp32 keeps a row
    decision = study.decide(DesignConfig(target=small_q4_gguf, minutes=30))
    assert decision["dtype"] == "q4" and {"lean-int8", "lean-q4", "llama.cpp"} == set(decision["fp32_plan_left_out"])
    assert "leaves out" in decision["reason"] and "nothing pruned or distilled" in decision["reason"]


def test_fp32_weights_beyond_half_the_memory_are_not_studied(small_q4_gguf, monkeypatch):
    _bandwidth(monkeypatch, 30.0)
    monkeypatch.setattr(machine, "memory", lambda: {"available_gib": 0.01})  # 10 MiB: less than twice the weights
    decision = study.decide(DesignConfig(target=small_q4_gguf, minutes=30))
    assert decision["dtype"] == "q4" and "more than 50% of the 0.01 GiB available" in decision["reason"]


def test_the_decision_is_the_run_folders_and_a_given_precision_is_kept(small_q4_gguf, tmp_path, monkeypatch):
    _bandwidth(monkeypatch, 1e-4)
    assert study.resolve_config(DesignConfig(target=small_q4_gguf), tmp_path / "a").dtype == "q4"
    _bandwidth(monkeypatch, 30.0)
    assert study.resolve_config(DesignConfig(target=small_q4_gguf), tmp_path / "a").dtype == "q4"  # resumed: kept
    assert study.resolve_config(DesignConfig(target=small_q4_gguf), tmp_path / "b").dtype == "fp32"
    given = study.resolve_config(DesignConfig(target=small_q4_gguf, dtype="int8"), tmp_path / "c")
    assert given.dtype == "int8" and not (tmp_path / "c" / study.FILE).exists()


@pytest.mark.parametrize("dtype", ["int8", "q4"])
def test_a_study_at_a_quantized_precision_trains_nothing(dtype):
    assert not DesignConfig(dtype=dtype).trains and DesignConfig(dtype="fp32").trains
