"""GGUF export: every family the lean forward runs, written as GGUF, gives the lean forward's logits in llama.cpp."""

import json
import shutil
from pathlib import Path

import gguf
import pytest
import torch

from conftest import ROPE_SCALINGS, save_checkpoint, tiny_config, tiny_model, tiny_tokenizer
from draftwise.cli import main
from draftwise.errors import DraftwiseError
from draftwise.gguf.export import export
from draftwise.gguf.vocab import read_tokenizer
from draftwise.gguf.write import write_gguf
from draftwise.runtimes.llamacpp import lm as llamacpp
from draftwise.runtimes.registry import load, load_drafter
from draftwise.targets.checkpoint import read_weights
from draftwise.targets.family import FAMILIES

SWA_4 = ["sliding_attention", "full_attention"] * 2
CASES = {
    "llama": dict(kind="llama"),
    "llama-untied-mha-bias": dict(
        kind="llama", tie_word_embeddings=False, num_key_value_heads=4, attention_bias=True, mlp_bias=True
    ),
    "llama-head-dim-16": dict(kind="llama", head_dim=16),
    **ROPE_SCALINGS,
    "mistral": dict(kind="mistral"),
    "qwen2-qkv-bias": dict(kind="qwen2", tie_word_embeddings=False),
    "qwen3-qk-norm": dict(kind="qwen3", tie_word_embeddings=False),
    "phi3-fused": dict(kind="phi3", tie_word_embeddings=False),
    "gemma": dict(kind="gemma"),
    # windows of 4 in a 12-token sequence, local and global layers, and query_pre_attn_scalar != head_dim (folded)
    "gemma2-local-global-scalar": dict(kind="gemma2", layers=4, query_pre_attn_scalar=16),
    "gemma2-global-only": dict(kind="gemma2", layer_types=["full_attention"] * 2),
    "gemma3-local-global-two-ropes": dict(
        kind="gemma3_text",
        layers=4,
        layer_types=SWA_4,
        query_pre_attn_scalar=16,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0},
        },
    ),
    "gemma3-untied": dict(
        kind="gemma3_text",
        layers=3,
        tie_word_embeddings=False,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"],
    ),
}
# llama.cpp's CPU GELU reads an fp16 table (ggml's GGML_GELU_FP16): the GeGLU families agree to ~1e-3, not 1e-6
GELU_ATOL = 1e-2
ATOL = 1e-4


@pytest.fixture
def exact():
    """llama.cpp's context defaults (an f16 KV cache, a CPU flash-attention kernel that rounds q to f16) move tiny
    models' logits by ~1e-2: comparisons with the torch forward run `LlamaCppLM(exact=True)` (`cpp`)."""
    try:
        llamacpp._lib()
    except DraftwiseError as e:
        pytest.skip(str(e))


def cpp(path):
    return llamacpp.LlamaCppLM(llamacpp.LlamaCppModel(path, threads=2), exact=True)


def passes(lm, ids):
    """Logits [1, 12, V] of a prefill, a step, a rejected 4-token draft and two passes over the real tokens from the
    rolled-back position (the rollback must leave the cache as if the draft had never been)."""
    lm.reset(1, 64)
    first = [lm.forward(ids[:, :6], 0, None), lm.forward(ids[:, 6:7], 6, None)]
    lm.forward(torch.tensor([[7, 8, 9, 10]]), 7, None)
    return torch.cat(first + [lm.forward(ids[:, 7:10], 7, None), lm.forward(ids[:, 10:], 10, None)], dim=1)


IDS = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))


def checkpoint(tmp_path, **case):
    return save_checkpoint(tmp_path / "hf", tiny_model(tiny_config(**case), seed=3), tiny_tokenizer())


def test_cases_cover_every_family():
    assert {case["kind"] for case in CASES.values()} == set(FAMILIES)


@pytest.mark.parametrize("name", CASES)
def test_family_logits_equal_lean(name, tmp_path, exact):
    model = load(checkpoint(tmp_path, **CASES[name]))
    out = write_gguf(model.config, read_weights(model.path), model.tokenizer, tmp_path / "m.gguf")
    atol = GELU_ATOL if FAMILIES[model.config.model_type].activation == "gelu_tanh" else ATOL
    torch.testing.assert_close(passes(cpp(out), IDS), passes(model.lm, IDS), atol=atol, rtol=1e-4)


@pytest.mark.parametrize("quant, bound", [("f16", 1e-2), ("q8_0", 0.15)])
@pytest.mark.parametrize("kind", ["llama", "gemma3_text"])
def test_quantized_exports_load_and_stay_close(kind, quant, bound, tmp_path, exact):
    model = load(checkpoint(tmp_path, kind=kind))
    out = write_gguf(model.config, read_weights(model.path), model.tokenizer, tmp_path / "m.gguf", quant)
    got, ref = passes(cpp(out), IDS), passes(model.lm, IDS)
    assert ((got - ref).norm() / ref.norm()).item() < bound
    reader = gguf.GGUFReader(out)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert reader.fields["general.file_type"].contents() == {"f16": 1, "q8_0": 7}[quant]
    assert types["token_embd.weight"] == quant.upper() and types["blk.0.attn_q.weight"] == quant.upper()
    assert types["blk.0.ffn_down.weight"] == "F16"  # rows of 48: no whole q8_0 blocks, f16 as llama.cpp's converter
    assert types["blk.0.attn_norm.weight"] == types["output_norm.weight"] == "F32"


@pytest.mark.parametrize("spec", ["layers:0,2", "layers:1,2"])
@pytest.mark.parametrize("target", ["tiny_dir", "tiny_gemma_dir"])
def test_layers_drafter_export_equals_torch_layers_drafter(target, spec, tmp_path, exact, request):
    target = request.getfixturevalue(target)  # gemma3 layers 1,2: global then local, a pattern of their own
    out = export(spec, tmp_path / "d.gguf", "f32", target=target)
    ref = passes(load_drafter(spec, load(target)).lm, IDS)
    atol = GELU_ATOL if "gemma" in target else ATOL
    torch.testing.assert_close(passes(cpp(out), IDS), ref, atol=atol, rtol=1e-4)


def test_random_drafter_export_equals_random_lm(tiny_dir, tmp_path, exact):
    spec = "random:layers=2,heads=2,kv_heads=1,seed=4"
    out = export(spec, tmp_path / "r.gguf", "f32", target=tiny_dir)
    ref = passes(load_drafter(spec, load(tiny_dir)).lm, IDS)
    torch.testing.assert_close(passes(cpp(out), IDS), ref, atol=ATOL, rtol=1e-4)


def test_fixtures_speak_one_vocabulary(tiny_gguf, tiny_drafter_gguf, exact):
    assert read_tokenizer(tiny_gguf) == read_tokenizer(tiny_drafter_gguf)
    assert cpp(tiny_gguf).vocab_size == cpp(tiny_drafter_gguf).vocab_size == 64


def test_built_tokenizer_loads_and_tokenizes_as_transformers(tiny_gguf, exact):
    fields = {k: v[0] for k, v in read_tokenizer(tiny_gguf).items()}
    assert fields["tokenizer.ggml.model"] == b"whitespace" and fields["tokenizer.ggml.pre"] == b"whitespace"
    assert fields["tokenizer.ggml.tokens"][:5] == [b"<unk>", b"<s>", b"</s>", b"w0", b"w1"]
    assert fields["tokenizer.ggml.token_type"][:4] == [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL]
    assert (fields["tokenizer.ggml.bos_token_id"], fields["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert fields["tokenizer.chat_template"] == tiny_tokenizer().chat_template.encode()
    text = "<s> w1 w12 w59 w0 w33 </s>"
    assert _cpp_tokens(tiny_gguf, text) == tiny_tokenizer()(text)["input_ids"]


def _cpp_tokens(path, text: str) -> list[int]:
    import ctypes

    model = llamacpp.LlamaCppModel(path)
    buf = (ctypes.c_int32 * 256)()
    n = model.C.llama_tokenize(model.vocab, text.encode(), len(text.encode()), buf, 256, False, True)
    return list(buf[:n])


def test_bpe_tokenizer_is_gpt2_with_merges_and_padding(tmp_path, exact):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["the cat sat on the mat", "a cat and a hat"] * 4
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    n = len(fast) + 5  # more embedding rows than tokens: the rest become unused [PAD{i}] tokens
    config = tiny_config(vocab=n, bos_token_id=None, eos_token_id=0, pad_token_id=None)
    out = write_gguf(config, tiny_model(config).state_dict(), fast, tmp_path / "bpe.gguf")
    fields = {k: v[0] for k, v in read_tokenizer(out).items()}
    assert fields["tokenizer.ggml.model"] == b"gpt2" and fields["tokenizer.ggml.pre"] == b"gpt-2"
    assert len(fields["tokenizer.ggml.tokens"]) == n and fields["tokenizer.ggml.tokens"][-1] == f"[PAD{n - 1}]".encode()
    assert fields["tokenizer.ggml.token_type"][-1] == gguf.TokenType.UNUSED
    assert len(fields["tokenizer.ggml.merges"]) == len(json.loads(tok.to_str())["model"]["merges"])
    assert _cpp_tokens(out, "the cat sat on a hat") == fast("the cat sat on a hat")["input_ids"]


def test_copied_tokenizer_is_the_source_gguf_verbatim(tiny_dir, tiny_drafter_dir, tiny_gguf, tmp_path, exact):
    # a tokenizer-only GGUF unlike what draftwise would build: a key of its own, another template
    fields = read_tokenizer(tiny_gguf)
    fields["tokenizer.chat_template"] = (b"{{ messages[0]['content'] }}", gguf.GGUFValueType.STRING, None)
    fields["tokenizer.ggml.extra_flag"] = (7, gguf.GGUFValueType.UINT32, None)
    source = tmp_path / "source.gguf"
    writer = gguf.GGUFWriter(source, "llama")
    for key, (value, kind, sub) in fields.items():
        writer.add_key_value(key, value, kind, sub_type=sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    drafter = load(tiny_drafter_dir)
    out = write_gguf(drafter.config, read_weights(drafter.path), None, tmp_path / "a.gguf", tokenizer_gguf=source)
    assert read_tokenizer(out) == fields
    # export finds the GGUF a target dir was converted from (source._cached_gguf's record) and copies it alike
    target = tmp_path / "converted"
    shutil.copytree(tiny_dir, target)
    (target / "draftwise-source.json").write_text(json.dumps({"gguf": str(source)}))
    assert read_tokenizer(export(tiny_drafter_dir, tmp_path / "b.gguf", target=str(target))) == fields
    assert cpp(out).vocab_size == 64


def test_windowed_llama_arch_exports_with_a_warning(tmp_path, capsys):
    model = load(checkpoint(tmp_path, kind="qwen3", use_sliding_window=True, sliding_window=4, max_window_layers=1))
    write_gguf(model.config, read_weights(model.path), model.tokenizer, tmp_path / "w.gguf")
    assert "no sliding window" in capsys.readouterr().err


def test_bad_inputs_are_refused_in_one_line(tiny_dir, tiny_drafter_dir, tiny_gguf, tmp_path):
    drafter = load(tiny_drafter_dir)
    state = read_weights(drafter.path)
    reduced = tmp_path / "reduced"
    shutil.copytree(tiny_drafter_dir, reduced)
    (reduced / "draft_vocab.json").write_text(json.dumps({"target_vocab_size": 64, "ids": [0, 1, 2]}))
    other = save_checkpoint(tmp_path / "other", tiny_model(tiny_config(vocab=40)), tiny_tokenizer(vocab=40))
    gemma = tiny_config("gemma", tie_word_embeddings=False)
    gpt2 = __import__("transformers").GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=64)
    cases = {
        "unknown GGUF quantization": lambda: export(tiny_drafter_dir, tmp_path / "x.gguf", "q3_k", target=tiny_dir),
        "reduced-vocabulary head": lambda: export(str(reduced), tmp_path / "x.gguf", target=tiny_dir),
        "vocabulary incompatible": lambda: export(other, tmp_path / "x.gguf", target=tiny_dir),
        "a vocabulary of 100": lambda: export("random:layers=1,vocab=100", tmp_path / "x.gguf", target=tiny_dir),
        "model_type 'gpt2'": lambda: write_gguf(gpt2, {}, drafter.tokenizer, tmp_path / "x.gguf"),
        "ties the LM head": lambda: write_gguf(
            gemma, tiny_model(gemma).state_dict(), drafter.tokenizer, tmp_path / "x.gguf"
        ),
        "have no place": lambda: write_gguf(
            drafter.config, {**state, "model.extra.weight": torch.zeros(2)}, drafter.tokenizer, tmp_path / "x.gguf"
        ),
        "has 64 tokens but the model has 40": lambda: write_gguf(
            tiny_config(vocab=40), read_weights(Path(other)), None, tmp_path / "x.gguf", tokenizer_gguf=tiny_gguf
        ),
        "model not found": lambda: export("no/such/dir", tmp_path / "x.gguf", target=tiny_dir),
    }
    for fragment, call in cases.items():
        with pytest.raises(DraftwiseError) as e:
            call()
        assert fragment in str(e.value) and "\n" not in str(e.value), (fragment, str(e.value))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "reduced"]  # nothing half-written left behind


def test_cli_writes_and_reports(tiny_dir, tiny_drafter_dir, tmp_path, capsys):
    out = tmp_path / "d.gguf"
    assert main(["export-gguf", tiny_drafter_dir, "--target", tiny_dir, "--quant", "q8_0", "--out", str(out)]) == 0
    assert f"{out} (" in capsys.readouterr().out and gguf.GGUFReader(out).fields["general.file_type"].contents() == 7
    assert main(["export-gguf", tiny_drafter_dir, "--target", tiny_dir, "--quant", "int4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftwise: error: unknown GGUF quantization 'int4'") and err.count("\n") == 1


def test_a_file_of_random_weights_says_so(tiny_dir, tiny_gguf, tmp_path):
    """`random_weights` marks the file (`scripts/shape_gguf.py` writes its shapes so): a design on it states predicted
    speedups, never its acceptance."""
    from draftwise.targets.spec import parse

    def random_weights(spec: str) -> bool:
        return parse(spec).random_weights

    model = load(tiny_dir)
    marked = write_gguf(
        model.config, read_weights(model.path), model.tokenizer, tmp_path / "r.gguf", random_weights=True
    )
    assert random_weights(str(marked)) and random_weights("random:layers=1")
    assert not random_weights(tiny_gguf) and not random_weights(tiny_dir)


def test_a_random_weight_shape_pads_a_smaller_tokenizer_with_unused_tokens(tiny_gguf, tmp_path):
    """A random-weight file in another model's shape (Qwen3's 151,936 rows, the default tokenizer's 49,152 tokens)
    gets the tokenizer padded to its rows with unused tokens; a real model's file is refused the mismatch."""
    config = tiny_config(vocab=80)
    state = tiny_model(config).state_dict()
    with pytest.raises(DraftwiseError, match="its tokenizer is not this model's"):
        write_gguf(config, state, None, tmp_path / "real.gguf", tokenizer_gguf=tiny_gguf)
    out = write_gguf(config, state, None, tmp_path / "shape.gguf", tokenizer_gguf=tiny_gguf, random_weights=True)
    tokens, types = (read_tokenizer(out)[f"tokenizer.ggml.{k}"][0] for k in ("tokens", "token_type"))
    source = read_tokenizer(tiny_gguf)["tokenizer.ggml.tokens"][0]
    assert len(tokens) == len(types) == 80 and tokens[: len(source)] == source
    assert tokens[-1] == b"[PAD79]" and types[-1] == gguf.TokenType.UNUSED
    assert cpp(out).vocab_size == 80  # llama.cpp loads it
