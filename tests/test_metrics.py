import pytest

from draftwise import metrics


def r(drafted, accepted, emitted=None):
    return {"drafted": drafted, "accepted": accepted, "emitted": accepted + 1 if emitted is None else emitted,
            "draft_s": 0.1, "verify_s": 0.2}


ROUNDS = [r(4, 4), r(4, 1), r(4, 0), r(2, 2), r(0, 0)]


def test_tar_counts_the_recovered_or_bonus_token():
    assert metrics.tar(ROUNDS) == (5 + 2 + 1 + 3 + 1) / 5
    assert metrics.tar([r(0, 0)] * 7) == 1.0  # AR: one token per target call


def test_alpha_is_accepted_over_drafted():
    assert metrics.alpha(ROUNDS) == 7 / 14
    assert metrics.alpha([r(0, 0)]) is None


def test_acceptance_per_position():
    # k=1: tried in 4 rounds, accepted in 3; k=2: 4 tried, 2 accepted; k=3, k=4: 3 tried (the γ=2 round stops), 1 accepted
    assert metrics.acceptance_per_position(ROUNDS) == [3 / 4, 2 / 4, 1 / 3, 1 / 3]


def test_tokens_per_s_sums_over_prompts():
    gens = [{"new_tokens": 10, "seconds": 1.0}, {"new_tokens": 30, "seconds": 3.0}, {"new_tokens": 0, "seconds": 1.0}]
    assert metrics.tokens_per_s(gens) == pytest.approx(40 / 5)


def test_summarize_and_identity():
    a = [{"prompt_id": "x", "tokens": [1, 2], "new_tokens": 2, "seconds": 1.0, "rounds": ROUNDS},
         {"prompt_id": "y", "tokens": [3], "new_tokens": 1, "seconds": 1.0, "rounds": []}]
    b = [{"prompt_id": "x", "tokens": [1, 2]}, {"prompt_id": "y", "tokens": [4]}]
    s = metrics.summarize_method(a)
    assert s["tokens_per_s"] == 1.5 and s["rounds"] == 5 and s["draft_s"] == pytest.approx(0.5)
    assert metrics.identical_fraction(a, b) == 0.5
