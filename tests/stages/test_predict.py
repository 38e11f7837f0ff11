import json

import pytest

from draftwise import cost
from draftwise.errors import DraftwiseError
from draftwise.stages import predict

PROFILE = {
    "batches": {
        "1": {
            "ar_step_ms": 30.0,
            "verify_ms": {"1": 32.0, "2": 34.0, "4": 38.0},
            "drafters": {"small": {"step_ms": 5.0}, "big": {"step_ms": 12.0}},
        }
    }
}


def test_predictions_follow_the_cost_model_and_rank():
    out = predict.predict(PROFILE, gammas=[1, 2, 3, 4], alpha=0.7)
    r = next(r for r in out["rows"] if r["drafter"] == "small" and r["gamma"] == 3)
    assert r["tokens_per_s"] == pytest.approx(
        1e3 * cost.expected_tokens_iid(0.7, 3) / (3 * 5.0 + 36.0)
    )  # verify(3) interpolated
    speeds = [r["tokens_per_s"] for r in out["rows"]]
    assert speeds == sorted(speeds, reverse=True)
    assert out["best_gamma"]["small"]["tokens_per_s"] >= out["best_gamma"]["big"]["tokens_per_s"]
    assert out["ar_tokens_per_s"] == pytest.approx(1e3 / 30)


def test_measured_acceptance_is_used_for_the_benched_drafter():
    bench = {
        "drafter": "big",
        "gamma": 2,
        "temperature": 0.0,
        "alpha": 0.5,
        "acceptance_per_position": [0.9, 0.2],
        "tokens_per_s": 40.0,
        "decode_tokens_per_s": 42.0,
    }
    out = predict.predict(PROFILE, gammas=[2], points=[bench])
    assert out["skipped"] == ["small"]
    expected = 1e3 * cost.expected_tokens([0.9, 0.2]) / (2 * 12.0 + 34.0)
    (check,) = out["checks"]
    assert check["predicted_tokens_per_s"] == pytest.approx(expected)
    assert check["error"] == pytest.approx(expected / 42.0 - 1)


def test_needs_acceptance_and_a_profile(tmp_path):
    (tmp_path / "profile.json").write_text(json.dumps(PROFILE))
    with pytest.raises(DraftwiseError, match="--alpha"):
        predict.run(tmp_path)
    with pytest.raises(DraftwiseError, match="no profile.json"):
        predict.run(tmp_path / "missing", alpha=0.5)
    with pytest.raises(DraftwiseError, match="no batch 4"):
        predict.run(tmp_path, alpha=0.5, batch=4)


def test_a_lookup_bench_is_predicted_from_its_own_proposals():
    rounds = [{"drafted": 3, "accepted": 3, "emitted": 4, "source": "lookup", "draft_s": 0.0002}] * 3 + [
        {"drafted": 0, "accepted": 0, "emitted": 1, "source": "", "draft_s": 0.0001}
    ] * 5
    bench = {
        "drafter": "ngram",
        "gamma": 3,
        "temperature": 0.0,
        "kind": "lookup",
        "alpha": 1.0,
        "acceptance_per_position": [1, 1, 1],
        "tokens_per_s": 40.0,
        "decode_tokens_per_s": 44.0,
        "rounds": rounds,
    }
    out = predict.predict(PROFILE, gammas=[1, 2, 3], points=[bench])
    verify3 = 36.0  # interpolated between γ = 2 (34) and 4 (38)
    expected = 1e3 * (3 * 4 + 5 * 1) / (3 * (0.2 + verify3) + 5 * (0.1 + 30.0))
    assert out["checks"][0]["predicted_tokens_per_s"] == pytest.approx(expected)
    cut = next(r for r in out["rows"] if r["drafter"] == "ngram" and r["gamma"] == 1)  # the same proposals cut to 1
    assert cut["tokens_per_s"] == pytest.approx(1e3 * (3 * 2 + 5) / (3 * (0.2 + 32.0) + 5 * 30.1))


def test_a_scheduled_run_is_priced_from_its_own_rounds(tiny_dir, tmp_path):
    """A bench run with the round scheduler: its scheduled rounds (each a verified prefix; k = 0 a plain step) are
    priced like a lookup's, beside the static rows, and checked against the scheduled method's measured tokens/s."""
    from draftwise.config import BenchConfig, ProfileConfig
    from draftwise.stages import bench, profile

    prof = profile.run(
        ProfileConfig(target=tiny_dir, depths=(1,), gammas=(1, 2, 4), batches=(1,), context=16, warmup=0, repeats=2),
        tmp_path / "profile",
    )
    run = bench.run(
        BenchConfig(
            target=tiny_dir,
            drafter="ngram:min=1,max=3",
            gamma=4,
            limit=2,
            max_new_tokens=12,
            baselines=("ar",),
            warmup=0,
            schedule=str(prof),
        ),
        tmp_path / "run",
    )
    out = predict.run(prof, run)
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    rounds = [rd for r in records if r["method"] == bench.SCHEDULED for rd in r["rounds"]]
    entry = json.loads((prof / "profile.json").read_text())["batches"]["1"]
    curve = cost.verify_curve(entry)
    row = next(r for r in out["rows"] if r["drafter"] == "ngram:min=1,max=3 (scheduled)")
    assert row["tokens_per_s"] == pytest.approx(cost.predict_rounds(rounds, lambda k: curve(k) / 1e3))
    check = next(c for c in out["checks"] if c["method"] == "scheduled")
    measured = check["measured_decode_tokens_per_s"]
    assert check["predicted_tokens_per_s"] == row["tokens_per_s"] and check["error"] == pytest.approx(
        row["tokens_per_s"] / measured - 1
    )
    assert any(r["drafter"] == "ngram:min=1,max=3" and r["gamma"] == 4 for r in out["rows"])  # static rows as before


def test_a_grid_bench_has_every_point_checked(tiny_dir, tmp_path):
    """A bench grid (several drafters and γ): each SD point is read from the records and set beside its own
    prediction — a model drafter the profile timed from its own acceptance, a lookup from its own rounds — and that
    prediction anchored on the grid's own AR decode speed."""
    from draftwise.config import BenchConfig, BenchGridConfig, ProfileConfig
    from draftwise.stages import bench_grid, profile

    prof = profile.run(
        ProfileConfig(
            target=tiny_dir,
            drafters=("layers:0",),
            depths=(),
            gammas=(1, 2),
            batches=(1,),
            context=16,
            warmup=0,
            repeats=2,
        ),
        tmp_path / "profile",
    )
    base = BenchConfig(target=tiny_dir, drafter="layers:0", limit=2, max_new_tokens=10, baselines=("ar",), warmup=0)
    run = bench_grid.run(
        BenchGridConfig(bench=base, drafters=("layers:0", "ngram:min=1,max=3"), gammas=(1, 2)), tmp_path / "grid"
    )
    out = predict.run(prof, run)
    checked = {(c["drafter"], c["gamma"]) for c in out["checks"]}
    assert checked == {(d, g) for d in ("layers:0", "ngram:min=1,max=3") for g in (1, 2)}
    entry = json.loads((prof / "profile.json").read_text())["batches"]["1"]
    points = {(x["drafter"], x["gamma"]): x for x in predict.bench_points(run)}
    lookup = points[("ngram:min=1,max=3", 2)]
    check = next(c for c in out["checks"] if (c["drafter"], c["gamma"]) == ("ngram:min=1,max=3", 2))
    curve = cost.verify_curve(entry)
    assert check["predicted_tokens_per_s"] == pytest.approx(
        cost.predict_rounds(lookup["rounds"], lambda k: curve(k) / 1e3)
    )
    ar = lookup["ar_decode_tokens_per_s"]  # the grid's AR baseline: the prediction anchored on it, too
    assert ar and check["anchored_tokens_per_s"] == pytest.approx(
        check["predicted_tokens_per_s"] * entry["ar_step_ms"] / 1e3 * ar
    )
    model = points[("layers:0", 1)]
    en = cost.expected_tokens(cost.acceptance_for(1, per_position=model["acceptance_per_position"]))
    step = entry["drafters"]["layers:0"]["c"] * entry["ar_step_ms"]  # the step on the verify curve's footing
    want = 1e3 * cost.throughput(en, 1, step, curve(1))
    assert next(c for c in out["checks"] if (c["drafter"], c["gamma"]) == ("layers:0", 1))[
        "predicted_tokens_per_s"
    ] == pytest.approx(want)


def test_a_bench_run_without_sd_points_is_refused_in_one_line(tiny_dir, tmp_path):
    from draftwise.config import BenchConfig
    from draftwise.stages import bench

    run = bench.run(
        BenchConfig(target=tiny_dir, limit=1, max_new_tokens=4, baselines=("ar",), warmup=0), tmp_path / "r"
    )
    (tmp_path / "profile.json").write_text(json.dumps(PROFILE))
    with pytest.raises(DraftwiseError, match="no SD records at batch 1"):
        predict.run(tmp_path, run)
