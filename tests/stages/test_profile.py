import json

from draftwise.config import ProfileConfig
from draftwise.stages import profile


def cfg(tiny_dir, **kw):
    base = dict(
        target=tiny_dir,
        drafters=("layers:0,3",),
        depths=(1, 2),
        gammas=(1, 2, 4),
        batches=(1, 2),
        context=16,
        warmup=1,
        repeats=3,
    )
    base.update(kw)
    return ProfileConfig(**base)


def test_profile_writes_summary_and_plots(tiny_dir, tmp_path):
    out = profile.run(cfg(tiny_dir), tmp_path / "p")
    summary = json.loads((out / "profile.json").read_text())
    b1 = summary["batches"]["1"]
    assert set(b1["verify_ms"]) == {"1", "2", "4"} and b1["ar_step_ms"] > 0 and b1["head_ms"] > 0
    assert set(b1["drafters"]) == {"layers:0", "layers:0,1", "layers:0,3"}
    d = b1["drafters"]["layers:0,3"]
    assert d["layers"] == 2 and 0 < d["head_share"] and 0 < d["cycle"]["4"]["draft_share"] < 1
    assert b1["depth_fit"]["per_layer_ms"] is not None
    assert d["catch_up_ms"] > 0 and summary["batches"]["2"]["drafters"]["layers:0,3"]["catch_up_ms"] is None
    assert b1["drafters"]["layers:0"]["catch_up_ms"] is None  # the depth truncations time a step only
    assert (out / "verify_vs_gamma.png").stat().st_size > 0 and (out / "step_vs_layers.png").stat().st_size > 0


def test_profile_resumes_only_missing_points(tiny_dir, tmp_path):
    config = cfg(tiny_dir, batches=(1,))
    out = profile.run(config, tmp_path / "p")
    lines = (out / "records.jsonl").read_text().splitlines()
    (out / "records.jsonl").write_text("\n".join(lines[:3]) + "\n")  # killed after 3 points
    profile.run(config, out)
    again = (out / "records.jsonl").read_text().splitlines()
    assert again[:3] == lines[:3] and len(again) == len(lines)
    profile.run(config, out)  # finished: nothing is redone
    assert (out / "records.jsonl").read_text().splitlines() == again


def test_profile_on_the_transformers_backend(tiny_dir, tmp_path):
    out = profile.run(cfg(tiny_dir, backend="transformers", batches=(1,), depths=(1,)), tmp_path / "p")
    summary = json.loads((out / "profile.json").read_text())
    assert summary["batches"]["1"]["verify_ms"]["4"] > 0 and "layers:0,3" in summary["batches"]["1"]["drafters"]


def test_a_lookup_drafter_is_timed_by_its_proposal(tiny_dir, tmp_path):
    """A lookup drafter has no forward step: its point is one round's proposal at `context` tokens of real text,
    after which the index is rolled back (every repeat sees the same index)."""
    out = profile.run(
        cfg(tiny_dir, drafters=("ngram:max=4", "layers:0,3"), batches=(1,), depths=(1,), context=64), tmp_path / "p"
    )
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records if r["model"] == "ngram:max=4"} == {"propose"}
    d = json.loads((out / "profile.json").read_text())["batches"]["1"]["drafters"]["ngram:max=4"]
    assert d["kind"] == "lookup" and 0 < d["step_ms"] and 0 < d["c"] < 1
    text = profile.real_text(profile.load_models(cfg(tiny_dir))["target"], 64)
    assert len(text) == 64 and len(set(text)) > 1


def test_profile_on_llama_cpp(tiny_dir, tiny_drafter_dir, tmp_path):
    """The verify curve and drafter steps in llama.cpp (drafters written as GGUF); it has no LM-head-alone point."""
    config = cfg(tiny_dir, backend="llama.cpp", drafters=(tiny_drafter_dir, "layers:0,3", "ngram"), batches=(1, 2))
    out = profile.run(config, tmp_path / "p")
    summary = json.loads((out / "profile.json").read_text())
    for b in ("1", "2"):
        entry = summary["batches"][b]
        assert set(entry["verify_ms"]) == {"1", "2", "4"} and entry["head_ms"] is None
        assert {"layers:0", "layers:0,1", "layers:0,3", tiny_drafter_dir, "ngram"} == set(entry["drafters"])
        assert all(d["step_ms"] > 0 for d in entry["drafters"].values())
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in records} == {"step", "verify", "propose"}
    assert all(r["machine"]["engine"] == "llama.cpp" and r["machine"]["quant"] == "F32" for r in records)
