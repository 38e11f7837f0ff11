"""The design's time budget (design/plan.py, sizes.py, costs.py): sizes, drops, refusal, and a planned run resumed after
a kill."""

import json
from dataclasses import replace

import pytest

from draftwise import design
from draftwise.config import DesignConfig
from draftwise.design import costs, plan
from draftwise.errors import DraftwiseError

STEP_S = 0.0257  # the default target's AR step on a 2-core CPU


def _total(config: DesignConfig, outline: costs.Outline, step_s: float = STEP_S):
    def total(s: plan.Sizes) -> float:
        return sum(i.count * (i.steps * step_s + costs.STAGE_S + i.exact_s) for i in costs.items(outline, s, config))

    return total


def test_scale_keeps_floors_and_small_counts_and_grows_only_training():
    full = plan.nominal(DesignConfig(minutes=30, bench_limit=4), trained=2)
    low = plan.scale(full, 0.0, ())
    assert low.bench_limit == 4  # a count below its floor is the user's: kept
    assert low.refine_limit == plan.FLOORS["refine_limit"] and low.gen_prompts == plan.FLOORS["gen_prompts"]
    assert low.distill_minutes == plan.FLOORS["distill_minutes"]
    high = plan.scale(full, 2.0, ())
    assert high.bench_limit == 4 and high.refine_limit == full.refine_limit  # measurements stop at their full size
    assert high.gen_prompts == 2 * full.gen_prompts and high.distill_minutes == pytest.approx(2 * full.distill_minutes)


def test_plan_total_grows_with_sigma_and_shrinks_with_each_drop():
    config = DesignConfig(minutes=30, gguf_quants=("q8_0",))
    outline = replace(costs.Outline.of(config), chosen_model=True)  # reduced heads follow a chosen model drafter
    total, full = _total(config, outline), plan.nominal(config, 2)
    sigmas = [0.0, 0.25, 0.5, 1.0, 2.0]
    assert [total(plan.scale(full, s, ())) for s in sigmas] == sorted(total(plan.scale(full, s, ())) for s in sigmas)
    for i, name in enumerate(plan.DROPS):
        assert total(plan.scale(full, 0.5, plan.DROPS[: i + 1])) < total(plan.scale(full, 0.5, plan.DROPS[:i])), name


def test_a_prefill_beyond_the_reference_is_priced_wherever_prompts_are_prefilled():
    config = DesignConfig(minutes=30, rows=("lean", "lean-int8", "llama.cpp"))
    outline, sizes = costs.Outline.of(config), plan.nominal(config, 2)
    base = {i.kind: i.steps for i in costs.items(outline, sizes, config)}
    more = {i.kind: i.steps for i in costs.items(replace(outline, prefill=48.0), sizes, config)}
    grids = ("bench-select", "bench-gamma", "bench-headline", "bench-select@", "bench-select@lean", "bench-fastest")
    prefilled = (*grids, "gen-data", "continuations", "agree-lookup", "quality")
    assert all(more[k] > base[k] for k in prefilled)  # the target prefills prompts
    # an accuracy item is a pass over its context per choice: it costs what a prefill does, in proportion
    assert more["accuracy"] / base["accuracy"] == pytest.approx(1 + 48.0 / costs.REF_PREFILL_STEPS)
    assert all(more[k] == base[k] for k in ("prune", "distill", "teacher", "profile", "agree"))
    assert plan.excess_prefill({"step_ms": 10, "prefill_ms": 458}) == pytest.approx(45.8 - costs.REF_PREFILL_STEPS)
    assert plan.excess_prefill({"step_ms": 10, "prefill_ms": 20}) == 0.0 == plan.excess_prefill({"step_ms": 10})


def test_a_cuts_teacher_is_priced_at_the_token_its_probe_timed(tiny_dir, monkeypatch):
    """A sibling's cuts learn from the target as studied: its teacher token is timed on this machine (a real pass of
    the teacher's scoring), read back from the probe record on a resume, and priced per planned teacher token."""
    from types import SimpleNamespace

    from draftwise.runtimes.base import ModelOptions
    from draftwise.runtimes.registry import load
    from draftwise.stages import teacher

    target = load(tiny_dir, ModelOptions("fp32", "cpu", "lean"))
    scored = []
    real = teacher.score
    monkeypatch.setattr(teacher, "score", lambda lm, batch, k, f: scored.append(batch) or real(lm, batch, k, f))
    assert plan.probe_teacher(target, tokens=40, rows=2) > 0
    assert [[len(x.tokens) for x in b] for b in scored] == [[40, 40]] and scored[0][0] != scored[0][1]

    config = DesignConfig(minutes=30)
    outline, sizes = replace(costs.Outline.of(config), cuts=True), plan.nominal(config, 2)
    priced = plan.Planner(
        SimpleNamespace(base=config, done={}), [{"event": "probe", "step_ms": 20.0, "teacher_ms": 14.0}]
    )
    assert priced.outline.teacher == pytest.approx(0.7)
    steps = {
        o.teacher: next(i.steps for i in costs.items(o, sizes, config) if i.kind == "teacher")
        for o in (outline, replace(outline, teacher=0.7))
    }
    assert steps[0.7] - steps[0.0] == pytest.approx((0.7 - costs.TEACHER_STEPS) * sizes.teacher_tokens)
    assert sizes.teacher_tokens > 0


def test_a_lean_row_is_priced_at_its_precision_beside_the_studys():
    """A 1.7B target studied at q4: its lean-int8 row reads more bytes a step than the study (a third of an fp32
    study's step was the rule, and the row's grid ran 9.8 × its prediction)."""

    def select_at(dtype: str) -> float:
        config = DesignConfig(minutes=60, dtype=dtype, rows=("lean", "lean-int8"))
        s = plan.nominal(config, 0)
        return next(i.steps for i in costs.items(costs.Outline.of(config), s, config) if i.kind == "bench-select@lean")

    assert costs.lean_share("int8", "fp32") == costs.LEAN_FLOOR and costs.lean_share("int8", "q4") > 1.3
    assert select_at("q4") > 3 * select_at("fp32")


def test_solve_drops_only_what_it_must_and_fills_the_budget():
    config = DesignConfig(minutes=30)
    total, full = _total(config, costs.Outline.of(config)), plan.nominal(config, 2)
    roomy = plan.solve(total, full, 600 * 60)
    assert roomy.dropped == () and roomy.sigma == plan.SIGMA_MAX  # more time than even σ max needs
    for minutes in (8, 16, 30):
        s = plan.solve(total, full, minutes * 60)
        assert s is not None and total(s) <= minutes * 60
        assert total(s) >= 0.9 * minutes * 60  # it fills the budget: within 10 % below
        assert set(s.dropped) <= set(plan.DROPS)
        for name in s.dropped:  # each drop was needed: with it back in, σ = SIGMA_KEEP would not fit
            kept = tuple(x for x in s.dropped if x != name)
            assert total(plan.scale(full, plan.SIGMA_KEEP, kept)) > minutes * 60 or s.sigma < plan.SIGMA_KEEP, name
    assert plan.solve(total, full, 60) is None  # one minute: not even the floors


def test_kind_of_names_every_stage_a_design_writes():
    for name, kind in {
        "sweep": "sweep",
        "gen-data-more": "gen-data-more",
        "prune-wide-L2": "prune",
        "distill-narrow-L8": "distill",
        "continuations": "continuations",
        "agree-self-spec": "agree",
        "agree-lookup": "agree-lookup",
        "corpus-gain": "tune",
        "calibrate-lookup": "calibrate",
        "bench-select-repeat-2": "bench-select-repeat",
        "bench-wide-L2-batch": "bench-batch",
        "profile@llama.cpp-Q4_1": "profile@",
        "bench-select@llama.cpp-F32": "bench-select@",
        "bench-vocab": "reduced-heads",
        "select-drafter": None,
        "verdict@llama.cpp-Q8_0": None,
        "max-batch-wide-L2": None,
    }.items():
        assert costs.kind_of(name) == kind, name


def _config(tiny_dir, minutes: float) -> DesignConfig:
    return DesignConfig(
        target=tiny_dir,
        minutes=minutes,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=3,
        refine_limit=2,
        headline_limit=2,
        tune_prompts=6,
        max_new_tokens=8,
        accuracy_items=3,
        rows=("lean",),
        serve=False,  # no server process in the fast tier (the slow end-to-end design measures through one)
        threads=1,
    )


def test_a_budget_too_small_is_refused_before_any_stage_with_the_smallest_that_fits(tiny_dir, tmp_path):
    out = tmp_path / "design"
    with pytest.raises(DraftwiseError, match=r"--minutes 0.01 is too small .* use --minutes [0-9.]+ or more"):
        design.run(_config(tiny_dir, 0.01), out)
    assert not (out / "stages").exists()
    assert [r["event"] for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())] == ["probe"]


def test_a_planned_design_killed_and_resumed_reuses_its_plans(tiny_dir, tmp_path, monkeypatch):
    """A probe step ~30× this machine's makes the start plan drop stages; the run is killed in the selection grid and
    rerun: no phase is planned twice, the dropped stages never run, and the report names them."""
    step = 0.02
    monkeypatch.setattr(plan, "probe", lambda target: step)
    config = _config(tiny_dir, 1.0)
    total, full = _total(config, costs.Outline.of(config), step), plan.nominal(config, 2)
    lo, hi = total(plan.scale(full, 0.0, plan.DROPS)), total(full)
    config = _config(tiny_dir, round((lo + (hi - lo) / 3) / 60, 2))  # between the floors and the full sizes
    out = tmp_path / "design"
    grid_run = design.measure.bench_grid.run

    def killed(grid, folder, *a, **k):
        if folder.name == "bench-select":
            raise RuntimeError("killed")
        return grid_run(grid, folder, *a, **k)

    monkeypatch.setattr(design.measure.bench_grid, "run", killed)
    with pytest.raises(RuntimeError, match="killed"):
        design.run(config, out)
    monkeypatch.setattr(design.measure.bench_grid, "run", grid_run)
    before = [r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines()) if r["event"] == "plan"]
    design.run(config, out)
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    plans = [r for r in records if r["event"] == "plan"]
    assert [r["phase"] for r in plans] == list(dict.fromkeys(r["phase"] for r in plans))  # each phase planned once
    assert plans[: len(before)] == before and {"start", "select", "accuracy"} <= {r["phase"] for r in plans}
    dropped = set(plans[0]["sizes"]["dropped"])
    assert dropped, "the start plan left nothing out"
    stages = {r["stage"] for r in records if r["event"] == "done"}
    assert not ("headline" in dropped and "bench-headline" in stages)
    assert not ("accuracy" in dropped and "accuracy" in stages)
    assert not ("training" in dropped and any(s.startswith("distill-") for s in stages))
    done = [r for r in records if r["event"] == "done" and r.get("kind")]
    assert all(r["seconds"] >= 0 and r["elapsed_s"] > 0 for r in done)
    bench = json.loads((out / "stages" / "bench-select" / "config.json").read_text())
    select = next(r for r in plans if r["phase"] == "select")
    assert bench["bench"]["limit"] == select["sizes"]["bench_limit"]  # the stage ran at its phase's planned size
    report = (out / "report.md").read_text()
    assert "## Time budget" in report and "Left out by the budget: " in report and "nothing." not in report
    top = max((r for r in done if "peak_gb" in r), key=lambda r: r["peak_gb"])  # each stage's own peak memory
    assert (
        f"peaked at {top['peak_gb']:.1f} GB resident" in report and f"{top['stage']} {top['peak_gb']:.1f} GB" in report
    )
    for r in plans:  # each drop that took effect says the budget that would have kept it
        assert set(r["keep_minutes"]) == {d for d in r["sizes"]["dropped"] if plan.DECIDED.get(d) == r["phase"]}
        assert all(f"`--minutes {m:g}` would keep it" in report for m in r["keep_minutes"].values())
    sections = {s.split("\n", 1)[0]: s.split("\n", 1)[1].strip() for s in report.split("\n## ")[1:]}
    left_out = "Not measured: the time budget left it out (see *Time budget*)."
    for stage, title in (
        ("accuracy", "Accuracy sanity check: task accuracy vs TAR"),
        ("bench-headline", "Headline (spec_bench eval mix, T=0)"),
    ):
        if stage not in stages:  # a section whose stage the budget left out says so and shows nothing else
            assert sections[title] == left_out, sections[title]
    assert (out / "plots" / "time_budget.png").exists()
    served = next(r for r in records if r.get("stage") == "served")  # the answer is lean's, its measurement turned off
    assert served["applies"] and not served["measured"] and "not measured: --no-serve." in report
    assert "not measured: --no-serve." in (out / "export" / "README.md").read_text()


def test_the_served_measurement_is_priced_from_the_last_grid_and_gone_once_settled():
    """Before the last grid: about 1.5 AR steps per token and prompt; after it, the seconds per token it measured ×
    the headline prompts and a warm-up each, plus the servers' start; once settled (run or skipped), nothing."""
    config = DesignConfig(minutes=30)
    full = plan.nominal(config, 2)
    serve = lambda o: [i for i in costs.items(o, full, config) if i.kind == "bench-serve"]  # noqa: E731
    prior = costs.Outline.of(config)
    assert serve(prior)[0].steps > 1.5 * config.max_new_tokens * config.headline_limit
    measured = serve(replace(prior, serve_token_s=0.05))[0]
    tokens = config.max_new_tokens * (full.headline_limit + 1)
    assert measured.exact_s == pytest.approx(costs.SERVE_START_S + 0.05 * tokens)
    assert (
        serve(replace(prior, serve=False)) == []
        and serve(prior)
        and not [i for i in costs.items(prior, plan.scale(full, 1.0, ("serve",)), config) if i.kind == "bench-serve"]
    )
    assert costs.kind_of("bench-serve") == "bench-serve" and costs.kind_of("served") is None
    assert costs.kind_of("bench-serve@T1") == "bench-serve"  # the served figure per temperature of the traffic


def test_once_the_candidates_are_built_dropping_training_saves_nothing():
    config = DesignConfig(minutes=30)
    built = replace(costs.Outline.of(config), benched=3, built=True)
    full = plan.nominal(config, 2)
    total = _total(config, built)
    assert total(plan.scale(full, 0.5, ("training",))) == total(plan.scale(full, 0.5, ()))
    assert total(plan.scale(full, 0.5, ("control",))) == total(plan.scale(full, 0.5, ()))
    before = _total(config, costs.Outline.of(config))
    assert before(plan.scale(full, 0.5, ("training",))) < before(plan.scale(full, 0.5, ()))


def test_each_stage_is_priced_with_the_targets_load_the_probe_timed():
    """A stage loads its target afresh (from its pack at int8 and q4: `models.packed`): the probe's load time is
    priced once per stage still to run."""
    from types import SimpleNamespace

    config = DesignConfig(minutes=30)
    p = SimpleNamespace(base=config, done={})
    probe = {"event": "probe", "step_ms": 20.0}
    plain, loading = plan.Planner(p, [probe]), plan.Planner(p, [{**probe, "load_ms": 3000.0}])
    sizes = plan.nominal(config, 2)
    stages = sum(i.count for i in plain.remaining(sizes))
    assert stages > 10
    assert loading.predicted_s(sizes, {}) - plain.predicted_s(sizes, {}) == pytest.approx(3.0 * stages)


def test_the_probe_decodes_for_its_minimum_time_so_one_slow_stretch_does_not_set_the_step(monkeypatch):
    """Three generations, one of them caught in a slow stretch of a shared host, gave a median the stretch could move;
    the probe goes on until it has decoded `min_s` seconds (6 generations here) and takes their median."""
    from types import SimpleNamespace

    steps = iter([0.2, 0.06, 0.08, 0.08, 0.05, 0.05, 0.05, 0.05, 0.05])  # the first is the warm-up
    calls = []

    def generate(lm, prompt, params, tokens, gen):
        calls.append(tokens)
        return SimpleNamespace(seconds=0.5 + next(steps) * tokens, prefill_s=0.5, tokens=[0] * tokens)

    monkeypatch.setattr(plan, "generate", generate)
    target = SimpleNamespace(lm=None)
    assert plan.probe(target, tokens=24, min_s=8.0) == pytest.approx(0.06)  # 3 generations alone: 0.08
    assert len(calls) == 7
    calls.clear()
    steps = iter([1e-4] * 20)  # a tiny target: at most PROBE_MAX generations however short
    assert plan.probe(target, tokens=24, min_s=8.0) == pytest.approx(1e-4)
    assert len(calls) == plan.PROBE_MAX + 1


def test_a_stage_the_budget_leaves_out_comes_with_the_minutes_that_would_keep_it(capsys):
    """Training dropped where its phase decides it (`DECIDED`): the plan record and the console say the --minutes at
    which the same plan keeps it, and a plan at that budget does."""
    from types import SimpleNamespace

    def planner(minutes: float) -> plan.Planner:
        p = SimpleNamespace(base=DesignConfig(minutes=minutes), done={}, dir=SimpleNamespace(append=lambda r: None))
        return plan.Planner(p, [{"event": "probe", "step_ms": 1e3 * STEP_S}])

    probe = planner(30)
    full = plan.nominal(probe.p.base, probe.outline.trained)
    others = tuple(d for d in plan.DROPS if d != "training")
    low = probe.predicted_s(plan.scale(full, 0.0, plan.DROPS), {})
    high = probe.predicted_s(plan.scale(full, plan.SIGMA_KEEP, others), {})
    minutes = round((low + high) / 2 / 60, 2)  # the floors fit, training at σ = SIGMA_KEEP does not
    short = planner(minutes)
    assert "training" in short.plan("build").dropped
    keep = short.plans["build"]["keep_minutes"]
    assert keep["training"] > minutes
    assert f"--minutes {keep['training']:g} would keep it" in capsys.readouterr().err
    kept = planner(keep["training"])
    assert "training" not in kept.plan("build").dropped and "training" not in kept.plans["build"]["keep_minutes"]
    assert "training" in planner(keep["training"] - 0.5).plan("build").dropped  # the least such budget


def _teacher_after(overrun: float) -> tuple[int, int]:
    """The teacher's tokens in the build plan and in the teacher's own (after a gen-data that took `overrun` × its
    prediction), for the default target at 50 ms a step in 60 minutes (the build plan at σ = 0.5)."""
    from types import SimpleNamespace

    from draftwise.design import requests

    config, step_ms = DesignConfig(minutes=60), 50.0
    p = SimpleNamespace(base=config, done={}, dir=SimpleNamespace(append=lambda r: None))
    planner = plan.Planner(p, [{"event": "probe", "step_ms": step_ms}])
    planner.know(**requests.outline(config))
    planner.know(trained=2, untrained=1, features=0, benched=2, built=True)
    built = planner.plan("build")
    steps = next(i.steps for i in costs.items(planner.outline, built, config) if i.kind == "gen-data")
    seconds = overrun * steps * step_ms / 1e3
    p.done["gen-data"] = {"kind": "gen-data", "predicted_steps": steps, "predicted_exact_s": 0.0, "seconds": seconds}
    planner.before = seconds  # the clock moved on by gen-data's time
    return built.teacher_tokens, planner.plan("teacher").teacher_tokens


def test_a_gen_data_that_overran_shrinks_the_teacher_planned_after_it():
    """`build` plans the teacher's phase between gen-data and the teacher: a gen-data twice as slow as predicted (a
    host slower than its probe) leaves the teacher fewer tokens, so it does not eat the distillation's minutes (a
    Zen 3 design: the teacher at its build-plan size, then 0.9 minutes of distillation); one on time leaves them."""
    from types import SimpleNamespace

    from draftwise.design import build

    before, after = _teacher_after(2.0)
    assert after < before
    before, after = _teacher_after(1.0)
    assert after == before
    events = []

    class Stop(Exception):
        pass

    def stage(name, work):
        events.append(name)
        if name == "teacher":
            raise Stop

    def replan(phase, **outline):
        events.append(f"plan {phase}")

    p = SimpleNamespace(config=DesignConfig(), stage=stage, replan=replan, done={})
    with pytest.raises(Stop):
        build.build(p, [SimpleNamespace(trained=True, role="shape")])
    assert events == ["gen-data", "plan teacher", "teacher"]
    events.clear()
    p.done = {"teacher": {}}  # resumed after the teacher: its plan is not made again
    with pytest.raises(Stop):
        build.build(p, [SimpleNamespace(trained=True, role="shape")])
    assert events == ["gen-data", "teacher"]
