"""`design` end to end on a tiny random target, a kill and a resume, and the candidate shapes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from draftwise import cost, design
from draftwise import stages as stage_modules
from draftwise.config import DesignConfig
from draftwise.design import build, cuts, estimate
from draftwise.design.candidates import (
    Candidate,
    candidates,
    family_drafter,
    narrow_twin,
    self_speculative_layers,
)
from draftwise.design.measure import held_weights
from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load, load_drafter
from draftwise.sd.families import drafter_kind
from draftwise.shapes import Shape
from draftwise.stages import agree, bench, distill, gen_data, prune  # noqa: F401  (loaded for monkeypatching)

pytestmark = pytest.mark.slow  # end-to-end designs on a tiny target: the slow tier

SMOL = Shape(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152)


def test_narrow_twin_has_the_wide_drafters_parameters():
    wide = Shape(2, 576, 9, 3, 64, 1536, 49152)
    narrow = narrow_twin(SMOL, 2, 3)
    assert (narrow.layers, narrow.heads, narrow.kv_heads, narrow.ffn) == (6, 3, 1, 512)
    ratio = narrow.params()["non_embedding"] / wide.params()["non_embedding"]
    assert abs(ratio - 1) < 0.01


def test_narrow_twin_narrows_the_ffn_when_kv_heads_do_not_split():
    narrow = narrow_twin(SMOL, 2, 2)  # 3 KV heads cannot be halved
    wide = Shape(2, 576, 9, 3, 64, 1536, 49152)
    assert (narrow.layers, narrow.heads, narrow.kv_heads) == (4, 9, 3) and narrow.ffn < 1536
    assert abs(narrow.params()["non_embedding"] / wide.params()["non_embedding"] - 1) < 0.01
    assert narrow_twin(SMOL, 16, 2) is None  # deeper than the target


def test_candidates_cover_roles_and_baselines():
    cands = candidates(SMOL, (2,), 3, user="some/dir")
    assert [c.role for c in cands] == ["wide-shallow", "deep-narrow", "first-k", "self-speculative", "user"]
    assert cands[0].prune_shape() == "layers=2,hidden=576,heads=9,kv_heads=3,ffn=1536"
    assert cands[2].spec == "layers:0,1"
    assert self_speculative_layers(30) == list(range(8)) + list(range(22, 30))


def test_the_familys_small_model_drafts_for_a_target_of_its_vocabulary_many_times_its_size():
    big = Shape(layers=24, hidden=2048, heads=32, kv_heads=32, head_dim=64, ffn=8192, vocab=49152)  # 1.7B
    assert family_drafter(big, SMOL, same_vocabulary=True)
    assert not family_drafter(big, SMOL, same_vocabulary=False) and not family_drafter(SMOL, SMOL, True)
    family = ("smollm2-135m", "default")
    assert candidates(big, (2,), 3, family=family)[-1] == Candidate("smollm2-135m", "family", spec="default")
    roles = [c.role for c in candidates(big, (2,), 3, user="default", family=family)]
    assert "family" not in roles and roles[-1] == "user"  # the user's own choice of it is not benchmarked twice


def test_bad_design_config_is_refused():
    with pytest.raises(DraftwiseError, match="temperatures"):
        DesignConfig(temperatures=(0.5,))
    with pytest.raises(DraftwiseError, match="narrow_factor"):
        DesignConfig(narrow_factor=1)
    with pytest.raises(DraftwiseError, match="batch_cap"):
        DesignConfig(batch_cap=0)
    with pytest.raises(DraftwiseError, match="select_repeats"):
        DesignConfig(select_repeats=-1)
    with pytest.raises(DraftwiseError, match="takes its candidates as they are"):
        DesignConfig(dtype="q4", wide_layers=(2,))
    with pytest.raises(DraftwiseError, match="not a count"):
        DesignConfig(memory="lots")


def test_the_memory_budget_is_this_machines_unless_given():
    from draftwise.config import SweepConfig
    from draftwise.units import memory_budget

    assert DesignConfig().memory == SweepConfig().memory == "auto"  # the design and the sweep price batches alike
    total = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
    assert abs(memory_budget("auto") - total * 1024) < 2**30  # the kernel's own count, give or take its reserve
    assert memory_budget("1GiB") == 2**30
    with pytest.raises(DraftwiseError, match="not a count"):
        SweepConfig(memory="lots")


def _shape(path) -> Shape:
    from transformers import AutoConfig

    return Shape.of(AutoConfig.from_pretrained(path, local_files_only=True))


def _expected_max_batch(memory: int, weights: int, target: Shape, drafter: Shape, context: int) -> int:
    """The footprint with SD on: the weights both models hold, then their KV per sequence (fp32)."""
    return max(0, (memory - weights) // (target.kv_bytes(context, 1, 4) + drafter.kv_bytes(context, 1, 4)))


def test_batch_dividend_skips_the_bench_when_not_even_one_sequence_fits(
    tiny_dir, tiny_drafter_dir, tmp_path, monkeypatch
):
    target, drafter = _shape(tiny_dir), _shape(tiny_drafter_dir)
    loaded = load(tiny_dir, ModelOptions(dtype="bf16"))
    held = loaded.held_bytes() + load_drafter(tiny_drafter_dir, loaded, ModelOptions(dtype="bf16")).held_bytes()
    assert held == (target.weight_bytes(4) + drafter.weight_bytes(4)) // 2  # bf16: as loaded, not fp32's bytes
    memory = held - 1  # the weights alone do not fit
    config = DesignConfig(target=tiny_dir, memory=str(memory), context=64, dtype="bf16")
    p = design.Pipeline(config, tmp_path / "design")
    monkeypatch.setattr(
        stage_modules.bench, "run", lambda *a, **k: pytest.fail("benchmarked a batch that does not fit")
    )
    cands = [Candidate("wide-L1", "wide-shallow", drafter)]
    assert held_weights(p, loaded, {"wide-L1": tiny_drafter_dir}, cands) == p.done["weights-held"]["bytes"]
    design.batch_dividend(p, target, {"wide-L1": tiny_drafter_dir}, cands)
    record = p.done["max-batch-wide-L1"]
    assert record["weight_bytes_target"] + record["weight_bytes_drafter"] == held
    assert record["max_batch"] == 0 == record["batch"] and "bench-wide-L1-batch" not in p.done
    assert record["kv_bytes_per_seq_target"] == target.kv_bytes(64, 1, 2)  # bf16 values
    assert record["kv_bytes_per_seq_drafter"] == drafter.kv_bytes(64, 1, 2)
    from draftwise.design.report import models
    from draftwise.report.doc import Doc

    doc = Doc()
    models.batch_dividend(doc, p, cands)
    assert "Batch dividend" in doc.markdown(tmp_path) and "does not fit" in doc.markdown(tmp_path)


def test_design_end_to_end_killed_and_resumed(tiny_dir, tmp_path, monkeypatch):
    target = _shape(tiny_dir)
    trained = [c.shape for c in candidates(target, (1,), 2) if c.trained]
    context = 64
    per_seq = max(target.kv_bytes(context) + s.kv_bytes(context) for s in trained)
    memory = target.weight_bytes() + max(s.weight_bytes() for s in trained) + 3 * per_seq  # ≥ 3 sequences fit
    config = DesignConfig(
        target=tiny_dir,
        minutes=0.3,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=3,
        refine_limit=2,
        headline_limit=2,
        tune_prompts=6,
        max_new_tokens=8,
        accuracy_items=3,
        draft_vocabs=(32, 16),
        memory=str(memory),
        context=context,
        batch_cap=2,
        threads=1,
    )
    out = tmp_path / "design"

    distill_run, design_load, loaded = stage_modules.distill.run, design.load, []

    def load(*a):
        loaded.append(design_load(*a))
        return loaded[-1]

    def killed(distill_config, folder, *a, **k):  # the second candidate's training item dies after its prune finished
        assert loaded[0].lm is None  # the design's own target is put down while the stages load theirs
        if "narrow" in Path(folder).name:
            raise RuntimeError("killed")
        return distill_run(distill_config, folder, *a, **k)

    monkeypatch.setattr(stage_modules.distill, "run", killed)
    monkeypatch.setattr(design, "load", load)
    with pytest.raises(RuntimeError, match="killed"):
        design.run(config, out)
    monkeypatch.undo()
    appended = [json.loads(line)["stage"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert "distill-wide-L1" in appended and "prune-narrow-L2" not in appended  # its item never returned ...
    finished = set(design.Pipeline(config, out).done)  # ... but its finished stages are found in their folders
    assert {"gen-data", "prune-wide-L1", "distill-wide-L1", "prune-narrow-L2"} <= finished
    assert "distill-narrow-L2" not in finished

    calls = []
    for stage in (stage_modules.gen_data, stage_modules.prune, stage_modules.distill):
        original = stage.run
        monkeypatch.setattr(
            stage, "run", lambda c, f, *a, _o=original, **k: (calls.append(Path(f).name), _o(c, f, *a, **k))[1]
        )
    design.run(config, out)
    assert not set(calls) & finished  # nothing finished before the kill was redone

    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    stages = [r["stage"] for r in records]
    assert len(stages) == len(set(stages))
    decision = next(r for r in records if r["stage"] == "select-drafter")
    chosen = decision["chosen"]
    assert set(decision["speedup"]) >= {"wide-L1", "narrow-L2", "ngram", "suffix", "hybrid"}  # all measured alike
    assert chosen == decision["leader"] if not decision["tie"] else chosen in decision["tie"]
    assert all(lo <= pt <= hi for pt, lo, hi in decision["speedup"].values())  # the intervals are kept
    report = (out / "report.md").read_text()
    for section in (
        "Headline",
        "TAR and speedup per task",
        "The chosen drafter per task and temperature",
        "Model drafters",
        "Lookup drafters",
        "The suffix corpus",
        "Wide-shallow vs deep-narrow",
        "Batch dividend",
        "Where the time goes",
        "Accuracy sanity check",
        "Export",
    ):
        assert section in report
    assert "Capped at batch_cap = 2" in report
    # the scheduled lookups: calibrated on the target's text, measured in their static points, decided alike
    assert {"ngram+scheduled", "suffix+scheduled"} <= set(decision["speedup"]) and "calibrate-lookup" in stages
    assert "The round scheduler" in report and (out / "plots" / "schedule_calibration.png").exists()
    select = [json.loads(line) for line in (out / "stages" / "bench-select" / "records.jsonl").read_text().splitlines()]
    scheduled = [r for r in select if r["method"] == "sd-scheduled"]
    assert {r["drafter"] for r in scheduled} == {decision_spec(records, "ngram"), decision_spec(records, "suffix")}
    ar = {r["prompt_id"]: r["tokens"] for r in select if r["method"] == "ar"}
    assert all(r["tokens"] == ar[r["prompt_id"]] for r in scheduled)  # greedy: the scheduler keeps AR's output
    for name in ("wide-L1", "narrow-L2"):  # the batch each trained candidate's SD footprint allows, then benchmarked
        decision = next(r for r in records if r["stage"] == f"max-batch-{name}")
        drafter = _shape(out / "stages" / f"distill-{name}" / "checkpoint")
        weights = decision["weight_bytes_target"] + decision["weight_bytes_drafter"]
        assert weights == target.weight_bytes(4) + drafter.weight_bytes(4)  # fp32: the loaded models hold their shapes
        assert decision["max_batch"] == _expected_max_batch(memory, weights, target, drafter, context) >= 3
        assert decision["batch"] == min(decision["max_batch"], config.batch_cap) == 2
        bench_folder = out / "stages" / f"bench-{name}-batch"
        batched = [json.loads(line) for line in (bench_folder / "records.jsonl").read_text().splitlines()]
        assert {r["method"] for r in batched} == {"sd", "ar"} and {r["batch"] for r in batched} == {2}
        assert json.loads((bench_folder / "config.json").read_text())["batch_size"] == 2
        summary = json.loads((bench_folder / "summary.json").read_text())["methods"]
        assert summary["sd"]["tokens_per_s"] > 0 and summary["ar"]["tokens_per_s"] > 0
    # one verdict per engine: the lean engine's, lean-int8's, and llama.cpp's on an f32 GGUF of the (HF-dir) target
    row = next(r for r in records if r["stage"] == "verdict@llama.cpp-F32")
    assert [r["stage"] for r in records if r["stage"].startswith("verdict@")] == [
        "verdict@lean-int8",
        "verdict@llama.cpp-F32",
    ]
    int8 = next(r for r in records if r["stage"] == "verdict@lean-int8")
    assert int8["identical"] == 1.0 and int8["builtins"] == {}  # int8 greedy SD reproduces int8 AR, bit for bit
    assert row["recommend"] == (row["speedup"][1] > 1.0) and row["quant"] == "F32" and not row["shipped"]
    assert {"llama-server", "llama-server:--spec-default"} <= set(row["builtins"])
    assert row["identical"] == 1.0  # greedy SD on llama.cpp at f32 reproduces its AR
    assert {"ngram+scheduled", "suffix+scheduled"} <= set(row["candidates"])  # priced by that engine's verify curve
    grid = [
        json.loads(line)
        for line in (out / "stages" / "bench-select@llama.cpp-F32" / "records.jsonl").read_text().splitlines()
    ]
    prompts = {r["prompt_id"] for r in grid}
    for method in ("ar", "llama-cpp", "llama-server", "llama-server:--spec-type ngram-mod"):  # all on the same prompts
        assert {r["prompt_id"] for r in grid if r["method"] == method} == prompts
    table = report.split("## Per runtime")[1].split("\n\n")[1].splitlines()
    assert [line.split("|")[1].strip() for line in table[2:]] == [
        "draftwise lean (fp32)",
        "lean-int8 (requantized: a lossy choice)",
        "llama.cpp-F32 (an F32 copy)",
    ]
    # the design's answer: every runtime's plain decoding and each row's choice in one grid, against the fastest plain
    final = next(r for r in records if r["stage"] == "fastest")
    plain = {n for n, o in final["options"].items() if o["plain"]}
    assert plain == {"lean-fp32/ar", "lean-int8/ar", "llama.cpp-F32/ar", "llama.cpp-F32/llama-server"}
    assert final["fastest_plain"] == max(plain, key=lambda n: final["options"][n]["tokens_per_s"])
    assert final["recommend"] == (final["option"] not in plain)
    from draftwise.design import fastest

    opening = report.split("\n## ")[1].split("\n\n")[1]
    assert opening.startswith(fastest.sentence(final, fastest.row_verdicts(design.Pipeline(config, out))))
    if final["runtime"] == "lean-int8":  # a lossy runtime's answer says what it costs
        assert "Its quality against fp32 (a lossy runtime): agreement" in opening
    assert fastest.describe(final["fastest_plain"]) in opening and "measured on this machine" in opening
    assert (out / "export" / "README.md").read_text().startswith("# What to run on this machine")
    engine_readme = (out / "export" / "engines" / "llama.cpp-F32" / "README.md").read_text()
    assert "llama-server -m target-f32.gguf" in engine_readme and "measured here" in engine_readme
    _check_served(out, records, final)
    for png in (
        "tar_per_task",
        "speedup_per_task",
        "tokens_per_s",
        "predicted_vs_measured",
        "kv_footprint",
        "accuracy_vs_tar",
        "verify_vs_gamma",
        "step_vs_layers",
        "latency_vs_width",
        "verify_per_engine",
    ):
        assert (out / "plots" / f"{png}.png").exists()
    assert "data:image/png;base64," in (out / "report.html").read_text()
    from draftwise.cli import main

    written = {f: (out / f).read_text() for f in ("report.md", "report.html")}
    for f in written:
        (out / f).unlink()
    assert main(["report", "--out", str(out)]) == 0  # from the run folder alone: nothing reruns, the same report
    assert {f: (out / f).read_text() for f in written} == written
    moved = out.rename(tmp_path / "moved")  # a folder copied or moved elsewhere renders too; its command names it
    assert main(["report", "--out", str(moved)]) == 0
    assert (moved / "report.md").read_text().replace(str(moved), str(out)) == written["report.md"]
    moved.rename(out)
    headline = json.loads((out / "stages" / "bench-headline" / "summary.json").read_text())
    assert headline["methods"]["sd"]["identical_to_ar"] == 1.0  # greedy SD stays lossless inside the pipeline
    verdict = next(r for r in records if r["stage"] == "verdict")
    assert report.startswith("# draftwise design") and report.split("\n## ")[1].startswith(
        "Verdict"
    )  # the verdict first
    where = out / "export" if verdict["recommend"] else out / "export" / f"not-recommended-{chosen}"
    if not verdict["recommend"]:
        assert "not recommended" in (out / "export" / "README.md").read_text()
    for text in (f for f in (out / "export").rglob("*") if f.suffix in (".md", ".json") and f.name != "tokenizer.json"):
        assert str(tmp_path) not in text.read_text() and str(out) not in text.read_text(), text  # the folder can move
    vllm = json.loads((where / "vllm_speculative_config.json").read_text())
    gamma = next(r["chosen"] for r in records if r["stage"] == "select-gamma")
    kind = drafter_kind(decision_spec(records, chosen))
    if kind == "lookup":  # no weights: the vLLM method and the transformers call, no checkpoint, no head tuning
        assert vllm["method"] in ("ngram", "suffix") and vllm["num_speculative_tokens"] == gamma
        assert not (where / "drafter").exists() and "select-vocab" not in stages
        assert "prompt_lookup_num_tokens" in (where / "README.md").read_text()
    else:
        from transformers import AutoModelForCausalLM

        AutoModelForCausalLM.from_pretrained(where / "drafter")
        if kind == "model":
            assert {"select-vocab", "bench-adaptive"} <= set(stages) and vllm["num_speculative_tokens"] == gamma


def _check_served(out: Path, records: list[dict], final: dict) -> None:
    """Each lean engine's export folder holds serve.json, which `draftwise serve --export` loads: its verdict's drafter
    (its files beside it) or plain decoding; the answer's command, when it runs on the draftwise engine, was measured
    through HTTP beside llama-server and its figure is in the README and the report."""
    from draftwise.config import ServeConfig
    from draftwise.config.serve import from_export
    from draftwise.design import deploy, served

    verdicts = {"lean-fp32": next(r for r in records if r["stage"] == "verdict")}
    verdicts["lean-int8"] = next(r for r in records if r["stage"] == "verdict@lean-int8")
    for runtime, v in verdicts.items():
        folder = out / "export" / {"lean-fp32": ".", "lean-int8": "engines/lean-int8"}[runtime]
        config = from_export(ServeConfig(export=str(folder), given=("export",)))
        assert config.target == "<target>" and config.dtype == runtime.removeprefix("lean-")
        assert (config.drafter is not None) == v["recommend"], runtime
        if v["recommend"]:
            assert config.gamma == v["gamma"] and "{export}" not in config.drafter
            assert config.drafter == deploy.local_drafter(v["spec"], None).replace("{export}", str(folder.resolve()))
    record = next(r for r in records if r["stage"] == "served")
    readme, report = (out / "export" / "README.md").read_text(), (out / "report.md").read_text()
    assert deploy.PENDING not in readme and "Through `draftwise serve`" in report
    if not final["runtime"].startswith("lean-"):
        assert not record["applies"] and "`draftwise serve` does not apply" in readme
        return
    assert record["measured"] and served.sentence(record) in readme and served.sentence(record) in report
    measured = [
        json.loads(line) for line in (out / "stages" / "bench-serve" / "records.jsonl").read_text().splitlines()
    ]
    (command,) = {r["method"] for r in measured} - {"llama-server"}  # the README's command, run from the run folder
    assert command.startswith("serve:--") and record["command"].startswith("draftwise serve --")
    assert ("--export" in command) == final["recommend"] and "llama-server" in {r["method"] for r in measured}
    assert record["tokens_per_s"] > 0 and record["llama_server"]["tokens_per_s"] > 0
    pt, lo, hi = record["over_llama_server"]
    assert lo <= pt <= hi and record["prompts"] == 2


def decision_spec(records: list[dict], name: str) -> str:
    return next(r for r in records if r["stage"] == "bench-select")["drafters"][name]


def test_batched_bench_runs_at_the_gamma_predicted_for_its_batch(tiny_dir, tmp_path):
    """The profile covers each trained candidate's feasible batch, and the batched bench uses γ* predicted there."""
    target = _shape(tiny_dir)
    config = DesignConfig(
        target=tiny_dir,
        minutes=0.2,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=2,
        refine_limit=2,
        headline_limit=2,
        max_new_tokens=6,
        accuracy_items=2,
        draft_vocabs=(32,),
        adaptive=True,
        context=32,
        batch_cap=3,
        lookups=False,
        feature_drafter=False,  # model drafters only: whichever measures fastest has reduced heads to try
        memory=str(10 * target.weight_bytes() + 100 * target.kv_bytes(32)),
        serve=False,  # the end-to-end test measures the deploy command through a server
        threads=1,
    )
    out = design.run(config, tmp_path / "d")
    p = design.Pipeline(config, out)
    profiled = json.loads((out / "stages" / "profile" / "profile.json").read_text())["batches"]
    assert set(profiled) == {"1", "3"}
    for name in ("wide-L1", "narrow-L2"):
        pred = estimate.predicted(
            p, build.spec_of(p, next(c for c in candidates(target, (1,), 2) if c.name == name)), name, 3
        )
        assert pred and p.done[f"bench-{name}-batch"]["gamma"] == max(pred, key=pred.get)
    # model drafters only: no lookup stages; the chosen model drafter's reduced heads and adaptive lookahead were tried
    assert not {"agree-lookup", "tune-lookup", "suffix-index"} & set(p.done)
    assert {"vocab-32", "bench-vocab", "select-vocab", "bench-adaptive"} <= set(p.done)
    assert "Reduced-vocabulary draft head and adaptive lookahead" in (out / "report.md").read_text()
    if p.done["select-vocab"]["chosen"]:  # beside the exported drafter, recommended or kept for reference
        assert len(list((out / "export").glob("**/drafter-reduced-vocab/draft_vocab.json"))) == 1


def fake_grid(
    speedups: dict[str, float],
    prompts: int = 12,
    noise: float = 0.02,
    steps: dict[str, float] | None = None,
    scheduled: dict[str, float] | None = None,
):
    """A `bench_grid.run` that writes the records and grid.json a measurement would: per prompt, each drafter spec runs
    at `speedups[spec]` × AR's speed (× 1 ± noise, seeded), AR at 30 tokens/s; at larger γ a little faster. A point
    the grid schedules also runs the scheduled method, at `scheduled[spec]` × AR."""
    import random

    def run(grid, folder, executor=None):
        folder.mkdir(parents=True, exist_ok=True)
        rng, records, points = random.Random(folder.name), [], []
        for i in range(prompts):
            base = {"prompt_id": f"p{i}", "suite": "spec_bench", "temperature": 0.0, "batch": 1, "new_tokens": 60}
            records.append({**base, "drafter": None, "gamma": 0, "method": "ar", "seconds": 2.0})
            for x in (x for x in grid.points() if x.drafter):
                speed = 30 * (speedups[x.drafter] + 0.01 * x.gamma) * (1 + rng.uniform(-noise, noise))
                records.append({**base, "drafter": x.drafter, "gamma": x.gamma, "method": "sd", "seconds": 60 / speed})
                if x.schedule:
                    speed = 30 * (scheduled[x.drafter] + 0.01 * x.gamma) * (1 + rng.uniform(-noise, noise))
                    records.append(
                        {
                            **base,
                            "drafter": x.drafter,
                            "gamma": x.gamma,
                            "method": "sd-scheduled",
                            "seconds": 60 / speed,
                        }
                    )
        for x in (x for x in grid.points() if x.drafter):
            points.append(
                {
                    "drafter": x.drafter,
                    "gamma": x.gamma,
                    "temperature": 0.0,
                    "tar": 1.0 + speedups[x.drafter],
                    "tokens_per_s": 30 * speedups[x.drafter],
                    "draft_step_ms": (steps or {}).get(x.drafter, 0.05 if "ngram" in x.drafter else 4.0),
                    "ar_step_ms": 1000 / 30,
                    "speedup_vs_ar": speedups[x.drafter],
                }
            )
        (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (folder / "grid.json").write_text(json.dumps({"points": points}))
        return folder

    return run


@pytest.mark.parametrize("lookup_speedup,chosen", [(1.3, "ngram"), (0.9, "wide-L1")])
def test_design_picks_a_lookup_drafter_when_it_measures_faster(tiny_dir, tmp_path, monkeypatch, lookup_speedup, chosen):
    from draftwise.design import measure

    specs = {"wide-L1": "runs/distill-wide-L1", "narrow-L2": "runs/distill-narrow-L2", "ngram": "ngram:max=4"}
    monkeypatch.setattr(
        measure.bench_grid,
        "run",
        fake_grid({specs["wide-L1"]: 1.0, specs["narrow-L2"]: 0.85, specs["ngram"]: lookup_speedup}),
    )
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    name, gamma = measure.select(
        p, specs, {"wide-L1": 2, "narrow-L2": 1, "ngram": 4}, {"wide-L1": 100, "narrow-L2": 100}
    )
    decision = p.done["select-drafter"]
    assert name == chosen == decision["leader"] and not decision["tie"] and decision["passes"] == 1
    pt, lo, hi = decision["speedup"]["ngram"]
    assert lo < pt < hi and pt == pytest.approx(lookup_speedup + 0.04, abs=0.02)
    # γ ± 1 differ by 0.01 a step under ±2 % noise: whatever the measurement cannot order goes to the smallest γ
    g = p.done["select-gamma"]
    g0 = {"wide-L1": 2, "ngram": 4}[chosen]
    assert set(g["speedup"]) == {g0 - 1, g0, g0 + 1}
    assert gamma == (min(g["tie"]) if g["tie"] else g["leader"]) and (g["passes"] == 2 or not g["tie"])


def test_a_tie_within_noise_goes_to_the_cheaper_step(tiny_dir, tmp_path, monkeypatch):
    """n-gram and suffix equally fast under ±5 % per-prompt noise: the measurement cannot order them, so the one with
    the cheaper draft step wins whichever measured a hair faster; the decision keeps every interval and says why."""
    from draftwise.design import measure

    specs = {"suffix": "suffix,factor=2", "ngram": "ngram:max=4", "wide-L2": "runs/distill-wide-L2"}
    monkeypatch.setattr(
        measure.bench_grid,
        "run",
        fake_grid({specs["suffix"]: 1.20, specs["ngram"]: 1.20, specs["wide-L2"]: 0.85}, noise=0.05),
    )
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    name, _ = measure.select(p, specs, {"suffix": 2, "ngram": 2, "wide-L2": 1}, {"wide-L2": 100})
    decision = p.done["select-drafter"]
    assert set(decision["tie"]) == {"suffix", "ngram"} and decision["passes"] == 2  # re-measured once, still a tie
    assert name == "ngram" and "cheapest step" in decision["why"]  # 0.05 ms a drafted token vs 4 ms (fake)
    assert decision["lead"]["wide-L2"][0] > 0  # the model drafter is slower beyond noise


def test_lookups_whose_steps_differ_by_microseconds_tie_on_cost(tiny_dir, tmp_path, monkeypatch):
    """0.05 vs 0.1 ms beside a 33 ms AR step is no cost difference (both 0.00 AR steps): a tie in speed then goes to
    the faster point estimate, not to the proposer that happens to be 50 µs quicker."""
    from draftwise.design import measure

    specs = {"suffix": "suffix,factor=2", "ngram": "ngram:max=4"}
    monkeypatch.setattr(
        measure.bench_grid,
        "run",
        fake_grid({specs["suffix"]: 1.23, specs["ngram"]: 1.20}, noise=0.08, steps={specs["suffix"]: 0.1}),
    )
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    name, _ = measure.select(p, specs, {"suffix": 2, "ngram": 2}, {})
    decision = p.done["select-drafter"]
    assert decision["tie"] and decision["cost"]["suffix"] == decision["cost"]["ngram"] == [0.0, 0, False]
    assert name == max(decision["speedup"], key=lambda n: decision["speedup"][n][0])


@pytest.mark.parametrize("scheduled_speedup,chosen", [(1.5, "ngram+scheduled"), (1.2, "ngram")])
def test_a_scheduled_lookup_is_an_option_of_its_own(tiny_dir, tmp_path, monkeypatch, scheduled_speedup, chosen):
    """The scheduled variant runs in its static lookup's grid point and is decided like any candidate: chosen when it
    is faster beyond noise (then γ is refined with the scheduler on), else a tie that goes to static SD."""
    from draftwise.design import measure

    specs = {"ngram": "ngram:max=4", "wide-L1": "runs/distill-wide-L1", "ngram+scheduled": "ngram:max=4"}
    runs = []
    grid_run = fake_grid({specs["ngram"]: 1.2, specs["wide-L1"]: 0.9}, scheduled={specs["ngram"]: scheduled_speedup})
    monkeypatch.setattr(measure.bench_grid, "run", lambda g, f, e=None: (runs.append(g), grid_run(g, f, e))[1])
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    name, _ = measure.select(
        p, specs, {"ngram": 4, "wide-L1": 2, "ngram+scheduled": 4}, {"wide-L1": 100}, {"ngram+scheduled": "ngram"}
    )
    decision = p.done["select-drafter"]
    assert name == chosen and set(decision["speedup"]) == set(specs)
    select = runs[0]
    assert select.scheduled == (specs["ngram"],) and select.bench.schedule == str(p.folder("profile"))
    assert [x.schedule is not None for x in select.points() if x.drafter] == [True, False]  # ngram, then wide-L1
    gamma_grid = runs[-1]
    assert (gamma_grid.bench.schedule is not None) == (chosen == "ngram+scheduled")
    assert p.done["bench-gamma"]["method"] == ("sd-scheduled" if chosen == "ngram+scheduled" else "sd")
    if chosen == "ngram":
        assert "ngram+scheduled" in decision["tie"] and decision["cost"]["ngram+scheduled"][-1] is True


def test_paired_intervals_shrink_with_the_pairing():
    """Two options whose per-prompt speeds vary a lot across prompts but little between them: the paired lead interval
    is narrow although each option's own interval is wide."""
    from draftwise.design import decide

    rng = np.random.default_rng(0)
    scale = rng.uniform(0.5, 2.0, 30)  # prompts differ by 4x in length
    ar = {f"p{i}": (100 * s, 4.0 * s) for i, s in enumerate(scale)}
    options = {
        "a": {p: (t, sec / (1.20 * rng.uniform(0.99, 1.01))) for p, (t, sec) in ar.items()},
        "b": {p: (t, sec / (1.10 * rng.uniform(0.99, 1.01))) for p, (t, sec) in ar.items()},
    }
    result = decide.compare(options, ar)
    assert result["leader"] == "a" and decide.tied(result) == ["a"]
    lo, hi = result["lead"]["b"]
    assert 0 < lo < np.log(1.2 / 1.1) < hi and hi - lo < 0.02
    assert decide.choose(result, lambda n: (0,))["chosen"] == "a"


def verdict_record(spec: str, recommend: bool, name: str = "suffix") -> dict:
    return {
        "recommend": recommend,
        "drafter": name,
        "spec": spec,
        "gamma": 6,
        "speedup": [1.2, 1.1, 1.3] if recommend else [0.9, 0.85, 0.95],
        "headline_speedup": 1.25,
        "per_task": {"arena": {"speedup_vs_ar": 1.3}},
    }


def test_a_lookup_export_holds_no_machine_paths(tiny_dir, tmp_path):
    from draftwise.design import export

    index = tmp_path / "d" / "stages" / "suffix-index"
    index.mkdir(parents=True)
    (index / "suffix_corpus.safetensors").write_bytes(b"x")
    (index / "done.json").write_text(json.dumps({"event": "done", "stage": "suffix-index", "folder": str(index)}))
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    spec = f"suffix:{index},factor=2,min_prob=0.3"
    assert export.export(p, None, verdict_record(spec, True)) is None
    out = tmp_path / "d" / "export"
    vllm = json.loads((out / "vllm_speculative_config.json").read_text())
    assert vllm == {
        "method": "suffix",
        "num_speculative_tokens": 6,
        "suffix_decoding_max_tree_depth": 32,
        "suffix_decoding_max_spec_factor": 2.0,
        "suffix_decoding_min_token_prob": 0.3,
    }
    readme = (out / "README.md").read_text()
    assert readme.startswith("## The draftwise lean engine at fp32\n\n**Its verdict:** Deploy suffix")
    assert "1.20× plain decoding" in readme
    assert str(tmp_path) not in readme and "suffix:suffix-corpus,factor=2,min_prob=0.3" in readme
    assert (out / "suffix-corpus" / "suffix_corpus.safetensors").exists()
    assert all(str(tmp_path) not in f.read_text(errors="ignore") for f in out.rglob("*") if f.is_file())
    assert export.vllm_lookup("ngram:min=2,max=5", 3) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }


def test_a_scheduled_lookup_exports_what_the_scheduler_loads_and_no_machine_path(tiny_dir, tmp_path):
    """export/schedule/ holds the verify curve and the calibration, loadable as `bench --schedule schedule
    --calibration schedule`; neither names a folder of the run (the profile's drafter entries are left out)."""
    from draftwise.design import export
    from draftwise.sd import calibrate
    from draftwise.sd.schedule import VerifyCurve

    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    drafter = str(tmp_path / "d" / "stages" / "distill-wide-L1")
    profile = {
        "machine": {"engine": "lean", "dtype": "fp32"},
        "batches": {
            "1": {
                "ar_step_ms": 20.0,
                "verify_ms": {"1": 22.0, "4": 30.0},
                "verify_over_ar_step": {"1": 1.1, "4": 1.5},
                "drafters": {drafter: {"step_ms": 3.0}},
            }
        },
    }
    table = {"own|p1|n2|g3": [10, 4.0]}
    for stage, name, content in (
        ("profile", "profile.json", profile),
        (
            "calibrate-lookup",
            calibrate.FILE,
            {
                "drafters": {f"suffix:{tmp_path}/d/stages/suffix-index,factor=2": 4},
                "temperatures": {"0": {"positions": 10, "counts": table}},
            },
        ),
    ):
        p.folder(stage).mkdir(parents=True)
        (p.folder(stage) / name).write_text(json.dumps(content))
        p.add({"event": "done", "stage": stage, "folder": str(p.folder(stage))})
    export.export(p, None, {**verdict_record("ngram:min=1,max=4", True, "ngram+scheduled"), "method": "sd-scheduled"})
    out = tmp_path / "d" / "export"
    assert VerifyCurve.from_profile(out / "schedule", 4, {"engine": "lean", "dtype": "fp32"}).ms == (
        20.0,
        22.0,
        24.0 + 2 / 3,
        27.0 + 1 / 3,
        30.0,
    )
    assert calibrate.load(out / "schedule", 0.0).counts == table
    readme = (out / "README.md").read_text()
    assert "--schedule schedule --calibration schedule" in readme and "(the verdict's method)" in readme
    assert "with the round scheduler" in readme.split("\n\n")[1]
    assert all(str(tmp_path) not in f.read_text(errors="ignore") for f in out.rglob("*") if f.is_file())


def test_an_export_that_lost_to_plain_decoding_says_so(tiny_dir, tmp_path):
    """A model drafter measured slower than AR: export/ says SD is not recommended and keeps the drafter under a name
    that says so; no snippet names a path of this machine."""
    from transformers import AutoModelForCausalLM

    from draftwise.design import export
    from draftwise.runtimes.registry import load

    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    assert export.export(p, load(tiny_dir), verdict_record("layers:0,1", False, "first-2")) is not None
    out = tmp_path / "d" / "export"
    assert "SD is not recommended" in (out / "README.md").read_text()
    assert "Use plain decoding" in (out / "README.md").read_text()
    kept = out / "not-recommended-first-2"
    AutoModelForCausalLM.from_pretrained(kept / "drafter")
    assert not (out / "drafter").exists() and not (out / "vllm_speculative_config.json").exists()
    for f in (kept / "README.md", kept / "vllm_speculative_config.json"):
        assert str(tmp_path) not in f.read_text() and tiny_dir not in f.read_text()
    assert json.loads((kept / "vllm_speculative_config.json").read_text())["model"] == "drafter"


def test_tuned_lookup_settings_are_decided_with_intervals(tiny_dir, tmp_path):
    """In the end-to-end run above each method's settings are its paired decision over the replayed, priced settings:
    the leader, or the cheapest of a tie within noise."""
    config = DesignConfig(
        target=tiny_dir,
        minutes=0.2,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=2,
        refine_limit=2,
        headline_limit=2,
        tune_prompts=4,
        max_new_tokens=6,
        accuracy_items=2,
        draft_vocabs=(),
        adaptive=False,
        memory="1",
        serve=False,  # the end-to-end test measures the deploy command through a server
        threads=1,
    )
    out = design.run(config, tmp_path / "d")
    tune = json.loads((out / "stages" / "tune-lookup" / "tune.json").read_text())
    done = design.Pipeline(config, out).done["tune-lookup"]
    for method in ("ngram", "suffix"):
        decision = tune["decisions"][method]
        assert decision["chosen"] == f"{done[method]['spec']}@{done[method]['gamma']}"
        assert decision["chosen"] in (decision["tie"] or [decision["leader"]])
        assert len(decision["speedup"]) == sum(r["method"] == method for r in tune["rows"])
    from draftwise import specs
    from draftwise.sd.families import drafter_kind

    model, lookup, model_gamma = specs.split_hybrid(done["hybrid"]["spec"])  # the better lookup, the best model drafter
    better = max(("ngram", "suffix"), key=lambda m: done[m]["predicted_tokens_per_s"])
    assert lookup == done[better]["spec"] and done["hybrid"]["gamma"] == done[better]["gamma"]
    # the model-level drafter its prediction ranks first: a distilled cut, a layer subset or the feature head (on a
    # tiny random model their predictions are near ties, so which one is timing's call)
    assert model_gamma >= 1 and drafter_kind(model) in ("model", "feature")
    assert "distill-" in model or model.startswith(("layers:", "feature:"))


def synthetic_pipeline(tiny_dir, tmp_path, speedups: dict[str, list[float]], kinds: dict[str, str]) -> design.Pipeline:
    """Stage folders as a design run would leave them: the selection grid's points, its decision, profile, headline."""
    p = design.Pipeline(DesignConfig(target=tiny_dir), tmp_path / "d")
    specs = {n: {"model": f"runs/distill-{n}", "lookup": "ngram:max=4"}[kinds[n]] for n in speedups}
    points = [
        {
            "drafter": specs[n],
            "gamma": 2,
            "tar": 1.3,
            "ar_step_ms": 25.0,
            "by_suite": {"arena": {"speedup_vs_ar": s[0]}},
            "methods": {
                "sd": {
                    "tar": 1.3,
                    "alpha": 0.3,
                    "draft_step_ms": 5.0 if kinds[n] == "model" else 0.02,
                    "draft_s": 0.5,
                    "proposal_lengths": {"2": 90, "0": 10},
                    "proposed_fraction": 0.9,
                }
            },
        }
        for n, s in speedups.items()
    ]
    for stage, files in {
        "bench-select": {"grid.json": {"points": points}},
        "profile": {"profile.json": {"batches": {"1": {"verify_over_ar_step": {"1": 1.1, "2": 1.16}}}}},
        "bench-headline": {
            "summary.json": {"methods": {"sd": {"speedup_vs_ar": max(s[0] for s in speedups.values())}}}
        },
    }.items():
        for name, obj in files.items():
            p.folder(stage).mkdir(parents=True, exist_ok=True)
            (p.folder(stage) / name).write_text(json.dumps(obj))
        p.add({"event": "done", "stage": stage, "folder": str(p.folder(stage)), "drafters": specs})
    leader = max(speedups, key=lambda n: speedups[n][0])
    p.add(
        {"event": "done", "stage": "select-drafter", "chosen": leader, "leader": leader, "speedup": speedups, "tie": []}
    )
    return p


@pytest.mark.parametrize(
    "speedups,recommend",
    [
        (
            {"wide-L2": [0.88, 0.84, 0.92], "ngram": [0.97, 0.93, 0.99]},
            False,
        ),  # every candidate below AR: plain decoding
        ({"wide-L2": [0.88, 0.84, 0.92], "ngram": [1.24, 1.15, 1.33]}, True),  # the lookup beats it beyond noise
        (
            {"wide-L2": [0.88, 0.84, 0.92], "ngram": [1.03, 0.97, 1.09]},
            False,
        ),  # above 1 only within noise: not a deploy
    ],
)
def test_the_verdict_recommends_only_what_beats_plain_decoding(tiny_dir, tmp_path, speedups, recommend):
    from draftwise.design import verdict

    p = synthetic_pipeline(tiny_dir, tmp_path, speedups, {"wide-L2": "model", "ngram": "lookup"})
    v = verdict.decide(p, 2)
    assert v["recommend"] is recommend and v["drafter"] == "ngram"
    text = verdict.sentence(v)
    assert text.startswith("Deploy ngram") if recommend else text.startswith("Use plain decoding")
    model = v["candidates"]["wide-L2"]  # c = 5 / 25 = 0.2 per token; 90 % of rounds draft 2, verify(2) = 1.16 steps
    assert model["c"] == pytest.approx(0.2) and 0 < model["alpha_needed"] < 1
    e = cost.expected_tokens_iid(model["alpha_needed"], 2)
    assert 0.9 * e + 0.1 == pytest.approx(0.9 * (2 * 0.2 + 1.16) + 0.1, rel=1e-6)  # break-even: tokens = AR steps
    assert v["candidates"]["ngram"]["alpha_needed"] < model["alpha_needed"]  # no draft cost: a lower α suffices
    assert model["tar_needed"] == pytest.approx(0.9 * (2 * 0.2 + 1.16) + 0.1)  # AR steps per round
    assert model["c_affordable"] == pytest.approx((1.3 - (0.9 * 1.16 + 0.1)) / 0.9 / 2)  # per token, at TAR 1.3


def test_shapes_come_from_the_fitted_step_model():
    """With the full head a narrow shape is predicted fastest (its head reads a third of the bytes): it is trained, with
    the full-width shape as its control; where layers cost more than bytes, the full width wins, with its deep twin."""
    from draftwise.design.candidates import budget_shapes, choose_shapes

    budget = SMOL.params()["non_embedding"] * 2 // 30
    bytes_bound = cost.StepModel(fixed_ms=1.0, layer_overhead_ms=0.05, ms_per_layer_mb=0.05, ms_per_head_mb=0.05)
    fastest, control = choose_shapes(SMOL, budget, bytes_bound, 3)
    assert fastest == min(budget_shapes(SMOL, budget), key=bytes_bound.predict_ms) and fastest.hidden < SMOL.hidden
    assert (control.layers, control.hidden) == (2, SMOL.hidden)
    overhead_bound = cost.StepModel(fixed_ms=1.0, layer_overhead_ms=2.0, ms_per_layer_mb=0.001, ms_per_head_mb=0.001)
    fastest, control = choose_shapes(SMOL, budget, overhead_bound, 3)  # the shallowest shape inside the target
    assert (fastest.layers, fastest.hidden) == (2, SMOL.hidden) and control == narrow_twin(SMOL, 2, 3)
    assert all(s.hidden <= SMOL.hidden and s.ffn <= SMOL.ffn for s in budget_shapes(SMOL, budget))  # prunable only
    names = [c.name for c in candidates(SMOL, (), 3, shapes=choose_shapes(SMOL, budget, bytes_bound, 3))]
    assert names[0] == "wide-L2" and names[1].startswith("narrow-L") and names[2] == "first-2"


def test_a_tie_tells_one_story_in_headline_wide_vs_deep_and_export(tiny_dir, tmp_path):
    """Two trained drafters measured identically: the selection calls it a tie and takes the cheaper step, and the
    headline, the wide-vs-deep section and the export all name that drafter."""
    config = DesignConfig(
        target=tiny_dir,
        minutes=0.2,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=3,
        refine_limit=2,
        headline_limit=2,
        max_new_tokens=6,
        accuracy_items=2,
        draft_vocabs=(),
        adaptive=False,
        lookups=False,
        memory="1",
        select_repeats=0,
        serve=False,  # the end-to-end test measures the deploy command through a server
        threads=1,
    )
    out = design.run(config, tmp_path / "d")
    # make the narrow drafter's timings exactly the wide one's, and forget everything decided from them
    folder = out / "stages" / "bench-select"
    specs = json.loads((out / "stages" / "bench-select" / "done.json").read_text())["drafters"]
    recs = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    wide = {r["prompt_id"]: r for r in recs if r["drafter"] == specs["wide-L1"]}
    recs = [
        {**r, "seconds": wide[r["prompt_id"]]["seconds"]} if r["drafter"] == specs["narrow-L2"] else r for r in recs
    ]
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    keep = [
        line
        for line in (out / "records.jsonl").read_text().splitlines()
        if json.loads(line)["stage"] not in ("select-drafter",)
        and not json.loads(line)["stage"].startswith(
            ("bench-select-", "bench-gamma", "select-gamma", "bench-temps", "bench-headline", "verdict")
        )
    ]
    (out / "records.jsonl").write_text("\n".join(keep) + "\n")
    import shutil

    for name in (
        "select-drafter",
        "bench-gamma",
        "select-gamma",
        "bench-temps",
        "bench-headline",
        "verdict",
        "bench-select-repeat",
    ):
        shutil.rmtree(out / "stages" / name, ignore_errors=True)
    shutil.rmtree(out / "export")
    design.run(config, out)
    p = design.Pipeline(config, out)
    decision = p.done["select-drafter"]
    chosen = decision["chosen"]
    cheaper = min(("wide-L1", "narrow-L2"), key=lambda n: tuple(decision["cost"][n]))
    if {"wide-L1", "narrow-L2"} & {
        decision["leader"],
        *decision["tie"],
    }:  # in the tie, the pair's cheaper one beats its twin
        assert {"wide-L1", "narrow-L2"} <= set(decision["tie"]) and chosen != (
            {"wide-L1", "narrow-L2"} - {cheaper}
        ).pop()
    report = (out / "report.md").read_text()
    assert f"Chosen drafter: {chosen} " in report  # the headline
    pair = next(line for line in report.splitlines() if " over " in line and "at equal non-embedding" in line)
    winner = chosen if chosen in ("wide-L1", "narrow-L2") else cheaper
    assert pair.startswith(f"{winner} over ")  # the wide-vs-deep section names the same drafter
    assert "the selection chose it" in pair if chosen == winner else "tie within noise" in pair
    export = (out / "export" / "README.md").read_text()
    assert f"{chosen} (" in export.split("\n")[0] or f"not-recommended-{chosen}" in export  # and so does the export


def test_lookup_settings_tie_goes_to_the_cheaper_settings():
    """Replayed settings that differ by less than their noise over prompts: the smaller γ, then the higher min_prob."""
    from draftwise.design.lookup import choose_setting

    docs = [{"prompt_id": f"p{i}", "continuation": [0] * 10} for i in range(12)]
    t_verify = lambda g: 0.01 * (1 + 0.1 * g)  # noqa: E731

    def row(spec, gamma, factor, seed=0):  # per-prompt seconds with ±20 % noise of the option's own
        noise = torch.empty(12).uniform_(0.8, 1.2, generator=torch.Generator().manual_seed(seed)).tolist()
        settings = {"factor": 2.0, "min_prob": float(spec.rsplit("=", 1)[1])}
        return {
            "spec": spec,
            "gamma": gamma,
            "settings": settings,
            "per_prompt": {f"p{i}": (10, 0.08 * n * factor) for i, n in enumerate(noise)},
        }

    a, b = row("suffix:x,factor=2,min_prob=0.1", 3, 1.0, seed=1), row("suffix:x,factor=2,min_prob=0.3", 2, 1.01, seed=2)
    chosen, record = choose_setting([a, b], docs, t_verify)
    assert record["tie"] and chosen is b  # 1 % apart: a tie, the smaller γ wins
    c = row("suffix:x,factor=2,min_prob=0.1", 2, 1.0, seed=3)
    chosen, record = choose_setting([c, b], docs, t_verify)
    assert record["tie"] and chosen is b  # same γ: the higher min_prob wins
    fast = row("suffix:x,factor=2,min_prob=0.1", 4, 0.6, seed=4)
    chosen, record = choose_setting([fast, b], docs, t_verify)
    assert not record["tie"] and chosen is fast  # 40 % faster on every prompt: beyond noise, γ 4 despite its cost


def test_design_runs_on_a_gemma3_target(tiny_gemma_dir, tmp_path):
    """Every stage on another family: the sweep's shapes, prune, gen-data, distill, agree, profile, lookups, benches,
    the verdict and the export, on a local/global Gemma 3."""
    config = DesignConfig(
        target=tiny_gemma_dir,
        minutes=0.2,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=2,
        refine_limit=2,
        headline_limit=2,
        tune_prompts=4,
        max_new_tokens=6,
        accuracy_items=2,
        draft_vocabs=(32,),
        adaptive=False,
        memory="1",
        threads=1,
    )
    out = design.run(config, tmp_path / "d")
    done = design.Pipeline(config, out).done
    assert {"sweep", "prune-wide-L1", "distill-narrow-L2", "profile", "bench-headline", "verdict"} <= set(done)
    from transformers import AutoModelForCausalLM

    narrow = AutoModelForCausalLM.from_pretrained(out / "stages" / "distill-narrow-L2" / "checkpoint")
    c = narrow.config
    assert c.model_type == "gemma3_text" and c.num_hidden_layers == 2 and c.num_attention_heads == 2
    assert len(c.layer_types) == 2 and set(c.layer_types) <= {"sliding_attention", "full_attention"}
    assert (out / "report.md").read_text().startswith("# draftwise design")


def test_the_answers_serve_command_is_measured_through_http_beside_llama_server(tiny_dir, tmp_path):
    """A lean answer with an n-gram drafter: serve.json in export/, the README's command run as a bench baseline
    (`serve:--export DIR ...`) beside llama-server's plain decoding, its figure in the README; greedy tokens through
    HTTP are the lean engine's, which on an f32 GGUF of the checkpoint are llama-server's too."""
    from draftwise.config import ServeConfig
    from draftwise.config.serve import from_export
    from draftwise.design import deploy, export, served

    config = DesignConfig(target=tiny_dir, plan=False, headline_limit=2, max_new_tokens=12, threads=1)
    p = design.Pipeline(config, tmp_path / "d")
    top = p.path / "export"
    top.mkdir()
    (top / "README.md").write_text("")
    export.serve_json(p, top, {**verdict_record("ngram:min=1,max=3", True, "ngram"), "gamma": 3})
    final = {
        "runtime": "lean-fp32",
        "recommend": True,
        "tokens_per_s": 900.0,
        "plain_tokens_per_s": 800.0,
        "options": {"llama.cpp-F32/llama-server": {"tokens_per_s": 1000.0}},
    }
    (top / "README.md").write_text(deploy.PENDING + "\n")
    assert served.outline(p, final) == {"serve": True, "serve_token_s": 1 / 900 + 1 / 1000}
    record = served.run(p, final)
    assert record["command"] == "draftwise serve --export . --target <target> --threads 1"
    assert served.sentence(record) in (top / "README.md").read_text() and record["prompts"] == 2
    records = [json.loads(line) for line in (p.folder("bench-serve") / "records.jsonl").read_text().splitlines()]
    by = {m: {r["prompt_id"]: r["tokens"] for r in records if r["method"] == m} for m in {r["method"] for r in records}}
    (command,) = set(by) - {"llama-server"}
    assert command == f"serve:--export {top.resolve()} --target {tiny_dir} --threads 1"
    assert by[command] == by["llama-server"]  # greedy, lossless: the same tokens through either server
    assert sum(r["drafted"] for r in records if r["method"] == command) > 0
    loaded = from_export(ServeConfig(export=str(top), given=("export",)))
    assert (loaded.drafter, loaded.gamma, loaded.target) == ("ngram:min=1,max=3", 3, "<target>")


def test_a_mixed_traffic_is_served_with_a_gamma_per_temperature_and_measured_at_its_own(tiny_dir, tmp_path):
    """The issue's mixed traffic: SD pays at T = 0 and not at T = 1 on the answer's runtime, so serve.json drafts by
    request temperature (`0:3,1:0`) and the served figure is measured per temperature on the traffic's own requests:
    its T = 0 requests draft (and are the lean engine's greedy tokens, as llama-server's on the same f32 file), its
    T = 1 requests draft nothing."""
    from draftwise.design import deploy, export, served

    traffic = tmp_path / "traffic.jsonl"
    lines = [
        {"id": f"code{i}", "category": "code", "prompt": "w1 w2 w3 w1 w2 w3 w1 w2", "temperature": 0, "max_tokens": 10}
        for i in range(2)
    ] + [{"id": f"chat{i}", "category": "chat", "prompt": f"w{5 + i} w9 w7", "temperature": 1} for i in range(2)]
    traffic.write_text("".join(json.dumps(x) + "\n" for x in lines))
    config = DesignConfig(
        target=tiny_dir, prompts=str(traffic), plan=False, headline_limit=4, max_new_tokens=10, threads=1
    )
    p = design.Pipeline(config, tmp_path / "d")
    top = p.path / "export"
    top.mkdir()
    sd, ar = {"plain": False}, {"plain": True, "speedup": [1.0, 1.0, 1.0]}
    final = {
        "runtime": "lean-fp32",
        "recommend": False,  # plain decoding wins the whole traffic, SD its T = 0 part
        "tokens_per_s": 900.0,
        "plain_tokens_per_s": 800.0,
        "options": {"llama.cpp-F32/llama-server": {"tokens_per_s": 1000.0}},
        "traffic": ["0", "1"],
        "temperatures": {
            "0": {"options": {"lean-fp32/sd": {**sd, "speedup": [1.3, 1.2, 1.4]}, "lean-fp32/ar": ar}},
            "1": {"options": {"lean-fp32/sd": {**sd, "speedup": [0.9, 0.8, 1.0]}, "lean-fp32/ar": ar}},
        },
    }
    saved = export.serve_json(p, top, {**verdict_record("ngram:min=1,max=3", True, "ngram"), "gamma": 3}, final)
    assert saved["gamma_by_temperature"] == "0:3,1:0"
    (top / "README.md").write_text(deploy.PENDING + "\n")
    record = served.run(p, final)
    assert record["command"] == "draftwise serve --export . --target <target> --threads 1"
    assert record["stages"] == ["bench-serve@T0", "bench-serve@T1"] and record["prompts"] == 4
    assert "each at its own temperature (2 at T = 0, 2 at T = 1)" in record["what"]
    command = "serve:" + " ".join(served.command(p, final, readme=False)[2:])
    for stage, drafts in (("bench-serve@T0", True), ("bench-serve@T1", False)):
        records = [json.loads(line) for line in (p.folder(stage) / "records.jsonl").read_text().splitlines()]
        mine = [r for r in records if r["method"] == command]
        assert len(mine) == 2 and (sum(r["drafted"] for r in mine) > 0) == drafts
        if drafts:
            server = {r["prompt_id"]: r["tokens"] for r in records if r["method"] == "llama-server"}
            assert {r["prompt_id"]: r["tokens"] for r in mine} == server


def test_the_feature_head_is_built_tuned_in_a_hybrid_and_kept_off_llama_cpp_rows(tiny_dir, tmp_path, monkeypatch):
    """The feature-level candidate end to end: trained on the teacher data, the top model of the hybrid's tuning (its
    prediction forced highest here), benchmarked alone and in the hybrid beside every other candidate, kept off the
    llama.cpp rows (no hidden states there); when the selection chooses it, exported as a head only the draftwise
    engine runs."""
    monkeypatch.setattr(design, "best_gamma", lambda p, spec, name, **k: (2, 99.0 if "feature:" in spec else 1.0))
    config = DesignConfig(
        target=tiny_dir,
        minutes=0.3,
        plan=False,
        wide_layers=(1,),
        narrow_factor=2,
        bench_limit=3,
        refine_limit=2,
        headline_limit=2,
        tune_prompts=6,
        max_new_tokens=8,
        accuracy_items=3,
        draft_vocabs=(),
        temperatures=(0.0,),
        serve=False,
        threads=1,
    )
    out = design.run(config, tmp_path / "design")
    records = {r["stage"]: r for r in map(json.loads, (out / "records.jsonl").read_text().splitlines())}
    assert {"teacher", "feature-feature", "agree-feature"} <= set(records)
    hybrid = json.loads((out / "candidates.json").read_text())["specs"]["hybrid"]
    assert hybrid.startswith("hybrid:feature:")  # the hybrid's model part: the top predicted model, the head
    assert {"feature", "hybrid"} <= set(records["select-drafter"]["speedup"])
    for name, r in records.items():
        if name.startswith(("verdict@llama.cpp", "bench-select@llama.cpp")):
            assert "feature:" not in json.dumps(r)  # llama.cpp hands out no hidden states
    if records["select-drafter"]["chosen"] in ("feature", "hybrid"):
        assert not (out / "export" / "vllm_speculative_config.json").exists()
        assert "feature:{export}/drafter" in json.loads((out / "export" / "serve.json").read_text())["drafter"]
    assert "When would training pay?" in (out / "report.md").read_text()


def _small_q4_design(target: str, **overrides) -> DesignConfig:
    """A design of the small Q4_1 file at fixed sizes small enough for a test, with its lean-q4 row asked for."""
    return DesignConfig(
        target=target,
        minutes=0.2,
        plan=False,
        bench_limit=2,
        refine_limit=2,
        headline_limit=2,
        tune_prompts=4,
        max_new_tokens=6,
        accuracy_items=2,
        draft_vocabs=(),
        adaptive=False,
        temperatures=(0.0,),
        serve=False,
        threads=1,
        rows=("lean", "lean-q4"),
        **overrides,
    )


@pytest.mark.slow
def test_a_gguf_target_with_4_bit_blocks_gets_a_lean_q4_row(small_q4_gguf, tmp_path):
    """The lean engine on the target file's own blocks is a row like lean-int8: profiled, tuned, benched, its quality
    measured against fp32 of the same file, in the last grid, in the report and exported with its `--dtype q4`. The
    file's weights are random (so marked by the writer): no verdict chooses a drafter by its acceptance, each states
    every candidate's break-even α and predicted speedups instead."""
    config = _small_q4_design(small_q4_gguf, wide_layers=(1,), narrow_factor=2, feature_drafter=False)
    out = tmp_path / "design"
    design.run(config, out)
    done = design.Pipeline(config, out).done
    v = done["verdict@lean-q4"]
    assert (v["backend"], v["dtype"], v["quant"], v["shipped"]) == ("lean", "q4", "Q4", True)
    assert v["identical"] == 1  # greedy SD on the file's blocks gives AR's tokens
    assert {"lean-fp32/ar", "lean-q4/ar"} <= set(done["fastest"]["options"])
    quality = json.loads((out / "stages" / "quality" / "quality.json").read_text())
    assert quality["lean:q4"]["agreement"] > 0.9  # the same file's function, activations quantized per token
    for verdict in (done["verdict"], v):
        assert verdict["random_weights"] and not verdict["recommend"]
        for x in verdict["candidates"].values():
            assert set(x["predicted"]) == {"0.3", "0.5", "0.7"}
            assert x["predicted"]["0.3"] <= x["predicted"]["0.5"] <= x["predicted"]["0.7"]  # more accepted, faster
        assert any(x["predicted"]["0.3"] < x["predicted"]["0.7"] for x in verdict["candidates"].values())
    report = (out / "report.md").read_text()
    assert "lean-q4 (the target file's own 4-bit blocks)" in report
    assert report.count("The target's weights are random") >= 2 and "(predicted)" in report  # lean and lean-q4
    assert "--dtype q4" in (out / "export" / "engines" / "lean-q4" / "README.md").read_text()


@pytest.mark.slow
def test_a_study_at_q4_takes_its_candidates_as_they_are(small_q4_gguf, tmp_path, monkeypatch):
    """A target too big for an fp32 study is studied at its file's own precision (`--dtype q4`): nothing is pruned or
    distilled, the lean-q4 row is the study itself (no row of its own), and the family's small model (the default
    135M target: the same tokenizer) is a candidate, benchmarked beside the target's layers and the lookups."""
    # the tiny target is smaller than its family's model: any size gets it
    monkeypatch.setattr(sys.modules["draftwise.design.candidates"], "FAMILY_RATIO", 0.0)
    config = _small_q4_design(small_q4_gguf, dtype="q4")
    out = tmp_path / "design"
    design.run(config, out)
    done = design.Pipeline(config, out).done
    assert not [s for s in done if s.startswith(("prune-", "distill-", "feature-", "teacher", "sweep"))]
    assert not [s for s in done if s.endswith("@lean-q4")]  # the study is the lean-q4 row
    assert "agree-smollm2-135m" in done and "smollm2-135m" in done["verdict"]["candidates"]
    assert "lean-q4/ar" in done["fastest"]["options"]
    assert "--dtype q4" in (out / "export" / "README.md").read_text()


@pytest.fixture
def stand_in_sibling(tmp_path):
    """A 6-layer random model with the default target's tokenizer at Q4_1: the small q4 target's sibling in a test."""
    from conftest import tiny_config, tiny_model
    from draftwise.gguf.write import write_gguf
    from draftwise.targets.source import default_gguf

    config = tiny_config(vocab=49152, layers=6, hidden_size=64, intermediate_size=96)
    state = tiny_model(config, seed=7, std=0.3).state_dict()
    path = tmp_path / "sibling-q4_1.gguf"
    return str(write_gguf(config, state, None, path, quant="q4_1", tokenizer_gguf=default_gguf(), random_weights=True))


@pytest.mark.slow
def test_a_study_at_q4_cuts_its_siblings_shapes_and_distills_them(
    small_q4_gguf, stand_in_sibling, tmp_path, monkeypatch
):
    """A target studied at q4 with a sibling (a 6-layer stand-in of the same tokenizer) gets the paper's recipe on the
    sibling: a wide-shallow cut and its deep-narrow twin, pruned from the sibling at fp32 with the head on the target's
    frequent tokens, distilled on the target's gen-data and the train text it scored teacher-forced at q4 (no sweep),
    then benchmarked at q4 through their reduced heads beside the sibling as it ships."""
    sibling = lambda spec, default: ("sibling", stand_in_sibling)  # noqa: E731
    monkeypatch.setattr(sys.modules["draftwise.design.candidates"], "FAMILY_RATIO", 0.0)
    monkeypatch.setattr(sys.modules["draftwise.design.cuts"], "family_model", sibling)
    monkeypatch.setattr(design, "family_model", sibling)
    # random weights pay nothing: the ranking's price is made to pay by predicted agreement, so the focus runs
    monkeypatch.setattr(sys.modules["draftwise.cost"], "optimistic_speedup", lambda c, alpha: 1.5 + alpha)
    config = _small_q4_design(small_q4_gguf, dtype="q4", feature_drafter=False, narrow_factor=2)  # 2 → 4 layers
    out = tmp_path / "design"
    design.run(config, out)
    done = design.Pipeline(config, out).done
    assert not [s for s in done if s.startswith(("sweep", "feature-"))]
    # each cut trained a pilot (half its minutes, no stop rule); the curves' first-ranked one trained on from it
    focus = done["focus-cuts"]
    first = focus["ranking"][0]
    assert {x["name"] for x in focus["ranking"]} == {"cut-wide-L2", "cut-narrow-L4"}
    assert (
        focus["chosen"] == first["name"] and first["predicted_agreement"] >= focus["ranking"][1]["predicted_agreement"]
    )
    more = json.loads((out / "stages" / f"distill-more-{first['name']}" / "config.json").read_text())
    assert more["resume_from"] == str(out / "stages" / f"distill-{first['name']}") and more["stop_below"] == 0
    assert more["minutes"] == pytest.approx(focus["minutes"]) == pytest.approx(config.minutes * 0.22 / 2, abs=0.01)
    teacher_config = json.loads((out / "stages" / "teacher" / "config.json").read_text())
    assert (teacher_config["precision"], teacher_config["continuations"]) == ("q4", None)
    assert {"prune-cut-wide-L2", "distill-cut-wide-L2", "prune-cut-narrow-L4", "distill-cut-narrow-L4"} <= set(done)
    assert done["distill-cut-wide-L2"]["predicted_c"] > 0
    prune_config = json.loads((out / "stages" / "prune-cut-wide-L2" / "config.json").read_text())
    assert prune_config["target"] == stand_in_sibling and prune_config["dtype"] == "fp32"
    assert prune_config["data"].endswith("gen-data")
    distill_config = json.loads((out / "stages" / "distill-cut-wide-L2" / "config.json").read_text())
    assert (distill_config["dtype"], distill_config["target_dtype"]) == ("fp32", "q4")
    gen, teacher = distill_config["data"].split(",")  # gen-data's top-k beside the teacher's text
    assert gen.endswith("gen-data") and teacher.endswith("teacher") and distill_config["vocab_data"] == gen
    assert distill_config["minutes"] == pytest.approx(focus["minutes"] / 2) and distill_config["stop_below"] == 0
    cands, specs = build.read_candidates(design.Pipeline(config, out))
    assert specs[first["name"]].endswith(f"distill-more-{first['name']}/reduced")
    other = ({"cut-wide-L2", "cut-narrow-L4"} - {first["name"]}).pop()
    assert specs[other].endswith(f"distill-{other}/reduced")
    assert {x.name: x.source for x in cands}["cut-narrow-L4"] == stand_in_sibling
    assert {"cut-wide-L2", "cut-narrow-L4", "sibling"} <= set(done["select-drafter"]["speedup"])
    assert "cut-wide-L2" in done["verdict"]["candidates"]
    report = (out / "report.md").read_text()
    assert "cut-wide-L2" in report and "Wide-shallow vs deep-narrow" in report
    assert f"{first['name']} was trained on from its pilot" in report


@pytest.mark.slow
def test_where_one_cut_fits_both_are_ranked_untrained_and_the_first_gets_all_the_minutes(
    small_q4_gguf, stand_in_sibling, tmp_path, monkeypatch
):
    """The plan drops `control` (one cut's minutes): both cuts are still pruned and given a few seconds' pilot, the
    one ranked first at its agreement then trains for all the minutes under the stop rule, and the other is passed
    over: no agreement, benchmark or verdict of its own."""
    sibling = lambda spec, default: ("sibling", stand_in_sibling)  # noqa: E731
    monkeypatch.setattr(sys.modules["draftwise.design.candidates"], "FAMILY_RATIO", 0.0)
    monkeypatch.setattr(sys.modules["draftwise.design.cuts"], "family_model", sibling)
    monkeypatch.setattr(design, "family_model", sibling)
    monkeypatch.setattr(design.Pipeline, "dropped", lambda self, name: name == "control" or name in self.sizes.dropped)
    config = _small_q4_design(small_q4_gguf, dtype="q4", feature_drafter=False, narrow_factor=2)
    out = tmp_path / "design"
    design.run(config, out)
    done = design.Pipeline(config, out).done
    focus = done["focus-cuts"]
    first, second = focus["ranking"]
    assert focus["prerank"] and focus["chosen"] == first["name"]
    assert first["predicted_speedup"] >= second["predicted_speedup"]
    for name in ("cut-wide-L2", "cut-narrow-L4"):
        pilot = json.loads((out / "stages" / f"distill-{name}" / "config.json").read_text())
        assert pilot["minutes"] == cuts.PRERANK_MINUTES and pilot["stop_below"] == 0
    more = json.loads((out / "stages" / f"distill-more-{first['name']}" / "config.json").read_text())
    assert more["minutes"] == pytest.approx(focus["minutes"]) == pytest.approx(config.minutes * 0.22, abs=0.01)
    assert more["stop_below"] == pytest.approx(cost.optimistic_break_even(first["c"]))
    assert f"agree-{first['name']}" in done and f"agree-{second['name']}" not in done
    assert second["name"] not in done["select-drafter"]["speedup"]
    assert second["name"] not in done["verdict"]["candidates"]
    assert "was trained for all" in (out / "report.md").read_text()
