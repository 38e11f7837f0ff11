"""`design` end to end on a tiny random target, a kill and a resume, and the candidate shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftwise import cost
from draftwise.config import DesignConfig, drafter_kind
from draftwise.errors import DraftwiseError
from draftwise.stages import design
from draftwise.stages.design.candidates import (
    Candidate,
    candidates,
    narrow_twin,
    self_speculative_layers,
)

SMOL = cost.Shape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)


def test_narrow_twin_has_the_wide_drafters_parameters():
    wide = cost.Shape(2, 576, 9, 3, 64, 1536, 49152)
    narrow = narrow_twin(SMOL, 2, 3)
    assert (narrow.layers, narrow.heads, narrow.kv_heads, narrow.ffn) == (6, 3, 1, 512)
    ratio = narrow.params()["non_embedding"] / wide.params()["non_embedding"]
    assert abs(ratio - 1) < 0.01


def test_narrow_twin_narrows_the_ffn_when_kv_heads_do_not_split():
    narrow = narrow_twin(SMOL, 2, 2)  # 3 KV heads cannot be halved
    wide = cost.Shape(2, 576, 9, 3, 64, 1536, 49152)
    assert (narrow.layers, narrow.heads, narrow.kv_heads) == (4, 9, 3) and narrow.ffn < 1536
    assert abs(narrow.params()["non_embedding"] / wide.params()["non_embedding"] - 1) < 0.01
    assert narrow_twin(SMOL, 16, 2) is None  # deeper than the target


def test_candidates_cover_roles_and_baselines():
    cands = candidates(SMOL, (2,), 3, user="some/dir")
    assert [c.role for c in cands] == ["wide-shallow", "deep-narrow", "first-k", "self-speculative", "user"]
    assert cands[0].prune_shape() == "layers=2,hidden=576,heads=9,kv_heads=3,ffn=1536"
    assert cands[2].spec == "layers:0,1"
    assert self_speculative_layers(30) == list(range(8)) + list(range(22, 30))


def test_bad_design_config_is_refused():
    with pytest.raises(DraftwiseError, match="temperatures"):
        DesignConfig(temperatures=(0.5,))
    with pytest.raises(DraftwiseError, match="narrow_factor"):
        DesignConfig(narrow_factor=1)
    with pytest.raises(DraftwiseError, match="batch_cap"):
        DesignConfig(batch_cap=0)
    with pytest.raises(DraftwiseError, match="not a count"):
        DesignConfig(memory="lots")


def _shape(path) -> cost.Shape:
    from transformers import AutoConfig

    return cost.Shape.of(AutoConfig.from_pretrained(path, local_files_only=True))


def _expected_max_batch(memory: int, target: cost.Shape, drafter: cost.Shape, context: int) -> int:
    """The footprint with SD on, from the shapes' own byte counts (fp32): weights of both, then KV per sequence."""
    free = memory - target.weight_bytes(4) - drafter.weight_bytes(4)
    return max(0, free // (target.kv_bytes(context, 1, 4) + drafter.kv_bytes(context, 1, 4)))


def test_batch_dividend_skips_the_bench_when_not_even_one_sequence_fits(tiny_dir, tiny_drafter_dir, tmp_path,
                                                                       monkeypatch):
    target, drafter = _shape(tiny_dir), _shape(tiny_drafter_dir)
    memory = target.weight_bytes(4) + drafter.weight_bytes(4) - 1  # the weights alone do not fit
    p = design.Pipeline(DesignConfig(target=tiny_dir, memory=str(memory), context=64), tmp_path / "design")
    monkeypatch.setattr(design.bench, "run", lambda *a, **k: pytest.fail("benchmarked a batch that does not fit"))
    cands = [Candidate("wide-L1", "wide-shallow", drafter)]
    design.batch_dividend(p, target, {"wide-L1": tiny_drafter_dir}, cands)
    record = p.done["max-batch-wide-L1"]
    assert record["max_batch"] == 0 == record["batch"] and "bench-wide-L1-batch" not in p.done
    assert record["kv_bytes_per_seq_target"] == target.kv_bytes(64)
    assert record["kv_bytes_per_seq_drafter"] == drafter.kv_bytes(64)
    from draftwise.report import design as report

    doc = report.Doc()
    report._batch_dividend(doc, p, cands)
    assert "Batch dividend" in doc.markdown(tmp_path) and "does not fit" in doc.markdown(tmp_path)


def test_design_end_to_end_killed_and_resumed(tiny_dir, tmp_path, monkeypatch):
    target = _shape(tiny_dir)
    trained = [c.shape for c in candidates(target, (1,), 2) if c.trained]
    context = 64
    per_seq = max(target.kv_bytes(context) + s.kv_bytes(context) for s in trained)
    memory = target.weight_bytes() + max(s.weight_bytes() for s in trained) + 3 * per_seq  # ≥ 3 sequences fit
    config = DesignConfig(target=tiny_dir, minutes=0.3, wide_layers=(1,), narrow_factor=2, bench_limit=3, refine_limit=2,
                          headline_limit=2, tune_prompts=6, max_new_tokens=8, accuracy_items=3, draft_vocabs=(32, 16),
                          memory=str(memory), context=context, batch_cap=2, threads=1)
    out = tmp_path / "design"

    agree_run = design.agree.run

    def killed(agree_config, folder):  # the second candidate's item dies after its prune and distill finished
        if "narrow" in agree_config.drafter:
            raise RuntimeError("killed")
        return agree_run(agree_config, folder)

    monkeypatch.setattr(design.agree, "run", killed)
    with pytest.raises(RuntimeError, match="killed"):
        design.run(config, out)
    monkeypatch.undo()
    appended = [json.loads(line)["stage"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert "agree-wide-L1" in appended and "distill-narrow-L2" not in appended  # its item never returned ...
    finished = set(design.Pipeline(config, out).done)  # ... but its finished stages are found in their folders
    assert {"gen-data", "prune-wide-L1", "distill-wide-L1", "agree-wide-L1", "prune-narrow-L2", "distill-narrow-L2"} <= finished

    calls = []
    for stage in (design.gen_data, design.prune, design.distill):
        original = stage.run
        monkeypatch.setattr(stage, "run", lambda c, f, *a, _o=original, **k: (calls.append(Path(f).name), _o(c, f, *a, **k))[1])
    design.run(config, out)
    assert not set(calls) & finished  # nothing finished before the kill was redone

    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    stages = [r["stage"] for r in records]
    assert len(stages) == len(set(stages))
    decision = next(r for r in records if r["stage"] == "select-drafter")
    chosen = decision["drafter"]
    assert set(decision["speedup_vs_ar"]) >= {"wide-L1", "narrow-L2", "ngram", "suffix", "hybrid"}  # all measured alike
    assert chosen == design.pick_drafter(decision["speedup_vs_ar"], decision["tar"], config.select_tie)
    report = (out / "report.md").read_text()
    for section in ("Headline", "TAR and speedup per task", "The chosen drafter per task and temperature", "Model drafters",
                    "Lookup drafters", "The suffix corpus", "Wide-shallow vs deep-narrow", "Batch dividend",
                    "Where the time goes", "Accuracy sanity check", "Export"):
        assert section in report
    assert "Capped at batch_cap = 2" in report
    for name in ("wide-L1", "narrow-L2"):  # the batch each trained candidate's SD footprint allows, then benchmarked
        decision = next(r for r in records if r["stage"] == f"max-batch-{name}")
        drafter = _shape(out / "stages" / f"distill-{name}" / "checkpoint")
        assert decision["max_batch"] == _expected_max_batch(memory, target, drafter, context) >= 3
        assert decision["batch"] == min(decision["max_batch"], config.batch_cap) == 2
        bench_folder = out / "stages" / f"bench-{name}-batch"
        batched = [json.loads(line) for line in (bench_folder / "records.jsonl").read_text().splitlines()]
        assert {r["method"] for r in batched} == {"sd", "ar"} and {r["batch"] for r in batched} == {2}
        assert json.loads((bench_folder / "config.json").read_text())["batch_size"] == 2
        summary = json.loads((bench_folder / "summary.json").read_text())["methods"]
        assert summary["sd"]["tokens_per_s"] > 0 and summary["ar"]["tokens_per_s"] > 0
    for png in ("tar_per_task", "speedup_per_task", "tokens_per_s", "predicted_vs_measured", "kv_footprint",
                "accuracy_vs_tar", "verify_vs_gamma", "step_vs_layers", "latency_vs_width"):
        assert (out / "plots" / f"{png}.png").exists()
    assert "data:image/png;base64," in (out / "report.html").read_text()
    headline = json.loads((out / "stages" / "bench-headline" / "summary.json").read_text())
    assert headline["methods"]["sd"]["identical_to_ar"] == 1.0  # greedy SD stays lossless inside the pipeline
    vllm = json.loads((out / "export" / "vllm_speculative_config.json").read_text())
    gamma = next(r["gamma"] for r in records if r["stage"] == "select-gamma")
    kind = drafter_kind(decision_spec(records, chosen))
    if kind == "lookup":  # no weights: the vLLM method and the transformers call, no checkpoint, no head tuning
        assert vllm["method"] in ("ngram", "suffix") and vllm["num_speculative_tokens"] == gamma
        assert not (out / "export" / "drafter").exists() and "select-vocab" not in stages
        assert "prompt_lookup_num_tokens" in (out / "export" / "README.md").read_text()
    else:
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(out / "export" / "drafter")
        if kind == "model":
            assert {"select-vocab", "bench-adaptive"} <= set(stages) and vllm["num_speculative_tokens"] == gamma


def decision_spec(records: list[dict], name: str) -> str:
    return next(r for r in records if r["stage"] == "bench-select")["drafters"][name]


def test_pick_drafter_breaks_near_ties_by_tar():
    speeds = {"first-2": 20.83, "wide-L2": 20.42, "narrow-L6": 19.35, "self-spec": 15.53}
    tars = {"first-2": 1.04, "wide-L2": 1.16, "narrow-L6": 1.14, "self-spec": 1.10}
    assert design.pick_drafter(speeds, tars, 0.05) == "wide-L2"  # 2 % slower, TAR 1.16 vs 1.04: noise, not cost
    assert design.pick_drafter(speeds, tars, 0.0) == "first-2"  # no tie band: the fastest
    assert design.pick_drafter({**speeds, "first-2": 25.0}, tars, 0.05) == "first-2"  # clearly faster wins


def test_within_noise_the_drafter_with_fewer_moving_parts_wins():
    """A design run measured suffix 1.20x and its hybrid with a model drafter 1.17x (TAR 1.45 vs 1.47): within the tie
    band the lookup wins — no weights to ship — whatever a TAR difference that small says."""
    speeds, tars = {"suffix": 1.20, "hybrid": 1.17, "wide-L2": 0.85}, {"suffix": 1.45, "hybrid": 1.47, "wide-L2": 1.16}
    kinds = {"suffix": "lookup", "hybrid": "hybrid", "wide-L2": "model"}
    assert design.pick_drafter(speeds, tars, 0.05, kinds) == "suffix"
    assert design.pick_drafter({**speeds, "hybrid": 1.30}, tars, 0.05, kinds) == "hybrid"  # clearly faster: the hybrid
    assert design.pick_drafter({"a": 1.0, "b": 0.99}, {"a": 1.1, "b": 1.3}, 0.05, {"a": "model", "b": "model"}) == "b"


def test_batched_bench_runs_at_the_gamma_predicted_for_its_batch(tiny_dir, tmp_path):
    """The profile covers each trained candidate's feasible batch, and the batched bench uses γ* predicted there."""
    target = _shape(tiny_dir)
    config = DesignConfig(target=tiny_dir, minutes=0.2, wide_layers=(1,), narrow_factor=2, bench_limit=2, refine_limit=2,
                          headline_limit=2, max_new_tokens=6, accuracy_items=2, draft_vocabs=(32,), adaptive=True,
                          context=32, batch_cap=3, lookups=False,
                          memory=str(10 * target.weight_bytes() + 100 * target.kv_bytes(32)), threads=1)
    out = design.run(config, tmp_path / "d")
    p = design.Pipeline(config, out)
    profiled = json.loads((out / "stages" / "profile" / "profile.json").read_text())["batches"]
    assert set(profiled) == {"1", "3"}
    for name in ("wide-L1", "narrow-L2"):
        pred = design.predicted(p, design.spec_of(p, next(c for c in candidates(target, (1,), 2) if c.name == name)), name, 3)
        assert pred and p.done[f"bench-{name}-batch"]["gamma"] == max(pred, key=pred.get)
    # model drafters only: no lookup stages; the chosen model drafter's reduced heads and adaptive lookahead were tried
    assert not {"agree-lookup", "tune-lookup", "suffix-index"} & set(p.done)
    assert {"vocab-32", "bench-vocab-32", "select-vocab", "bench-adaptive"} <= set(p.done)
    assert "Reduced-vocabulary draft head and adaptive lookahead" in (out / "report.md").read_text()
    if p.done["select-vocab"]["vocab"]:
        assert (out / "export" / "drafter-reduced-vocab" / "draft_vocab.json").exists()


def fake_grid(speedups: dict[str, float]):
    """A `bench_grid.run` that writes the grid.json a measurement would, with these SD / AR ratios per drafter spec
    (the γ-neighbour grid: the first spec's ratio, higher at larger γ)."""
    def run(grid, folder, executor=None):
        folder.mkdir(parents=True, exist_ok=True)
        points = [{"drafter": x.drafter, "gamma": x.gamma, "temperature": x.temperature, "tar": 1.0 + speedups[x.drafter],
                   "speedup_vs_ar": speedups[x.drafter] + 0.01 * x.gamma, "tokens_per_s": 30 * speedups[x.drafter]}
                  for x in grid.points() if x.drafter]
        (folder / "grid.json").write_text(json.dumps({"points": points}))
        return folder

    return run


@pytest.mark.parametrize("lookup_speedup,chosen", [(1.3, "ngram"), (0.9, "wide-L1")])
def test_design_picks_a_lookup_drafter_when_it_measures_faster(tiny_dir, tmp_path, monkeypatch, lookup_speedup, chosen):
    from draftwise.stages.design import measure

    specs = {"wide-L1": "runs/distill-wide-L1", "narrow-L2": "runs/distill-narrow-L2", "ngram": "ngram:max=4"}
    monkeypatch.setattr(measure.bench_grid, "run", fake_grid({specs["wide-L1"]: 1.0, specs["narrow-L2"]: 0.95,
                                                               specs["ngram"]: lookup_speedup}))
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    name, gamma = measure.select(p, specs, {"wide-L1": 2, "narrow-L2": 1, "ngram": 4})
    assert name == chosen and p.done["select-drafter"]["speedup_vs_ar"]["ngram"] == pytest.approx(lookup_speedup + 0.04)
    g0 = {"wide-L1": 2, "ngram": 4}[chosen]
    assert gamma == g0 + 1 and p.done["select-gamma"]["speedup_vs_ar"].keys() == {g0 - 1, g0, g0 + 1}


def test_a_lookup_export_holds_no_machine_paths(tiny_dir, tmp_path):
    from draftwise.stages.design import export

    index = tmp_path / "d" / "stages" / "suffix-index"
    index.mkdir(parents=True)
    (index / "suffix_corpus.safetensors").write_bytes(b"x")
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    assert export.export(p, None, f"suffix:{index},factor=2,min_prob=0.3", "suffix", 6) is None
    out = tmp_path / "d" / "export"
    vllm = json.loads((out / "vllm_speculative_config.json").read_text())
    assert vllm == {"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 32,
                    "suffix_decoding_max_spec_factor": 2.0, "suffix_decoding_min_token_prob": 0.3}
    readme = (out / "README.md").read_text()
    assert str(tmp_path) not in readme and "suffix:suffix-corpus,factor=2,min_prob=0.3" in readme
    assert (out / "suffix-corpus" / "suffix_corpus.safetensors").exists()
    assert export.vllm_lookup("ngram:min=2,max=5", 3) == {"method": "ngram", "num_speculative_tokens": 3,
                                                          "prompt_lookup_min": 2, "prompt_lookup_max": 5}


def test_tuned_lookup_settings_are_the_best_predicted(tiny_dir, tmp_path):
    """In the end-to-end run above each method's decision is the argmax of its replayed, priced settings."""
    config = DesignConfig(target=tiny_dir, minutes=0.2, wide_layers=(1,), narrow_factor=2, bench_limit=2, refine_limit=2,
                          headline_limit=2, tune_prompts=4, max_new_tokens=6, accuracy_items=2, draft_vocabs=(),
                          adaptive=False, memory="1", threads=1)
    out = design.run(config, tmp_path / "d")
    rows = json.loads((out / "stages" / "tune-lookup" / "tune.json").read_text())["rows"]
    done = design.Pipeline(config, out).done["tune-lookup"]
    for method in ("ngram", "suffix"):
        best = max((r for r in rows if r["method"] == method), key=lambda r: r["predicted_tokens_per_s"])
        assert (done[method]["spec"], done[method]["gamma"]) == (best["spec"], best["gamma"])
    from draftwise import specs

    model, lookup, model_gamma = specs.split_hybrid(done["hybrid"]["spec"])  # the better lookup, the best model drafter
    better = max(("ngram", "suffix"), key=lambda m: done[m]["predicted_tokens_per_s"])
    assert lookup == done[better]["spec"] and done["hybrid"]["gamma"] == done[better]["gamma"]
    assert model_gamma >= 1 and "distill-" in model or model.startswith("layers:")
