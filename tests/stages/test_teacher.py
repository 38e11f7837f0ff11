"""`draftwise teacher`: teacher-forced scores equal an unpadded forward's, the cache serves a second run without a
forward, a killed run resumes to the uninterrupted one's shards, text of another tokenizer is refused in one line, a
user's text is scored with eval prompts held out, and a lossy teacher's fidelity is recorded."""

import gc
import json
import weakref

import pytest
import torch

from conftest import save_checkpoint, tiny_config, tiny_model, tiny_tokenizer
from draftwise import data, shards
from draftwise.config import GenDataConfig, TeacherConfig
from draftwise.errors import DraftwiseError
from draftwise.rundir import read_records
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.registry import load
from draftwise.stages import gen_data, teacher
from faults import compare, draftwise, run_killed

SMALL = dict(suites="spec_bench,alpaca", tokens=400, seq_len=24, min_len=4, topk=4, shard_size=3, batch_size=2)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def rows_of(folder):
    records = [rec for rec in read_records(folder / "records.jsonl") if "file" in rec]
    return [r for rec in records for r in shards.read_shard(rec["file"])]


def test_scores_match_an_unpadded_forward_and_features_are_the_heads_input(tiny_dir, tmp_path, cache):
    out = teacher.run(TeacherConfig(target=tiny_dir, precision="fp32", **SMALL), tmp_path / "t")
    lm = load(tiny_dir, ModelOptions("fp32", "cpu", "lean")).lm
    rows = rows_of(out)
    assert sum(len(r["topk_ids"]) for r in rows) >= 400
    for row in rows[:5]:
        ids = row["tokens"][None]
        lm.reset(1, ids.shape[1])
        logits = lm.forward(ids, 0, None)[0, :-1]  # positions predicting tokens 1..end (prompt_len 1)
        p = torch.softmax(logits.float(), -1)
        top = p.topk(4, -1)
        assert torch.equal(row["topk_ids"], top.indices)
        assert torch.allclose(row["topk_probs"], top.values, atol=2e-3)  # stored as fp16
        features = lm.features(lm.last_hidden)[0, :-1]
        assert torch.allclose(row["hidden"], features, atol=0.05)  # stored as bf16


def test_a_second_run_reads_the_cache_and_computes_nothing(tiny_dir, tmp_path, cache, monkeypatch):
    config = TeacherConfig(target=tiny_dir, precision="fp32", **SMALL)
    first = teacher.run(config, tmp_path / "first")
    assert not any(r["cached"] for r in read_records(first / "records.jsonl"))

    def no_forward(*args, **kwargs):
        raise AssertionError("a cached shard was computed again")

    monkeypatch.setattr(teacher, "score", no_forward)
    second = teacher.run(config, tmp_path / "second")  # another candidate's or design's folder, same content
    records = read_records(second / "records.jsonl")
    assert records and all(r["cached"] for r in records)
    a, b = rows_of(first), rows_of(second)
    assert len(a) == len(b) and all(torch.equal(x["topk_ids"], y["topk_ids"]) for x, y in zip(a, b))
    assert "cached" in teacher.summary(records)


def test_a_killed_run_resumes_to_the_uninterrupted_shards(tiny_dir, tmp_path):
    args = ["teacher", "--target", tiny_dir, "--suites", "spec_bench,alpaca", "--tokens", "300", "--seq-len", "24"]
    args += ["--min-len", "4", "--topk", "4", "--shard-size", "2", "--precision", "fp32", "--no-cache"]
    args += ["--threads", "1"]
    reference = draftwise(args, tmp_path / "reference")
    out = run_killed(args, tmp_path / "killed", inside_write=2)
    compare(out, reference, key=lambda r: r.get("shard", -1), greedy=False)
    a, b = rows_of(reference), rows_of(out)
    assert len(a) == len(b) and all(torch.equal(x["hidden"], y["hidden"]) for x, y in zip(a, b))


def test_text_of_another_tokenizer_is_refused_in_one_line(tiny_dir, tmp_path, cache):
    model = save_checkpoint(tmp_path / "m", tiny_model(tiny_config(vocab=40), seed=3), tiny_tokenizer(vocab=40))
    other = gen_data.run(
        GenDataConfig(target=model, suites="alpaca", limit=2, max_new_tokens=3, temperatures=(0.0,), topk=2),
        tmp_path / "other",
    )
    with pytest.raises(DraftwiseError, match="another tokenizer") as e:
        teacher.run(TeacherConfig(target=tiny_dir, continuations=str(other), **SMALL), tmp_path / "t")
    assert "\n" not in str(e.value)


def test_gen_data_continuations_keep_their_prompt_as_context(tiny_dir, tmp_path, cache):
    gen = gen_data.run(
        GenDataConfig(target=tiny_dir, suites="alpaca", limit=3, max_new_tokens=5, temperatures=(0.0,), topk=4),
        tmp_path / "gen",
    )
    out = teacher.run(
        TeacherConfig(target=tiny_dir, continuations=str(gen), suites="none", topk=4, precision="fp32"), tmp_path / "t"
    )
    scored, generated = rows_of(out), shards.load_rows(gen, 10**6)
    assert [r["prompt_len"] for r in scored] == [r["prompt_len"] for r in generated]
    for a, b in zip(scored, generated):  # the same top-1 as the generation's own (greedy: the emitted token)
        assert torch.equal(a["topk_ids"][:, 0], b["topk_ids"][:, 0])


def test_user_text_is_scored_and_eval_prompts_are_held_out(tiny_dir, tmp_path, cache):
    held_out = data.load_prompts("alpaca", "eval", limit=1)[0].text
    f = tmp_path / "mine.txt"
    f.write_text("first paragraph of my own text, long enough to keep\n\n" + held_out + "\n\nand a third one here\n")
    out = teacher.run(
        TeacherConfig(target=tiny_dir, text=str(f), suites="none", min_len=4, topk=2, precision="fp32"),
        tmp_path / "t",
    )
    records = read_records(out / "records.jsonl")
    assert sum(r["sources"].get("text", 0) for r in records if "shard" in r) > 0
    texts = [r["tokens"].tolist() for r in rows_of(out)]
    tok = load(tiny_dir, ModelOptions("fp32", "cpu")).tokenizer
    assert tok(held_out)["input_ids"][:24] not in [t[:24] for t in texts]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DraftwiseError, match="line 1: expected a JSON object"):
        teacher.run(TeacherConfig(target=tiny_dir, text=str(bad), suites="none"), tmp_path / "bad")


def test_a_lossy_teacher_records_its_fidelity(tiny_dir, tmp_path, cache):
    out = teacher.run(TeacherConfig(target=tiny_dir, precision="bf16", **SMALL), tmp_path / "t")
    fid = [r for r in read_records(out / "records.jsonl") if r.get("event") == "fidelity"]
    assert len(fid) == 1 and 0.5 <= fid[0]["top1_agreement"] <= 1 and fid[0]["positions"] > 0
    assert "teacher top-1 = fp32 target's" in teacher.summary(read_records(out / "records.jsonl"))


def test_a_second_lossy_teacher_reads_its_fidelity_from_the_cache_without_the_fp32_target(
    tiny_dir, tmp_path, cache, monkeypatch
):
    first = teacher.run(TeacherConfig(target=tiny_dir, precision="bf16", **SMALL), tmp_path / "t1")
    loads = []
    real = teacher.load
    monkeypatch.setattr(teacher, "load", lambda path, options: loads.append(options.dtype) or real(path, options))
    second = teacher.run(TeacherConfig(target=tiny_dir, precision="bf16", **SMALL), tmp_path / "t2")
    assert loads == ["bf16"]  # the teacher itself, no fp32 copy

    def fid(out):
        return next(r for r in read_records(out / "records.jsonl") if r.get("event") == "fidelity")

    assert fid(second) == {**fid(first), "cached": True}
    other = teacher.run(
        TeacherConfig(target=tiny_dir, precision="bf16", **{**SMALL, "suites": "alpaca"}), tmp_path / "t3"
    )
    assert "cached" not in fid(other) and loads[-3:] == ["bf16", "fp32", "bf16"]  # other text: measured afresh


def test_the_fp32_target_never_sits_beside_the_teacher(tiny_dir, tmp_path, cache, monkeypatch):
    """The fidelity check puts the teacher down while the fp32 target runs (the 1.5B: 2.4 + 7.2 GB together)."""
    alive, real = [], teacher.load

    def load(path, options):
        if options.dtype == "fp32":
            gc.collect()
            assert all(ref() is None for ref in alive), "the teacher is still held beside the fp32 target"
        model = real(path, options)
        alive.append(weakref.ref(model.lm))
        return model

    monkeypatch.setattr(teacher, "load", load)
    out = teacher.run(TeacherConfig(target=tiny_dir, precision="bf16", **SMALL), tmp_path / "t")
    assert len(alive) == 3 and any(r.get("event") == "fidelity" for r in read_records(out / "records.jsonl"))


def test_another_model_of_the_same_tokenizer_is_scored_not_served_from_the_cache(
    tiny_dir, tiny_drafter_dir, tmp_path, cache
):
    """A family shares a tokenizer (Qwen2.5-Coder 0.5B and 1.5B): the cache keys the weights too."""
    first = teacher.run(TeacherConfig(target=tiny_dir, precision="fp32", **SMALL), tmp_path / "t1")
    other = teacher.run(TeacherConfig(target=tiny_drafter_dir, precision="fp32", **SMALL), tmp_path / "t2")
    shards_of = [r for r in read_records(other / "records.jsonl") if "file" in r]
    assert shards_of and not any(r["cached"] for r in shards_of)
    mine, theirs = rows_of(other), rows_of(first)
    assert [r["tokens"].tolist() for r in mine] == [r["tokens"].tolist() for r in theirs]  # the same text
    assert any(not torch.equal(a["topk_ids"], b["topk_ids"]) for a, b in zip(mine, theirs))
    lm = load(tiny_drafter_dir, ModelOptions("fp32", "cpu", "lean")).lm
    ids = mine[0]["tokens"][None]
    lm.reset(1, ids.shape[1])
    logits = lm.forward(ids, 0, None)[0, :-1]  # text pieces: prompt_len 1
    assert torch.equal(mine[0]["topk_ids"], logits.topk(4, -1).indices)  # the drafter's own scores


def test_config_refuses_nonsense():
    with pytest.raises(DraftwiseError, match="nothing to score"):
        TeacherConfig(suites="none")
    with pytest.raises(DraftwiseError, match="min_len"):
        TeacherConfig(seq_len=8, min_len=16)


def test_prune_and_distill_learn_from_a_teacher_folder(tiny_dir, tmp_path, cache):
    from draftwise.config import DistillConfig, PruneConfig
    from draftwise.stages import distill, prune

    data_dir = teacher.run(TeacherConfig(target=tiny_dir, precision="fp32", **SMALL), tmp_path / "t")
    pruned = prune.run(
        PruneConfig(target=tiny_dir, shape="layers=1", data=str(data_dir), calib_tokens=100, elimination_tokens=40),
        tmp_path / "p",
    )
    info = json.loads((pruned / "prune.json").read_text())["calibration"]
    assert info["source"] == str(data_dir) and info["new_tokens"] >= 100
    out = distill.run(
        DistillConfig(
            target=tiny_dir, drafter=str(pruned), data=str(data_dir), tokens=300, batch_size=4, eval_prompts=4
        ),
        tmp_path / "d",
    )
    evals = [r for r in read_records(out / "records.jsonl") if r["event"] == "eval"]
    assert evals[-1]["tokens"] >= 300 and (out / "checkpoint" / "config.json").exists()


def test_a_pass_holds_about_512_tokens_on_the_int8_kernel_and_8_sequences_on_torch():
    """Auto (0): the int8 kernel's passes are kept to ~512 rows, torch's matmul takes 8 sequences; a given size wins."""
    assert teacher.batch_size(TeacherConfig(seq_len=256), "q4") == 2
    assert teacher.batch_size(TeacherConfig(seq_len=64), "int8") == 8
    assert teacher.batch_size(TeacherConfig(seq_len=1024), "q4") == 1
    assert teacher.batch_size(TeacherConfig(seq_len=256), "bf16") == 8
    assert teacher.batch_size(TeacherConfig(seq_len=256, batch_size=3), "q4") == 3
    with pytest.raises(DraftwiseError, match="batch_size >= 0"):
        TeacherConfig(batch_size=-1)
