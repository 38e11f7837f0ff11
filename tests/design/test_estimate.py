"""The design's predictions of a model candidate: a round's drafting priced as the SD loop pays it."""

from __future__ import annotations

import json

import pytest

from draftwise import cost
from draftwise.design import estimate


def test_all_accepted_is_the_tar_gained_by_one_more_draft():
    tar = {"1": 1.9, "2": 2.6, "3": 3.1, "4": 3.4, "6": 3.8}
    assert estimate.all_accepted(tar, 1) == pytest.approx(0.9)  # TAR(0) = 1
    assert estimate.all_accepted(tar, 3) == pytest.approx(0.5)
    assert estimate.all_accepted(tar, 6) == pytest.approx(0.2)  # (3.8 − 3.4) / 2: γ 5 was not replayed


class Folder:
    def __init__(self, root):
        self.root = root

    def folder(self, name):
        return self.root / name


def _write(root, drafter: dict, tar: dict) -> Folder:
    (root / "profile").mkdir(parents=True)
    (root / "agree-d").mkdir()
    batch = {"ar_step_ms": 50.0, "verify_ms": {"1": 65.0, "2": 100.0}, "verify_over_ar_step": {"1": 1.3, "2": 2.0}}
    (root / "profile" / "profile.json").write_text(
        json.dumps({"batches": {"1": {**batch, "drafters": {"d": drafter}}}})
    )
    (root / "agree-d" / "agree.json").write_text(json.dumps({"predicted_greedy_tar": tar}))
    return Folder(root)


def test_a_round_after_a_fully_accepted_one_pays_the_catch_up_step(tmp_path):
    tar = {"1": 1.9, "2": 2.6}
    p = _write(tmp_path, {"step_ms": 20.0, "catch_up_ms": 25.0}, tar)
    verify = cost.verify_curve(json.loads((tmp_path / "profile" / "profile.json").read_text())["batches"]["1"])
    got = estimate.predicted(p, "d", "d")
    assert got[1] == pytest.approx(1e3 * 1.9 / (20.0 + 0.9 * 5.0 + verify(1)))
    assert got[2] == pytest.approx(1e3 * 2.6 / (2 * 20.0 + 0.7 * 5.0 + verify(2)))
    old = _write(tmp_path / "old", {"step_ms": 20.0}, tar)  # a profile from before catch-up steps were timed
    assert estimate.predicted(old, "d", "d")[1] == pytest.approx(1e3 * 1.9 / (20.0 + verify(1)))
