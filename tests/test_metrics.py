import pytest

from draftwise import metrics


def r(drafted, accepted, emitted=None):
    return {
        "drafted": drafted,
        "accepted": accepted,
        "emitted": accepted + 1 if emitted is None else emitted,
        "draft_s": 0.1,
        "verify_s": 0.2,
    }


ROUNDS = [r(4, 4), r(4, 1), r(4, 0), r(2, 2), r(0, 0)]


def test_tar_counts_the_recovered_or_bonus_token():
    assert metrics.tar(ROUNDS) == (5 + 2 + 1 + 3 + 1) / 5
    assert metrics.tar([r(0, 0)] * 7) == 1.0  # AR: one token per target call


def test_alpha_is_accepted_over_drafted():
    assert metrics.alpha(ROUNDS) == 7 / 14
    assert metrics.alpha([r(0, 0)]) is None


def test_acceptance_per_position_is_conditional_on_reaching_k():
    # k=1: tested in the 4 rounds that drafted, accepted in 3; k=2: tested where the 1st was kept and a 2nd drafted
    # (4/4, 4/1, 2/2) -> 2 of 3; k=3 and k=4: only the 4/4 round tests them -> 1 of 1
    assert metrics.acceptance_per_position(ROUNDS) == [3 / 4, 2 / 3, 1.0, 1.0]
    assert metrics.acceptance_per_position([r(3, 0), r(3, 0)]) == [0.0, None, None]


def test_expected_tokens_from_measured_rates_equals_tar_of_full_rounds():
    """With the conditional rates, E[N] = 1 + Σ Π a_i reproduces the mean tokens per round exactly."""
    from draftwise import cost

    rounds = [r(3, a) for a in (0, 1, 1, 2, 3, 3, 0, 2, 3, 1)]
    assert cost.expected_tokens(metrics.acceptance_per_position(rounds)) == pytest.approx(metrics.tar(rounds))


def test_tokens_per_s_sums_over_prompts():
    gens = [{"new_tokens": 10, "seconds": 1.0}, {"new_tokens": 30, "seconds": 3.0}, {"new_tokens": 0, "seconds": 1.0}]
    assert metrics.tokens_per_s(gens) == pytest.approx(40 / 5)


def test_summarize_and_identity():
    a = [
        {"prompt_id": "x", "tokens": [1, 2], "new_tokens": 2, "seconds": 1.0, "rounds": ROUNDS},
        {"prompt_id": "y", "tokens": [3], "new_tokens": 1, "seconds": 1.0, "rounds": []},
    ]
    b = [{"prompt_id": "x", "tokens": [1, 2]}, {"prompt_id": "y", "tokens": [4]}]
    s = metrics.summarize_method(a)
    assert s["tokens_per_s"] == 1.5 and s["rounds"] == 5 and s["draft_s"] == pytest.approx(0.5)
    assert metrics.identical_fraction(a, b) == 0.5


def test_timings_of_another_machine_are_refused(tmp_path):
    import pytest

    from draftwise.errors import DraftwiseError
    from draftwise.timing import check_machine, machine

    here = machine("cpu", "fp32", "lean")
    assert here["device"] == "cpu" and here["device_name"]
    check_machine([{"machine": here}], here, tmp_path)  # same machine: fine
    with pytest.raises(DraftwiseError, match="another machine .*dtype: bf16 vs fp32"):
        check_machine([{"machine": {**here, "dtype": "bf16"}}], here, tmp_path)
