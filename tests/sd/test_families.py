"""Drafter families as plug-ins: a new lookup family is one module (`repeat_family.py`) that registers itself, and every
part of draftwise that asks about drafters — spec parsing and loading, the kind, the loop, the design's tuning grid,
llama-server's nearest built-in, the vLLM / transformers export, llama-cpp-python's adapter — then knows it, from the
family or from `LookupFamily`'s defaults."""

from __future__ import annotations

import importlib
import json

import pytest
import torch
from test_loop import GREEDY, PROMPTS, lean

from conftest import tiny_config
from draftwise import specs
from draftwise.config import BenchConfig
from draftwise.design import export, lookup, rows
from draftwise.design.measure import SCHEDULED
from draftwise.errors import DraftwiseError
from draftwise.sd import families
from draftwise.sd.batched_sd import generate_batch_sd
from draftwise.sd.families import REGISTRY, Setting, drafter_kind, hybrid
from draftwise.sd.llama_draft import LookupDraftModel
from draftwise.sd.loop import generate


@pytest.fixture
def repeat():
    """The `repeat` module imported (registering its family), and the registry as it was afterwards."""
    saved = dict(REGISTRY)
    module = importlib.reload(importlib.import_module("repeat_family"))
    yield module
    REGISTRY.clear()
    REGISTRY.update(saved)


def test_the_built_in_families_and_their_kinds():
    assert list(REGISTRY) == ["ngram", "suffix", "hybrid", "feature", "model"]
    assert [drafter_kind(s) for s in ("ngram:max=3", "suffix:/x,factor=2", "hybrid:a+ngram", "layers:0", "/ckpt")] == [
        "lookup",
        "lookup",
        "hybrid",
        "model",
        "model",
    ]
    assert all(f.description and f.usage for f in REGISTRY.values())
    assert "repeat" not in REGISTRY  # a plug-in joins only when its module is imported


def test_a_new_family_parses_loads_and_joins_hybrids(repeat):
    assert families.family_of("repeat") is repeat.FAMILY and drafter_kind("repeat") == "lookup"
    loaded = specs.load("repeat", None)
    assert loaded.kind == "lookup" and isinstance(loaded.loop_drafter, repeat.RepeatDrafter)
    assert loaded.describe() == {"spec": "repeat", "kind": "lookup", "lookup": {"method": "repeat"}}
    with pytest.raises(DraftwiseError, match="unknown option 'n=2'"):
        specs.load("repeat:n=2", None)
    assert hybrid.split("hybrid:layers:0+repeat,model_gamma=2") == ("layers:0", "repeat", 2)
    with pytest.raises(DraftwiseError, match="ngram\\|suffix\\|repeat spec"):
        hybrid.split("hybrid:layers:0")
    specs.check(BenchConfig(drafter="repeat", baselines=("ar", "llama-cpp-lookup")))  # a lookup for llama-cpp-python
    with pytest.raises(DraftwiseError, match="hf-assisted needs a model drafter, not a lookup"):
        specs.check(BenchConfig(drafter="repeat", baselines=("hf-assisted",)))


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_sd_with_the_new_family_is_identical_to_greedy_ar(repeat, gamma):
    target = lean(tiny_config(vocab=64, layers=3), seed=11)
    drafter = specs.load("repeat", None).loop_drafter
    rounds = []
    for prompt in PROMPTS:
        ar = generate(target, prompt, GREEDY, 40, torch.Generator())
        sd = generate(target, prompt, GREEDY, 40, torch.Generator(), drafter=drafter, gamma=gamma)
        assert sd.tokens == ar.tokens
        rounds += sd.rounds
    assert any(r.drafted for r in rounds) and all(r.source in ("lookup", "") for r in rounds)
    batched, _ = generate_batch_sd(target, PROMPTS, GREEDY, 40, torch.Generator(), drafter=drafter, gamma=gamma)
    assert [g.tokens for g in batched] == [generate(target, p, GREEDY, 40, torch.Generator()).tokens for p in PROMPTS]


def test_the_design_tunes_the_new_family_with_its_grid_or_its_default(repeat, monkeypatch):
    docs = [
        {"prompt_id": f"p{i}", "suite": "s", "prompt": [1, 2, 3], "continuation": [3, 3, 3, 4, 3, 3] * 3}
        for i in range(3)
    ]
    t_verify = lambda g: 0.01 * (1 + 0.1 * g)  # noqa: E731
    mine = [r for r in lookup.settings_rows(docs, t_verify, None, None) if r["method"] == "repeat"]
    assert [(r["spec"], r["gamma"], r["settings"]) for r in mine] == [("repeat", g, {}) for g in lookup.GAMMAS]
    assert all(r["alpha"] > 0 for r in mine)
    own = [Setting("repeat", {"k": 1}, repeat.RepeatDrafter())]  # a family that gives its own grid
    monkeypatch.setattr(repeat.Repeat, "grid", lambda self, data, target: own)
    assert {
        r["settings"]["k"] for r in lookup.settings_rows(docs, t_verify, None, None) if r["method"] == "repeat"
    } == {1}
    tuned = {
        "event": "done",
        "repeat": {"spec": "repeat", "gamma": 2},
        "hybrid": {"spec": "hybrid:a+repeat", "gamma": 2},
    }
    assert lookup.tuned_candidates(tuned) == [("repeat", "lookup", "repeat"), ("hybrid", "hybrid", "hybrid:a+repeat")]
    assert lookup.scheduled_options(["repeat", "wide-L1"]) == {"repeat" + SCHEDULED: "repeat"}


def test_the_new_familys_builtins_and_exports_default_to_prompt_lookup(repeat, monkeypatch, tmp_path):
    assert (
        rows.nearest_builtin("repeat", 3, "default", "f32")
        == "--spec-type ngram-simple --spec-ngram-simple-size-n 4 --spec-ngram-simple-size-m 3"
    )
    assert rows.nearest_builtin("hybrid:layers:0+repeat", 3, "default", "f32").startswith(
        "--spec-type ngram-simple,draft-simple --spec-ngram-simple-size-n 4"
    )
    assert export.vllm_lookup("repeat", 3) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 1,
        "prompt_lookup_max": 4,
    }
    assert export.export_lookup(tmp_path, "repeat", "rep", 3) == "repeat"
    readme = (tmp_path / "README.md").read_text()
    assert readme.startswith("# Exported drafter: rep (`repeat`, γ = 3") and "prompt_lookup_num_tokens=3" in readme
    own = {"method": "repeat", "num_speculative_tokens": 3}  # a family that has its own vLLM method gives it
    monkeypatch.setattr(repeat.Repeat, "vllm", lambda self, spec, gamma: own)
    export.export_lookup(tmp_path, "repeat", "rep", 3)
    assert json.loads((tmp_path / "vllm_speculative_config.json").read_text()) == own
    draft = LookupDraftModel.from_spec("repeat", 2)  # llama-cpp-python's draft model, as the export's snippet runs it
    assert draft([5, 6, 7]).tolist() == [7, 7]
