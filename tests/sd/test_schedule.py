import json
import random

import pytest
import torch
from chisquare import chisquare_pvalue
from test_loop import exact_first_three, lean

from conftest import tiny_config
from draftwise.errors import DraftwiseError
from draftwise.sd.drafters import Draft, HybridDrafter, ModelDrafter
from draftwise.sd.lookup import NgramDrafter, SuffixDrafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams
from draftwise.sd.schedule import Calibration, Scheduler, VerifyCurve, best_k
from draftwise.sd.suffix import SuffixTrie

GREEDY = SamplingParams()
REPEATING = [1, 5, 9, 13, 5, 9, 13, 5, 9, 21, 22, 5, 9, 13]  # n-gram matches from the start


def brute_force(a_hat, t_verify):
    rates = []
    for k in range(len(a_hat) + 1):
        expected = 1 + sum(torch.tensor(a_hat[:j]).prod().item() for j in range(1, k + 1))
        rates.append(expected / t_verify(k))
    return max(range(len(rates)), key=lambda k: (rates[k] - max(rates) > -1e-9 * max(rates), -k))


def test_k_star_is_the_brute_force_argmax():
    rng = random.Random(0)
    for _ in range(500):
        g = rng.randint(0, 8)
        a_hat = [rng.random() for _ in range(g)]
        steps = [1.0]
        for _ in range(g):
            steps.append(steps[-1] + rng.choice([0.0, 0.05, 0.3, 1.0, 2.0]))
        curve = VerifyCurve(tuple(steps))
        assert best_k(a_hat, curve) == brute_force(a_hat, curve)


@pytest.fixture(scope="module")
def pair():
    return lean(tiny_config(vocab=64, layers=3), seed=11), lean(tiny_config(vocab=64, layers=1), seed=12)


def drafters(draft_lm):
    trie = SuffixTrie(16)
    trie.add([5, 9, 13, 5, 9, 21, 22, 23, 24])
    return {
        "ngram": NgramDrafter(1, 4),
        "suffix": SuffixDrafter(trie, factor=2, min_prob=0.1),
        "model": ModelDrafter(draft_lm),
        "hybrid": HybridDrafter(ModelDrafter(draft_lm), NgramDrafter(1, 4)),
    }


@pytest.mark.parametrize("kind", ["ngram", "suffix", "model", "hybrid"])
def test_scheduled_greedy_sd_is_identical_to_greedy_ar(pair, kind):
    target, draft_lm = pair
    scheduler = Scheduler(VerifyCurve((1.0, 1.2, 1.5, 1.9, 2.4, 3.0)))  # cuts some proposals, keeps others
    for prompt in (REPEATING, [1, 20, 21, 22], [1]):
        ar = generate(target, prompt, GREEDY, 40, torch.Generator())
        sd = generate(
            target,
            prompt,
            GREEDY,
            40,
            torch.Generator(),
            drafter=drafters(draft_lm)[kind],
            gamma=5,
            scheduler=scheduler,
        )
        assert sd.tokens == ar.tokens
        scheduler.commit([r.__dict__ for r in sd.rounds])
    assert scheduler.calibration.counts  # it learnt from the rounds it saw


def test_an_expensive_verify_pass_is_never_used_and_a_free_one_always(pair):
    target, _ = pair
    ar = generate(target, REPEATING, GREEDY, 40, torch.Generator())
    never = generate(
        target,
        REPEATING,
        GREEDY,
        40,
        torch.Generator(),
        drafter=NgramDrafter(1, 4),
        gamma=4,
        scheduler=Scheduler(VerifyCurve((1.0, 3.0, 5.0, 7.0, 9.0))),
    )  # each token costs > 1 step
    proposed = [r for r in never.rounds if r.schedule]
    assert proposed and all(r.drafted == 0 and r.schedule["k"] == 0 for r in never.rounds if r.schedule)
    assert never.tokens == ar.tokens and len(never.rounds) == 40  # every round a plain AR step
    free = generate(
        target,
        REPEATING,
        GREEDY,
        40,
        torch.Generator(),
        drafter=NgramDrafter(1, 4),
        gamma=4,
        scheduler=Scheduler(VerifyCurve((1.0,) * 5)),
    )
    assert all(r.schedule["k"] == r.schedule["proposed"] == r.drafted for r in free.rounds if r.schedule)
    assert free.tokens == ar.tokens


def test_a_round_that_verifies_nothing_still_observes_the_first_token(pair):
    target, _ = pair
    out = generate(
        target,
        REPEATING,
        GREEDY,
        20,
        torch.Generator(),
        drafter=NgramDrafter(1, 4),
        gamma=4,
        scheduler=Scheduler(VerifyCurve((1.0, 9.0, 9.0, 9.0, 9.0))),
    )
    ar = generate(target, REPEATING, GREEDY, 20, torch.Generator()).tokens
    seq = list(REPEATING)
    for r in out.rounds:
        if r.schedule:  # k = 0: the step's logits price the proposal's first token, exactly
            assert r.schedule["observed"] == [1.0 if ngram_first(seq) == ar[len(seq) - len(REPEATING)] else 0.0]
        seq.append(ar[len(seq) - len(REPEATING)])


def ngram_first(seq):
    index = NgramDrafter(1, 4).index()
    index.extend(seq)
    return index.propose(1)[0]


def test_the_bypass_pauses_a_request_whose_speculation_does_not_pay_and_probes_again():
    scheduler = Scheduler(VerifyCurve((1.0, 1.5)), window=4, pause=3)
    session = scheduler.start()
    for f in ["own|p1|n1|g4"] * 50:  # a confident signal that keeps failing
        scheduler.calibration.observe(f, 1.0)
    ks = []
    for _ in range(16):
        kept, plan = session.plan(Draft([7], None, "lookup", ["own|n1|g4"]))
        ks.append(plan.k)
        session.observe(plan, torch.zeros(2, 8), GREEDY, accepted=0, emitted=1)  # rejected: 1 token for 1.5 steps
    assert ks[:4] == [1, 1, 1, 1] and ks[4:7] == [0, 0, 0]  # a window of losses, then a pause of 3 rounds
    assert 1 in ks[7:]  # then it probes again (while the local observations allow)


def test_greedy_schedules_repeat_exactly(pair):
    target, draft_lm = pair

    def schedule():
        scheduler, ks = Scheduler(VerifyCurve((1.0, 1.3, 1.7, 2.2, 2.8)), window=3, pause=2), []
        for prompt in (REPEATING, [1, 20, 21, 22]):
            out = generate(
                target,
                prompt,
                GREEDY,
                30,
                torch.Generator(),
                drafter=drafters(draft_lm)["hybrid"],
                gamma=4,
                scheduler=scheduler,
            )
            scheduler.commit([r.__dict__ for r in out.rounds])
            ks.append([(r.schedule["k"], r.schedule["paused"]) if r.schedule else None for r in out.rounds])
        return ks, scheduler.calibration.counts

    assert schedule() == schedule()


def test_calibration_shrinks_a_sparse_bin_towards_its_parent():
    c = Calibration()
    for _ in range(200):
        c.observe("corpus|p1|m2|s4", 0.9)
    c.observe("corpus|p1|m2|s0", 0.0)
    assert abs(c.estimate("corpus|p1|m2|s4") - 0.9) < 0.01
    assert 0.5 < c.estimate("corpus|p1|m2|s0") < 0.9  # one observation: mostly what its parent says
    assert c.estimate("model|p1|q3") == pytest.approx(0.3)  # nothing seen: the prior


def test_a_profile_of_another_engine_is_refused(tmp_path):
    profile = {
        "machine": {"engine": "llama.cpp", "dtype": "Q8_0"},
        "batches": {"1": {"ar_step_ms": 10.0, "verify_ms": {"1": 16.0, "4": 26.0}}},
    }
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    curve = VerifyCurve.from_profile(tmp_path, 5, {"engine": "llama.cpp", "dtype": "Q8_0"})
    assert curve.ms[0] == 10 and curve.ms[1] == 16 and curve.ms[4] == 26 and curve.ms[2] == pytest.approx(19.333, 1e-3)
    with pytest.raises(DraftwiseError, match="profiled on llama.cpp at Q8_0, not on lean"):
        VerifyCurve.from_profile(tmp_path, 5, {"engine": "lean", "dtype": "fp32"})
    with pytest.raises(DraftwiseError, match="not a finished profile run"):
        VerifyCurve.from_profile(tmp_path / "nothing", 5)


@pytest.mark.parametrize("kind", ["model", "ngram"])
def test_scheduled_sampled_sd_follows_the_target_distribution(kind):
    params = SamplingParams(1.0)
    V = 8
    target = lean(tiny_config(vocab=V, layers=2), seed=21, std=0.12)
    drafter = (
        ModelDrafter(lean(tiny_config(vocab=V, layers=1), seed=22, std=0.12)) if kind == "model" else NgramDrafter(1, 2)
    )
    prompt = [1, 3, 5, 3, 5]
    joint12, marg3 = exact_first_three(target, prompt, params)
    gen = torch.Generator().manual_seed(0)
    scheduler = Scheduler(VerifyCurve((1.0, 1.25, 1.45)), window=2, pause=1)
    c12, c3, ks = torch.zeros(V, V), torch.zeros(V), []
    for _ in range(2000):
        out = generate(target, prompt, params, 3, gen, drafter=drafter, gamma=2, scheduler=scheduler)
        scheduler.commit([r.__dict__ for r in out.rounds])  # the calibration moves as the run goes
        c12[out.tokens[0], out.tokens[1]] += 1
        c3[out.tokens[2]] += 1
        ks += [r.schedule["k"] for r in out.rounds if r.schedule]
    assert len(set(ks)) > 1  # the scheduler both cut and kept proposals
    assert chisquare_pvalue(c12, joint12) > 1e-3
    assert chisquare_pvalue(c3, marg3) > 1e-3
