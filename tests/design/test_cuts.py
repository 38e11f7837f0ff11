"""Shapes cut from a q4-studied target's sibling: which study cuts, the wide/deep pair at equal parameters, the price
before training, the stages' configs."""

from __future__ import annotations

from dataclasses import replace

import pytest

from draftwise import cost
from draftwise.config import DesignConfig
from draftwise.design import build, costs, cuts
from draftwise.design.candidates import Candidate
from draftwise.design.costs import Outline
from draftwise.design.sizes import CUT_TEACHER_TOKENS, nominal
from draftwise.shapes import Shape

QWEN_05B = Shape(layers=24, hidden=896, heads=14, kv_heads=2, head_dim=64, ffn=4864, vocab=151936, tied=True)
QWEN_15B = Shape(layers=28, hidden=1536, heads=12, kv_heads=2, head_dim=128, ffn=8960, vocab=151936, tied=True)


@pytest.mark.parametrize(
    "target, dtype, expected",
    [
        ("qwen2.5-coder-1.5b", "q4", "qwen2.5-coder-0.5b"),  # a named target with a sibling, not trainable here
        ("qwen2.5-coder-1.5b", "int8", "qwen2.5-coder-0.5b"),
        ("qwen2.5-coder-1.5b", "fp32", None),  # the target itself trains: its own shapes are cut
        ("qwen2.5-coder-0.5b", "q4", None),  # no smaller sibling
        ("default", "q4", None),
    ],
)
def test_only_a_study_that_cannot_train_its_target_cuts_its_sibling(target, dtype, expected):
    assert cuts.source(DesignConfig(target=target, dtype=dtype)) == expected


def test_the_wide_cut_and_its_deep_narrow_twin_hold_equal_parameters():
    wide, narrow = cuts.candidates(QWEN_05B, "qwen2.5-coder-0.5b", 3)
    assert (wide.role, narrow.role) == ("wide-shallow", "deep-narrow")
    assert wide.shape.layers == 8 and wide.shape.hidden == 896  # a third of the layers, width kept
    assert narrow.shape.layers == 24 and narrow.shape.ffn < QWEN_05B.ffn  # every layer, narrower
    n_wide, n_narrow = (x.shape.params()["non_embedding"] for x in (wide, narrow))
    assert abs(n_wide - n_narrow) / n_wide < 0.01
    assert wide.trained and wide.source == narrow.source == "qwen2.5-coder-0.5b"
    assert [x.name for x in cuts.candidates(QWEN_05B, "s", 3, control=False)] == ["cut-wide-L8"]


def test_a_cut_is_priced_by_the_weights_it_reads_a_step_with_its_reduced_head():
    wide = cuts.candidates(QWEN_05B, "s", 3)[0].shape
    c = cuts.predicted_c(wide, QWEN_15B)
    layers = 8 * QWEN_05B.layer_params() + 896 + cuts.CUT_VOCAB * 896
    assert c == pytest.approx(layers / (QWEN_15B.params()["non_embedding"] + 151936 * 1536))
    assert 0.05 < c < 0.2  # the goal: a draft step at most 0.2 of the target's
    assert cost.optimistic_break_even(c) == pytest.approx(c)  # a verify at one AR step: γ = 1 pays from α > c


def test_a_cut_is_pruned_from_the_sibling_and_distilled_at_fp32_toward_the_target():
    config = DesignConfig(target="qwen2.5-coder-1.5b", dtype="q4", threads=1)
    cand = cuts.candidates(QWEN_05B, "qwen2.5-coder-0.5b", 3)[0]
    prune = cuts.prune_config(config, cand, "gen", 64)
    assert (prune.target, prune.dtype, prune.data, prune.vocab_data) == ("qwen2.5-coder-0.5b", "fp32", "gen", "gen")
    assert prune.shape == "layers=8,hidden=896,heads=14,kv_heads=2,ffn=4864" and prune.draft_vocab == cuts.CUT_VOCAB
    distill = cuts.distill_config(config, "prune-cut", "teacher", "gen", 2.0, 0.1)
    assert (distill.target, distill.drafter, distill.dtype, distill.lr) == (
        "qwen2.5-coder-1.5b",
        "prune-cut",
        "fp32",
        cuts.CUT_LR,
    )
    assert distill.draft_vocab == cuts.CUT_VOCAB and distill.stop_below == 0.1
    assert (distill.data, distill.vocab_data) == (
        "teacher",
        "gen",
    )  # learns the teacher's top-k, deploys gen-data's head
    assert distill.target_dtype == "q4"  # the target as studied: no fp32 copy of it beside the training


def test_the_plan_counts_the_cuts_without_a_sweep_and_their_teacher_at_the_studied_precision():
    config = DesignConfig(target="qwen2.5-coder-1.5b", dtype="q4", minutes=60)
    outline = Outline.of(config)
    assert outline.cuts and outline.trained == 2
    assert Outline.of(DesignConfig(target="default", dtype="q4")).trained == 0
    assert nominal(config, 2).teacher_tokens == 60 * CUT_TEACHER_TOKENS  # scored at q4, not bf16's 8k a minute
    items = {i.kind: i for i in costs.items(outline, nominal(config, 2), config)}
    assert items["sweep"].count == 0 and items["teacher"].count == 1
    assert items["teacher"].steps == pytest.approx(costs.FIDELITY_STEPS + 0.35 * 60 * CUT_TEACHER_TOKENS)


def test_a_dropped_control_cut_is_priced_as_pruned_and_ranked_but_not_trained():
    """With `control` dropped, the deep-narrow cut is still pruned and given a few seconds' pilot (`prerank`): the plan
    counts two prunes and three distillations (two pilots, the first-ranked trained on) sharing one cut's minutes."""
    config = DesignConfig(target="qwen2.5-coder-1.5b", dtype="q4", minutes=60)
    outline, sizes = Outline.of(config), nominal(config, 1)

    def priced(dropped: tuple[str, ...], **known) -> dict:
        s = replace(sizes, dropped=dropped)
        return {i.kind: i for i in costs.items(replace(outline, **known), s, config)}

    ranked = priced(("control",))
    assert (
        ranked["prune"].count == 2 and ranked["distill"].count == 3 and ranked["prune"].steps == costs.CUT_PRUNE_STEPS
    )
    assert ranked["distill"].count * ranked["distill"].exact_s == pytest.approx(60 * sizes.distill_minutes)
    built = priced((), trained=1, built=True, prerank=True)  # once built, the ranking is the outline's
    assert (built["prune"].count, built["distill"].count) == (2, 3)
    piloted = priced(())  # both cuts trained: two pilots of half their minutes, then the first-ranked's other halves
    assert (piloted["prune"].count, piloted["distill"].count) == (2, 3)
    assert piloted["distill"].count * piloted["distill"].exact_s == pytest.approx(2 * 60 * sizes.distill_minutes)


def test_cuts_ranked_untrained_give_the_first_all_the_minutes_even_where_no_curve_predicts_it_pays():
    """`prerank`: the pilots are a few seconds each (no curve: each is priced at its agreement now), the first-ranked
    cut is chosen whatever its price (its stop rule decides later), and the other is passed over in later stages."""
    assert cuts.pilot_minutes(6.0, 2, prerank=True) == cuts.PRERANK_MINUTES and cuts.pilot_minutes(6.0, 1, True) == 6.0
    wide = [{"event": "eval", "step": 0, "tokens": 0, "agreement": 0.14}, {"event": "eval", "step": 2, "tokens": 900,
            "agreement": 0.15}]  # fmt: skip
    narrow = [{**r, "agreement": a} for r, a in zip(wide, (0.32, 0.33))]
    decision = cuts.focus({"cut-wide-L8": (0.15, wide), "cut-narrow-L24": (0.9, narrow)}, minutes=6, prerank=True)
    first, second = decision["ranking"]
    assert not first["curve_valid"] and first["predicted_agreement"] == first["agreement_now"]
    assert first["predicted_speedup"] <= 1.0 and decision["chosen"] == first["name"]  # dear, chosen all the same
    assert decision["prerank"] and cuts.passed_over(decision) == {second["name"]}
    piloted = cuts.focus({"cut-wide-L8": (0.15, wide), "cut-narrow-L24": (0.9, narrow)}, minutes=6)
    assert piloted["chosen"] is None and cuts.passed_over(piloted) == set() and cuts.passed_over(None) == set()


def test_a_cut_drafts_with_its_reduced_head(tmp_path):
    class P:
        done: dict = {}

        def folder(self, name):
            return tmp_path / name

    cut = Candidate("cut-wide-L8", "wide-shallow", QWEN_05B, source="qwen2.5-coder-0.5b")
    own = Candidate("wide-L2", "wide-shallow", QWEN_05B)
    assert build.spec_of(P(), cut) == str(tmp_path / "distill-cut-wide-L8" / "reduced")
    assert build.spec_of(P(), own) == str(tmp_path / "distill-wide-L2")
    P.done = {cuts.more_stage(cut.name): {}}  # the first-ranked cut, trained on from its pilot
    assert build.spec_of(P(), cut) == str(tmp_path / "distill-more-cut-wide-L8" / "reduced")


def _pilot(a_inf: float, b: float, t0: float, rate: float, steps: int = 6, per_step: int = 2000) -> list[dict]:
    """A pilot distillation's records: agreement along a(t) = a_inf − b / (t + t0), evaluated after every step of
    `per_step` tokens trained at `rate` tokens/s."""
    out = [{"event": "eval", "step": 0, "tokens": 0, "agreement": a_inf - b / t0}]
    for s in range(1, steps + 1):
        t = s * per_step
        out.append({"event": "train", "step": s, "tokens": t, "seconds": per_step / rate})
        out.append({"event": "eval", "step": s, "tokens": t, "agreement": a_inf - b / (t + t0)})
    return out


def test_the_cut_the_curve_ranks_first_is_trained_on_not_the_one_ahead_now():
    """The ranking reads each pilot's learning curve at the tokens its share of the minutes left would buy, priced by
    the cost model at the cut's step: a cut behind now but rising steeply is ranked first over one near its plateau."""
    flat = _pilot(a_inf=0.42, b=500.0, t0=2000, rate=400)  # ahead now (0.41), close to its plateau
    steep = _pilot(a_inf=0.80, b=13378.0, t0=19111, rate=300)  # behind now (0.37), rising 0.10 → 0.80
    assert flat[-1]["agreement"] > steep[-1]["agreement"]
    decision = cuts.focus({"cut-wide-L8": (0.15, flat), "cut-narrow-L24": (0.18, steep)}, minutes=10)
    first, second = decision["ranking"]
    assert decision["chosen"] == first["name"] == "cut-narrow-L24"
    assert first["curve_valid"] and first["predicted_agreement"] > second["predicted_agreement"]
    assert first["tokens_at_end"] == pytest.approx(12000 + 300 * 600, rel=1e-6)  # its own rate, all the minutes
    assert first["predicted_speedup"] == pytest.approx(
        cost.optimistic_speedup(0.18, first["predicted_agreement"]), abs=1e-3
    )
    # the same pilots with no minutes left: the curve is read where it stands, and the cut ahead now is first
    assert (
        cuts.focus({"cut-wide-L8": (0.15, flat), "cut-narrow-L24": (0.18, steep)}, minutes=0)["chosen"] == "cut-wide-L8"
    )


def test_no_cut_is_trained_on_when_even_the_first_ranked_would_not_pay():
    dear = _pilot(a_inf=0.30, b=500.0, t0=2000, rate=400)
    decision = cuts.focus({"cut-wide-L8": (0.9, dear), "cut-narrow-L24": (0.95, dear)}, minutes=10)
    assert decision["chosen"] is None and len(decision["ranking"]) == 2
    assert cuts.pilot_minutes(6.0, 2) == 3.0 and cuts.pilot_minutes(6.0, 1) == 6.0


def test_a_cuts_teacher_scores_the_text_at_the_studied_precision_beside_gen_data(tmp_path):
    """A cut learns the target as deployed: the teacher scores the train text at q4, and gen-data's shards (which hold
    that target's top-k already) are read beside it rather than scored again; a trained target keeps bf16/fp32."""

    class P:
        def __init__(self, config):
            self.config, self.sizes = config, nominal(config, 2)

        def folder(self, name):
            return tmp_path / name

    cut = build.teacher_config(P(DesignConfig(target="qwen2.5-coder-1.5b", dtype="q4", minutes=60)))
    assert (cut.precision, cut.continuations, cut.tokens) == ("q4", None, 60 * CUT_TEACHER_TOKENS)
    own = build.teacher_config(P(DesignConfig(target="default", minutes=30)))
    assert own.precision == "auto" and own.continuations == str(tmp_path / "gen-data")


def test_a_row_whose_engine_cannot_draft_with_a_reduced_head_runs_the_cuts_full_checkpoint(tmp_path):
    """A cut drafts with its reduced head on the lean engine; llama.cpp verifies over the whole vocabulary, so its row
    loads the distillation's full-vocabulary checkpoint (a design on the real pair died here when llama.cpp's row ran
    the `reduced/` folder)."""
    from draftwise.design import row_spec
    from draftwise.runtimes.registry import runtime
    from draftwise.targets import vocab_map

    reduced = tmp_path / "distill-cut-wide-L8" / "reduced"
    reduced.mkdir(parents=True)
    vocab_map.write_map(reduced, [0, 1, 2, 3, 4, 5, 6, 7], 100)
    assert row_spec(str(reduced), runtime("lean")) == str(reduced)
    assert row_spec(str(reduced), runtime("llama.cpp")) == str(reduced.parent)
    assert row_spec("qwen2.5-coder-0.5b", runtime("llama.cpp")) == "qwen2.5-coder-0.5b"


def test_competing_cuts_are_ranked_at_their_timed_step_not_their_bytes(tiny_dir, tmp_path):
    """Two cuts of equal parameters read the same bytes a step, so `predicted_c` prices them alike whatever their
    depth; where the plan probed the target's step, each cut is priced at its own draft step, timed as that probe."""
    import shutil

    from draftwise.design import cut_stages
    from draftwise.design.pipeline import Stages

    shutil.copytree(tiny_dir, tmp_path / "prune-cut-wide-L1" / "reduced")
    p = Stages(DesignConfig(target=tiny_dir, dtype="fp32"), tmp_path, {}, lambda record: None, None)
    cut_stages.time_step(p, Candidate("cut-wide-L1", "wide-shallow", QWEN_05B, source="sibling"))
    draft_ms = p.done["step-cut-wide-L1"]["draft_ms"]
    assert draft_ms > 0

    class Planned:
        done = {**p.done, "distill-cut-wide-L1": {"predicted_c": 0.0868}}
        planner = type("Planner", (), {"step_s": 2e-3 * draft_ms})()

    assert cut_stages.cut_c(Planned(), "cut-wide-L1") == pytest.approx(0.5)  # a step half the target's
    Planned.planner = None  # no probe of the target (`--no-plan`): the bytes' price
    assert cut_stages.cut_c(Planned(), "cut-wide-L1") == 0.0868
