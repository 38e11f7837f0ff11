"""`design` end to end on a tiny random target, a kill and a resume, and the candidate shapes."""

from __future__ import annotations

import json

import pytest

from draftwise import cost
from draftwise.config import DesignConfig
from draftwise.errors import DraftwiseError
from draftwise.stages import design
from draftwise.stages.design.candidates import (
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


def test_design_end_to_end_killed_and_resumed(tiny_dir, tmp_path, monkeypatch):
    config = DesignConfig(target=tiny_dir, minutes=0.3, wide_layers=(1,), narrow_factor=2, bench_limit=3, headline_limit=2,
                          max_new_tokens=8, accuracy_items=3, draft_vocabs=(32, 16), threads=1)
    out = tmp_path / "design"

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    monkeypatch.setattr(design.agree, "run", killed)
    with pytest.raises(RuntimeError, match="killed"):
        design.run(config, out)
    monkeypatch.undo()
    finished = [json.loads(line)["stage"] for line in (out / "records.jsonl").read_text().splitlines()]
    assert {"gen-data", "prune-wide-L1", "distill-wide-L1", "prune-narrow-L2", "distill-narrow-L2", "profile"} <= set(finished)

    calls = []
    for stage in (design.gen_data, design.prune, design.distill, design.profile):
        original = stage.run
        monkeypatch.setattr(stage, "run", lambda *a, _o=original, _n=stage.__name__, **k: (calls.append(_n), _o(*a, **k))[1])
    design.run(config, out)
    assert calls == []  # nothing finished before the kill was redone

    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    stages = [r["stage"] for r in records]
    assert len(stages) == len(set(stages))
    chosen = next(r["drafter"] for r in records if r["stage"] == "select-drafter")
    assert chosen in {"wide-L1", "narrow-L2", "first-1", "self-spec"}
    report = (out / "report.md").read_text()
    for section in ("Headline", "TAR per task", "Drafters", "Wide-shallow vs deep-narrow", "Where the time goes",
                    "Accuracy sanity check", "Reduced-vocabulary draft head and adaptive lookahead", "Export"):
        assert section in report
    for png in ("tar_per_task", "tokens_per_s", "predicted_vs_measured", "kv_footprint", "accuracy_vs_tar",
                "verify_vs_gamma", "step_vs_layers", "latency_vs_width"):
        assert (out / "plots" / f"{png}.png").exists()
    assert "data:image/png;base64," in (out / "report.html").read_text()
    headline = json.loads((out / "stages" / "bench-headline" / "summary.json").read_text())
    assert headline["methods"]["sd"]["identical_to_ar"] == 1.0  # greedy SD stays lossless inside the pipeline
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out / "export" / "drafter")
    vllm = json.loads((out / "export" / "vllm_speculative_config.json").read_text())
    assert {"vocab-32", "bench-vocab-16", "select-vocab", "bench-adaptive"} <= set(stages)
    if next(r["vocab"] for r in records if r["stage"] == "select-vocab"):
        assert (out / "export" / "drafter-reduced-vocab" / "draft_vocab.json").exists()
    assert vllm["num_speculative_tokens"] == next(r["gamma"] for r in records if r["stage"] == "select-gamma")
