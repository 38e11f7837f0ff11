import json

import pytest

from draftwise import cost
from draftwise.errors import DraftwiseError
from draftwise.stages import predict

PROFILE = {"batches": {"1": {
    "ar_step_ms": 30.0, "verify_ms": {"1": 32.0, "2": 34.0, "4": 38.0},
    "drafters": {"small": {"step_ms": 5.0}, "big": {"step_ms": 12.0}},
}}}


def test_predictions_follow_the_cost_model_and_rank():
    out = predict.predict(PROFILE, gammas=[1, 2, 3, 4], alpha=0.7)
    r = next(r for r in out["rows"] if r["drafter"] == "small" and r["gamma"] == 3)
    assert r["tokens_per_s"] == pytest.approx(1e3 * cost.expected_tokens_iid(0.7, 3) / (3 * 5.0 + 36.0))  # verify(3) interpolated
    speeds = [r["tokens_per_s"] for r in out["rows"]]
    assert speeds == sorted(speeds, reverse=True)
    assert out["best_gamma"]["small"]["tokens_per_s"] >= out["best_gamma"]["big"]["tokens_per_s"]
    assert out["ar_tokens_per_s"] == pytest.approx(1e3 / 30)


def test_measured_acceptance_is_used_for_the_benched_drafter():
    bench = {"drafter": "big", "gamma": 2, "alpha": 0.5, "acceptance_per_position": [0.9, 0.2],
             "tokens_per_s": 40.0, "decode_tokens_per_s": 42.0}
    out = predict.predict(PROFILE, gammas=[2], bench=bench)
    assert out["skipped"] == ["small"]
    expected = 1e3 * cost.expected_tokens([0.9, 0.2]) / (2 * 12.0 + 34.0)
    assert out["check"]["predicted_tokens_per_s"] == pytest.approx(expected)
    assert out["check"]["error"] == pytest.approx(expected / 42.0 - 1)


def test_needs_acceptance_and_a_profile(tmp_path):
    (tmp_path / "profile.json").write_text(json.dumps(PROFILE))
    with pytest.raises(DraftwiseError, match="--alpha"):
        predict.run(tmp_path)
    with pytest.raises(DraftwiseError, match="no profile.json"):
        predict.run(tmp_path / "missing", alpha=0.5)
    with pytest.raises(DraftwiseError, match="no batch 4"):
        predict.run(tmp_path, alpha=0.5, batch=4)


def test_a_lookup_bench_is_predicted_from_its_own_proposals():
    rounds = ([{"drafted": 3, "accepted": 3, "emitted": 4, "source": "lookup", "draft_s": 0.0002}] * 3
              + [{"drafted": 0, "accepted": 0, "emitted": 1, "source": "", "draft_s": 0.0001}] * 5)
    bench = {"drafter": "ngram", "gamma": 3, "kind": "lookup", "alpha": 1.0, "acceptance_per_position": [1, 1, 1],
             "tokens_per_s": 40.0, "decode_tokens_per_s": 44.0, "rounds": rounds}
    out = predict.predict(PROFILE, gammas=[1, 2, 3], bench=bench)
    verify3 = 36.0  # interpolated between γ = 2 (34) and 4 (38)
    expected = 1e3 * (3 * 4 + 5 * 1) / (3 * (0.2 + verify3) + 5 * (0.1 + 30.0))
    assert out["check"]["predicted_tokens_per_s"] == pytest.approx(expected)
    cut = next(r for r in out["rows"] if r["drafter"] == "ngram" and r["gamma"] == 1)  # the same proposals cut to 1
    assert cut["tokens_per_s"] == pytest.approx(1e3 * (3 * 2 + 5) / (3 * (0.2 + 32.0) + 5 * 30.1))
