"""`design`'s rows: which rows a config asks for (lean-int8, lean-q4, llama.cpp's), and the built-in beside each
draftwise method."""

from __future__ import annotations

import shlex
from types import SimpleNamespace

import pytest

from draftwise.config import DesignConfig
from draftwise.design import costs, row_verdict, rows
from draftwise.errors import DraftwiseError
from draftwise.targets.source import default_gguf


def test_a_gguf_target_gets_its_own_file_then_each_requested_precision():
    planned = rows.planned(DesignConfig(target="default", gguf_quants=("q8_0",)))
    assert [(r.name, r.shipped, r.drafter_quant) for r in planned] == [
        ("lean-int8", False, "f32"),
        ("lean-q4", True, "f32"),  # the Q4_1 file's own blocks
        ("llama.cpp-Q4_1", True, "q8_0"),
        ("llama.cpp-Q8_0", False, "q8_0"),
    ]
    assert [(r.backend, r.dtype, r.target) for r in planned[:2]] == [
        ("lean", "int8", "default"),
        ("lean", "q4", "default"),
    ]
    assert planned[2].target == str(default_gguf())
    assert [rows.quality_runtime(r) for r in planned] == ["lean:int8", "lean:q4", "llama.cpp", "llama.cpp:q8_0"]
    assert rows.planned(DesignConfig(target="default", rows=("lean",))) == []
    assert [r.name for r in rows.planned(DesignConfig(target="default", rows=("lean", "lean-int8")))] == ["lean-int8"]
    assert rows.planned(DesignConfig(target="default", rows=("lean", "lean-int8", "lean-q4"), device="cuda")) == []
    outline = costs.Outline.of(DesignConfig(target="default", rows=("lean", "lean-q4", "llama.cpp")))
    assert (outline.lean_rows, outline.rows) == (("lean-q4",), 1)  # the plan prices the rows the design will have


def test_an_hf_target_runs_in_llama_cpp_as_an_f32_copy(tiny_dir):
    planned = rows.planned(DesignConfig(target=tiny_dir, gguf_quants=("f32", "q8_0")))
    assert [(r.quant, r.shipped) for r in planned] == [("INT8", False), ("F32", False), ("Q8_0", False)]  # f32 once
    assert costs.Outline.of(DesignConfig(target=tiny_dir)).lean_rows == ("lean-int8",)  # no 4-bit blocks: no lean-q4


def test_engines_need_lean_and_gguf_quants_need_llama_cpp():
    with pytest.raises(DraftwiseError, match="rows must include lean"):
        DesignConfig(rows=("llama.cpp",))
    with pytest.raises(DraftwiseError, match="add llama.cpp"):
        DesignConfig(rows=("lean",), gguf_quants=("q8_0",))
    with pytest.raises(DraftwiseError, match="unknown GGUF quantization"):
        DesignConfig(gguf_quants=("q4_k",))
    with pytest.raises(DraftwiseError, match="takes its candidates as they are"):
        DesignConfig(dtype="int8", budget="7M")  # a study at int8 prunes nothing (design/study.py)


def test_nearest_builtins_carry_the_draftwise_settings(tiny_dir):
    assert (
        rows.nearest_builtin("ngram:min=1,max=3", 2, tiny_dir, "f32")
        == "--spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m 2"
    )
    assert (
        rows.nearest_builtin("suffix:somewhere,factor=2", 4, tiny_dir, "f32")
        == "--spec-type ngram-cache --spec-draft-n-max 4"
    )
    model = shlex.split(rows.nearest_builtin("layers:0,1", 3, tiny_dir, "f32"))
    assert model[:2] == ["--spec-type", "draft-simple"] and model[-2:] == ["--spec-draft-n-max", "3"]
    assert model[model.index("-md") + 1].endswith(".gguf")
    assert row_verdict.short_args("llama-server:" + shlex.join(model)).split()[3] == model[3].rsplit("/", 1)[-1]
    assert row_verdict.short_args("llama-server") == "(plain)"


def test_each_runtime_is_a_row_kind_behind_one_interface(tiny_dir):
    """lean and llama.cpp rows differ only through their kind: built-ins, peers, quality runtime, label, export."""
    lean, q4, own, copy = rows.planned(DesignConfig(target="default", gguf_quants=("q8_0",)))
    assert (type(lean), type(q4), type(own), type(copy)) == (
        rows.LeanRow,
        rows.LeanRow,
        rows.LlamaCppRow,
        rows.LlamaCppRow,
    )
    assert lean.nearest("ngram", 3) is None and lean.peers({}) == ()
    assert own.nearest("ngram:max=3", 2) == "llama-server:" + rows.nearest_builtin("ngram:max=3", 2, own.target, "q8_0")
    assert own.peers({"ngram": "llama-server:--spec-type ngram-simple"})[:2] == ("llama-cpp", "llama-server")
    for e in (lean, own):  # stage records are the same for every kind: the verdict's backend names the kind again
        assert rows.kind_of({"backend": e.backend}) is type(e)
    assert rows.kind_of({}) is rows.LlamaCppRow  # a verdict written before lean rows existed
    assert rows.runtime_label({"quant": "Q4_1", "shipped": True}) == "llama.cpp Q4_1 (the file the target ships as)"
    assert rows.runtime_label({"backend": "lean", "dtype": "int8"}).startswith("the draftwise lean engine at int8")
    assert "own 4-bit blocks" in rows.runtime_label({"backend": "lean", "dtype": "q4"})
    profile = lean.profile_config(SimpleNamespace(seed=0, threads=1), ("layers:0",))
    assert (profile.backend, profile.dtype, profile.drafters, profile.batches) == ("lean", "int8", ("layers:0",), (1,))


def test_the_nearest_builtin_of_a_hybrid_is_its_parts_in_turn(tiny_dir):
    args = rows.nearest_builtin("hybrid:layers:0,1+suffix:somewhere,model_gamma=2", 4, tiny_dir, "f32")
    assert args.startswith("--spec-type ngram-cache,draft-simple --spec-draft-n-max 4 -md ")
    assert args.endswith(".gguf --spec-draft-n-max 2")
