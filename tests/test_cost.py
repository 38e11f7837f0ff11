import numpy as np
import pytest

from conftest import tiny_config
from draftwise import cost
from draftwise.errors import DraftwiseError
from draftwise.runtimes.lean.forward import LeanLM
from draftwise.shapes import Shape, max_batch, shape_for_budget
from draftwise.units import parse_count


def simulate_tokens_per_round(acceptance, rounds, seed=0):
    """Monte-Carlo of the acceptance process: draft positions are tested in order until the first rejection."""
    rng = np.random.default_rng(seed)
    accepted_all = rng.random((rounds, len(acceptance))) < np.array(acceptance)
    accepted = np.cumprod(accepted_all, axis=1).sum(axis=1)  # leading run of acceptances
    return accepted + 1  # + the recovered or bonus token


@pytest.mark.parametrize("acceptance", [[0.9, 0.8, 0.7, 0.6], [0.5] * 6, [0.0, 0.9], [1.0, 1.0, 1.0]])
def test_expected_tokens_matches_monte_carlo(acceptance):
    n = simulate_tokens_per_round(acceptance, 200_000)
    se = n.std() / np.sqrt(len(n)) + 1e-9
    assert abs(cost.expected_tokens(acceptance) - n.mean()) < 4 * se + 1e-9


@pytest.mark.parametrize("alpha,gamma", [(0.0, 4), (0.6, 4), (0.9, 8), (1.0, 3)])
def test_iid_closed_form(alpha, gamma):
    assert cost.expected_tokens_iid(alpha, gamma) == pytest.approx(cost.expected_tokens([alpha] * gamma))


def test_best_gamma_on_synthetic_costs():
    verify = lambda g: 10.0 + 0.5 * g  # noqa: E731
    gammas = range(1, 17)
    brute = max(gammas, key=lambda g: cost.expected_tokens_iid(0.8, g) / (g * 1.0 + verify(g)))
    gamma, speed = cost.best_gamma(1.0, verify, gammas, alpha=0.8)
    assert gamma == brute and 1 < gamma < 16  # an interior optimum: drafting more stops paying
    assert speed == pytest.approx(cost.expected_tokens_iid(0.8, gamma) / (gamma + verify(gamma)))
    # a drafter that is never accepted: drafting less is always better
    assert cost.best_gamma(1.0, verify, gammas, alpha=0.0)[0] == 1
    # measured per-position acceptance is used where known, the last value repeated beyond
    assert cost.acceptance_for(4, per_position=[0.9, 0.5]) == [0.9, 0.5, 0.5, 0.5]
    with pytest.raises(DraftwiseError, match="acceptance"):
        cost.acceptance_for(3)


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_convention_matches_built_model(tied):
    from transformers import AutoModelForCausalLM

    template = Shape.of(tiny_config(layers=4, tie_word_embeddings=tied))
    for layers in (1, 2, 3):
        shape = shape_for_budget(template, layers, budget=30_000)
        config = tiny_config(
            layers=layers,
            hidden_size=shape.hidden,
            num_attention_heads=shape.heads,
            num_key_value_heads=shape.kv_heads,
            head_dim=shape.head_dim,
            intermediate_size=shape.ffn,
            tie_word_embeddings=tied,
        )
        model = AutoModelForCausalLM.from_config(config)
        counted = shape.params()
        assert counted["total"] == sum(p.numel() for p in model.parameters())  # tied head counted once
        assert counted["embedding"] == model.get_input_embeddings().weight.numel()
        assert counted["head"] == (0 if tied else model.get_output_embeddings().weight.numel())
        assert Shape.of(config) == shape


def test_shapes_at_equal_budget_keep_head_dim_and_gqa():
    template = Shape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)
    budget = 15_000_000
    shapes = [shape_for_budget(template, k, budget) for k in (1, 2, 4, 8)]
    for s in shapes:
        assert s.head_dim == 64 and s.heads == 3 * s.kv_heads and s.hidden == s.heads * 64
        assert abs(s.params()["non_embedding"] - budget) / budget < 0.01
    assert [s.hidden for s in shapes] == sorted((s.hidden for s in shapes), reverse=True)  # deeper = narrower
    with pytest.raises(DraftwiseError, match="smaller than 40 layer"):
        shape_for_budget(template, 40, 100_000)


def test_kv_bytes_equal_the_allocated_cache():
    from conftest import tiny_model

    config = tiny_config(layers=3)
    lm = LeanLM(config, tiny_model(config).state_dict())
    lm.reset(batch_size=2, max_len=100)
    assert Shape.of(config).kv_bytes(context=100, batch=2) == lm.kv_bytes()
    assert lm.k_cache.numel() * 4 * 2 == lm.kv_bytes()


def test_max_batch():
    t = Shape(30, 576, 9, 3, 64, 1536, 49152)
    d = Shape(2, 576, 9, 3, 64, 1536, 49152)
    per_seq = t.kv_bytes(1024) + d.kv_bytes(1024)
    mem = t.weight_bytes() + d.weight_bytes() + 10 * per_seq + 5
    assert max_batch(mem, t, d, 1024) == 10
    # weights measured as loaded (a q4 target holds far less than 4 bytes a parameter) leave room for more sequences
    held = (t.weight_bytes() + d.weight_bytes()) // 8
    assert max_batch(mem, t, d, 1024, weights=held) == (mem - held) // per_seq > 10


def test_step_model_fit_recovers_known_coefficients():
    truth = cost.StepModel(fixed_ms=1.5, layer_overhead_ms=0.3, ms_per_layer_mb=0.05, ms_per_head_mb=0.04)
    shapes = [
        Shape(L, d, d // 64, d // 64, 64, 3 * d, V) for L in (1, 2, 4, 8) for d in (256, 512) for V in (8192, 49152)
    ]
    model = cost.StepModel.fit([(s, truth.predict_ms(s)) for s in shapes])
    for field in ("fixed_ms", "layer_overhead_ms", "ms_per_layer_mb", "ms_per_head_mb"):
        assert getattr(model, field) == pytest.approx(getattr(truth, field), rel=1e-6, abs=1e-9)


def test_interpolate_and_counts():
    assert cost.interpolate([1, 2, 4], [10, 12, 16], 3) == 14
    assert cost.interpolate([1, 2, 4], [10, 12, 16], 6) == 20  # extended past the last point
    assert parse_count("15M") == 15_000_000 and parse_count("16GiB") == 16 * 2**30
    with pytest.raises(DraftwiseError):
        parse_count("lots")


def test_mixture_throughput_is_tokens_over_time_of_the_round_mix():
    # half the rounds propose nothing (an AR step, 10 ms), half propose 2 tokens (verify 12 ms, proposal 1 ms) with
    # a_1 = 0.5, a_2 = 0.5: E[N | 2] = 1 + 0.5 + 0.25
    lengths, acc = {0: 1, 2: 1}, [0.5, 0.5]
    t_verify = {0: 0.010, 1: 0.011, 2: 0.012}.get
    tps = cost.throughput_mixture(lengths, acc, lambda g: 0.001 if g else 0.0, t_verify)
    assert tps == pytest.approx((1 + 1.75) / (0.010 + 0.013))
    # the same proposals cut to one token: E[N | 1] = 1.5, verify(1)
    assert cost.throughput_mixture(lengths, acc, lambda g: 0.001 if g else 0.0, t_verify, cap=1) == pytest.approx(
        (1 + 1.5) / (0.010 + 0.012)
    )


def test_predict_rounds_prices_each_proposer_with_its_own_draft_time():
    rounds = (
        [{"drafted": 2, "accepted": 2, "emitted": 3, "source": "lookup", "draft_s": 0.001}] * 2
        + [{"drafted": 1, "accepted": 0, "emitted": 1, "source": "model", "draft_s": 0.004}] * 2
        + [{"drafted": 0, "accepted": 0, "emitted": 1, "source": "", "draft_s": 0.0}] * 2
    )
    t_verify = lambda g: 0.010 + 0.001 * g  # noqa: E731
    # lookup: 3 tokens per 13 ms; model (3 ms a step from the profile): 1 token per 14 ms; none: 1 token per 10 ms;
    # the first model round catches up on the lookups' 6 tokens: 0.1 of a step each (`catch_up_s`)
    assert cost.predict_rounds(rounds, t_verify, t_model_step=0.003) == pytest.approx(
        10 / (2 * (0.013 + 0.014 + 0.010) + 6 * 0.1 * 0.003)
    )
    # without a profiled step the measured one (4 ms) prices the model rounds
    assert cost.predict_rounds(rounds, t_verify) == pytest.approx(10 / (2 * (0.013 + 0.015 + 0.010) + 6 * 0.1 * 0.004))


def test_a_hybrids_model_pays_to_catch_up_on_what_the_lookup_emitted_since_its_last_round():
    """Per model round: the tokens the lookup rounds before it emitted (since the model's last round, within one
    prompt), each at the target's marginal cost a token over a 4-token pass relative to its step, times the model's
    step; nothing for a model drafter alone or a lookup alone."""
    t_verify = lambda g: 0.010 * (1 + 0.3 * g)  # noqa: E731  (0.3 of a step a token)

    def r(source, emitted, prompt="a"):
        return {"drafted": 1, "accepted": emitted - 1, "emitted": emitted, "source": source, "prompt_id": prompt}

    step = 0.004
    rounds = [r("ngram", 3), r("ngram", 2), r("model", 1), r("model", 2), r("ngram", 4), r("model", 1)]
    assert cost.catch_up_s(rounds, t_verify, step) == pytest.approx((5 + 4) * 0.3 * step)
    # a new prompt: the model was prefilled with it, so the previous prompt's lookup tokens are not owed
    assert cost.catch_up_s([r("ngram", 3), r("model", 1, "b")], t_verify, step) == 0
    assert cost.catch_up_s([r("model", 2)] * 3, t_verify, step) == 0
    assert cost.catch_up_s([r("ngram", 2)] * 3, t_verify, step) == 0


def test_budget_shapes_of_a_target_whose_width_is_not_its_attention_width():
    """Gemma-3-270M: width 640 beside 4 heads × 256 (one KV head): shapes keep the width-to-heads ratio, so the only
    head layout is the target's own and the FFN absorbs the budget."""
    from draftwise.design.candidates import budget_shapes

    gemma = Shape(
        layers=18, hidden=640, heads=4, kv_heads=1, head_dim=256, ffn=2048, vocab=262144, norms=4, qk_norm=True
    )
    shapes = budget_shapes(gemma, 2 * gemma.layer_params())
    assert shapes and all(s.hidden == 640 and s.heads == 4 and s.ffn <= 2048 for s in shapes)
    assert shapes[0].layers == 2 and shapes[0].ffn == 2048


def test_predicted_speedup_is_one_at_the_break_even_alpha_and_grows_with_alpha():
    lengths, t_draft, t_verify = {3: 8, 0: 2}, lambda g: 0.1 * g, lambda g: 1.0 + 0.05 * g
    alpha = cost.break_even_alpha(lengths, t_draft, t_verify)
    assert cost.speedup_at(lengths, t_draft, t_verify, alpha) == pytest.approx(1.0, abs=1e-9)
    at = [cost.speedup_at(lengths, t_draft, t_verify, a) for a in (0.3, 0.5, 0.7, 1.0)]
    assert at == sorted(at) and at[0] < 1 < at[-1]
    # α = 1: every round of 3 emits 4 tokens for 0.3 + 1.15 steps, a round of none 1 token for 1 step
    assert at[-1] == pytest.approx((8 * 4 + 2) / (8 * 1.45 + 2))
    assert cost.alpha_for_speedup(lengths, t_draft, t_verify, at[1]) == pytest.approx(0.5, abs=1e-9)


def test_a_drafter_step_is_priced_on_the_verify_curves_footing():
    """The AR step and a drafter's step are timed at different moments: the step is priced as its ratio to the
    target step timed beside it (c) times the entry's AR step, as verify passes are, not at its own milliseconds."""
    from draftwise.cost import drafter_step_ms

    entry = {"ar_step_ms": 60.0, "drafters": {"d": {"step_ms": 10.0, "catch_up_ms": 12.0, "c": 0.3}}}
    step, catch_up = drafter_step_ms(entry, "d")
    assert step == pytest.approx(18.0) and catch_up == pytest.approx(21.6)  # the host ran faster when d was timed
    entry["drafters"]["d"] = {"step_ms": 10.0, "c": 10.0 / 60.0}
    assert drafter_step_ms(entry, "d") == pytest.approx((10.0, 10.0))  # the same moment: its own milliseconds
