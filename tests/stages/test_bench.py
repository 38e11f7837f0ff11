import json
from dataclasses import replace

import pytest

from draftwise.config import BenchConfig
from draftwise.errors import DraftwiseError
from draftwise.stages import bench


def config(tiny_dir, **kw):
    base = dict(
        target=tiny_dir,
        drafter="layers:0,2",
        gamma=3,
        suite="spec_bench",
        limit=3,
        max_new_tokens=12,
        baselines=("ar", "hf-generate", "hf-assisted"),
        warmup=0,
    )
    base.update(kw)
    return BenchConfig(**base)


def test_bench_writes_run_folder_and_summary(tiny_dir, tmp_path, capsys):
    out = bench.run(config(tiny_dir), tmp_path / "run")
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 4
    assert json.loads((out / "config.json").read_text())["drafter"] == "layers:0,2"
    summary = json.loads((out / "summary.json").read_text())
    for key in ("tokens_per_s", "tar", "alpha", "acceptance_per_position", "speedup_vs_ar", "greedy_identical_to_ar"):
        assert key in summary
    assert set(summary["baselines"]) == {"ar", "hf-generate", "hf-assisted"}
    assert summary["greedy_identical_to_ar"] == 1.0
    # transformers' greedy decoding of the same weights gives the same tokens
    assert summary["baselines"]["hf-generate"]["identical_to_ar"] == 1.0
    assert summary["baselines"]["hf-assisted"]["identical_to_ar"] == 1.0
    assert len(summary["acceptance_per_position"]) == 3
    assert "hf-assisted" in capsys.readouterr().out


def test_plain_decoding_is_set_against_the_machines_bandwidth_limit(tiny_dir, tmp_path, capsys):
    """Plain methods' records carry the weight bytes a step reads; the summary, the measured bandwidth and each plain
    method's share of its limit (decode tokens/s × bytes per step ÷ bandwidth); machine.json says where it ran."""
    from draftwise.runtimes.registry import load

    out = bench.run(config(tiny_dir, baselines=("ar", "hf-generate"), limit=2), tmp_path / "run")
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    fp32 = load(tiny_dir).weight_bytes()
    assert {r["bytes_per_step"] for r in records if r["method"] in ("ar", "hf-generate")} == {fp32}
    assert all("bytes_per_step" not in r for r in records if r["method"] == "sd")  # SD is no plain decoding
    summary = json.loads((out / "summary.json").read_text())
    here, ar = summary["machine"], summary["methods"]["ar"]
    bw = here["bandwidth"]["read_gb_per_s"]
    assert bw > 0 and json.loads((out / "machine.json").read_text())["bandwidth"] == here["bandwidth"]
    assert ar["bandwidth_share"] == pytest.approx(ar["decode_tokens_per_s"] * fp32 / (bw * 1e9))
    assert summary["methods"]["sd"]["bandwidth_share"] is None
    assert "of the measured read bandwidth" in capsys.readouterr().out


def test_bench_resumes_without_redoing_finished_work(tiny_dir, tmp_path):
    cfg = config(tiny_dir, baselines=("ar",))
    out = bench.run(cfg, tmp_path / "run")
    lines = (out / "records.jsonl").read_text().splitlines()
    # simulate a crash: the last record was cut mid-write
    (out / "records.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    bench.run(cfg, out)
    redone = (out / "records.jsonl").read_text().splitlines()
    assert redone[:-1] == lines[:-1] and len(redone) == len(lines)
    assert json.loads(redone[-1])["prompt_id"] == json.loads(lines[-1])["prompt_id"]


def test_bench_refuses_a_folder_with_another_config(tiny_dir, tmp_path):
    bench.run(config(tiny_dir, baselines=("ar",), limit=1), tmp_path / "run")
    with pytest.raises(DraftwiseError, match="different config .*gamma"):
        bench.run(config(tiny_dir, baselines=("ar",), limit=1, gamma=2), tmp_path / "run")


def test_sampled_bench_runs(tiny_dir, tmp_path):
    out = bench.run(
        config(tiny_dir, temperature=0.8, top_p=0.9, baselines=("ar", "hf-assisted"), limit=2), tmp_path / "r"
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["greedy_identical_to_ar"] is None and summary["tar"] >= 1


def test_user_prompt_file(tiny_dir, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2 w3\nw4 w5\n")
    out = bench.run(config(tiny_dir, prompts=str(prompts), baselines=()), tmp_path / "r")
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["prompt_id"] for r in records] == ["user/1", "user/2"]


def test_batched_bench_gives_the_batch1_tokens(tiny_dir, tmp_path):
    one = bench.run(config(tiny_dir, baselines=("ar",), limit=5), tmp_path / "b1")
    four = bench.run(config(tiny_dir, baselines=("ar",), limit=5, batch_size=4), tmp_path / "b4")
    rec1 = [json.loads(line) for line in (one / "records.jsonl").read_text().splitlines()]
    rec4 = [json.loads(line) for line in (four / "records.jsonl").read_text().splitlines()]
    assert [r["batch"] for r in rec4 if r["method"] == "sd"] == [4, 1]  # 5 prompts: a batch of 4, then 1
    by_prompt = {r["prompt_id"]: r["tokens"] for r in rec1 if r["method"] == "sd"}
    batched = [t for r in rec4 if r["method"] == "sd" for t in r["tokens"]]
    ids = [i for r in rec4 if r["method"] == "sd" for i in r["prompt_id"].split("+")]
    assert batched == [by_prompt[i] for i in ids]
    assert json.loads((four / "summary.json").read_text())["greedy_identical_to_ar"] == 1.0
    with pytest.raises(DraftwiseError, match="batch_size > 1"):
        config(tiny_dir, batch_size=2)  # transformers baselines are batch-1


def test_a_lookup_drafter_beside_transformers_prompt_lookup(tiny_dir, tmp_path):
    out = bench.run(
        config(
            tiny_dir, drafter="ngram:max=3", gamma=4, limit=3, max_new_tokens=24, baselines=("ar", "hf-prompt-lookup")
        ),
        tmp_path / "run",
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["greedy_identical_to_ar"] == 1.0
    assert summary["baselines"]["hf-prompt-lookup"]["identical_to_ar"] == 1.0
    sd = summary["methods"]["sd"]
    assert 0 < sd["proposed_fraction"] <= 1 and sum(sd["proposal_lengths"].values()) == sd["rounds"]
    assert set(sd["by_source"]) == {"lookup"} and sd["propose_ms"] < min(
        sd["verify_ms"].values()
    )  # ~free next to a pass
    assert summary["drafter"]["lookup"] == {"method": "ngram", "min": 1, "max": 3}


def test_a_learning_suffix_corpus_never_holds_the_output_of_the_prompt_being_decoded(tiny_dir, tmp_path):
    cfg = config(tiny_dir, drafter="suffix,learn=1", gamma=3, limit=3, max_new_tokens=16, baselines=("ar",), warmup=1)
    runner = bench.BenchWork(cfg)()
    lookup = runner.drafter.lookup
    seen = []  # (prompt id being decoded, prompt ids whose outputs are in the corpus) at every SD call
    start = lookup.start
    lookup.start = lambda prompts, *a, **k: (seen.append((current[0], set(lookup.learned))), start(prompts, *a, **k))[1]
    units = bench.units(cfg, runner.prompts, runner.encoded)
    for unit in units + units[:1]:  # the first prompt again: its own earlier output must be out of the corpus
        current = [runner.prompts[unit[0]].id]
        runner((unit, "ar"))
        assert len(lookup.learned) == len({s for s, _ in seen})  # AR and warm-ups add nothing
        runner((unit, "sd"))
    assert all(pid not in held for pid, held in seen)
    assert set(lookup.learned) == {runner.prompts[u[0]].id for u in units}  # every finished SD output joined
    # a resumed run puts back what its finished records added
    resumed = bench.Runner(
        cfg,
        runner.target,
        bench.load_models(cfg)[1],
        [{"method": "sd", "prompt_id": runner.prompts[units[0][0]].id, "batch": 1, "tokens": [5, 6, 7]}],
    )
    assert set(resumed.drafter.lookup.learned) == {runner.prompts[units[0][0]].id}


def test_configs_that_cannot_run_are_refused(tiny_dir, tmp_path):
    with pytest.raises(DraftwiseError, match="hf-assisted needs a model drafter, not a lookup"):
        bench.run(config(tiny_dir, drafter="ngram"), tmp_path / "a")  # the drafter's kind: `specs.check`
    with pytest.raises(DraftwiseError, match="hybrid drafters run at batch size 1"):
        bench.run(config(tiny_dir, drafter="hybrid:layers:0+ngram", baselines=("ar",), batch_size=2), tmp_path / "b")
    assert not (tmp_path / "a").exists()  # refused before its run folder


def test_the_summary_says_where_sd_parts_from_ar(tiny_dir):
    def rec(method, pid, tokens):
        return {
            "method": method,
            "prompt_id": pid,
            "tokens": tokens,
            "new_tokens": len(tokens),
            "seconds": 1.0,
            "suite": "spec_bench",
        }

    records = [rec("ar", 0, [1, 2, 3, 4]), rec("ar", 1, [5, 6, 7]), rec("sd", 0, [1, 2, 9, 9]), rec("sd", 1, [5, 6, 7])]
    summary = bench.summarize(records, config(tiny_dir, baselines=("ar",)))
    assert summary["greedy_identical_to_ar"] == 0.5
    assert summary["methods"]["sd"]["divergence"]["first"] == [2]  # two identical tokens, then they part
    assert "differs from AR on 1 prompt(s), first after 2–2" in bench.format_table(summary)


def test_scheduled_sd_beside_static_sd_and_a_resume_that_relearns_the_same_calibration(tiny_dir, tmp_path):
    from draftwise.config import ProfileConfig
    from draftwise.stages import profile

    prof = profile.run(
        ProfileConfig(target=tiny_dir, depths=(1,), gammas=(1, 2, 4), batches=(1,), context=16, warmup=0, repeats=2),
        tmp_path / "profile",
    )
    c = config(tiny_dir, drafter="ngram:min=1,max=3", gamma=4, baselines=("ar",), limit=3, schedule=str(prof))
    out = bench.run(c, tmp_path / "run")
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    scheduled = [r for r in records if r["method"] == bench.SCHEDULED]
    assert len(scheduled) == 3 and all("schedule" in rd for r in scheduled for rd in r["rounds"] if rd["drafted"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["methods"][bench.SCHEDULED]["identical_to_ar"] == 1.0
    sched = summary["methods"][bench.SCHEDULED]["schedule"]
    rounds = [rd for r in scheduled for rd in r["rounds"] if "schedule" in rd]
    assert sum(sched["k"].values()) == len(rounds) and sum(c["positions"] for c in sched["calibration"]) == sum(
        len(rd["schedule"]["observed"]) for rd in rounds
    )
    fresh = bench.Runner(c, *bench.load_models(c))  # the run again, in memory (warm-up runs teach nothing)
    for unit in bench.units(c, fresh.prompts, fresh.encoded):
        fresh((unit, bench.SCHEDULED))
    resumed = bench.Runner(c, *bench.load_models(c), records)  # what a resumed run starts from
    assert (
        fresh.fns[bench.SCHEDULED].scheduler.calibration.counts
        == resumed.fns[bench.SCHEDULED].scheduler.calibration.counts
        != {}
    )
    seeded = bench.Runner(replace(c, calibration=str(out)), *bench.load_models(c))  # a new run seeded by this one
    assert (
        seeded.fns[bench.SCHEDULED].scheduler.calibration.counts
        == resumed.fns[bench.SCHEDULED].scheduler.calibration.counts
    )
    from draftwise.sd import calibrate  # a calibration measured before the run (a design's calibrate-lookup)

    calibrate.write(tmp_path / "cal", {"temperatures": {"0": {"positions": 3, "counts": {"own|p1": [3, 2.0]}}}})
    measured = bench.Runner(replace(c, calibration=str(tmp_path / "cal")), *bench.load_models(c))
    assert measured.fns[bench.SCHEDULED].scheduler.calibration.counts == {"own|p1": [3, 2.0]}
    with pytest.raises(DraftwiseError, match="no calibration at T=0.5"):
        bench.Runner(replace(c, temperature=0.5, calibration=str(tmp_path / "cal")), *bench.load_models(c))
    with pytest.raises(DraftwiseError, match="no scheduled rounds of ngram:min=1,max=2 at T=0"):
        bench.Runner(replace(c, drafter="ngram:min=1,max=2", calibration=str(out)), *bench.load_models(c))
    with pytest.raises(DraftwiseError, match="schedule needs a drafter"):
        config(tiny_dir, drafter=None, schedule=str(prof))
    with pytest.raises(DraftwiseError, match="give --schedule too"):
        config(tiny_dir, calibration=str(out))
