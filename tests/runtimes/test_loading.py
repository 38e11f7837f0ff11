import json
from pathlib import Path

import pytest
import torch

from conftest import save_checkpoint, tiny_config, tiny_model, tiny_tokenizer
from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.hf.model import HFCausalLM
from draftwise.runtimes.lean.forward import LeanLM
from draftwise.runtimes.registry import load, load_drafter


def test_load_hf_directory(tiny_dir):
    model = load(tiny_dir)
    assert isinstance(model.lm, LeanLM) and model.backend == "lean"
    assert model.vocab_size == 64 and model.eos_ids == frozenset({2})
    assert model.encode("w1 w2") == [1, 4, 5]  # through the chat template: "<s> w1 w2 "


def test_transformers_backend_gives_the_same_logits(tiny_dir):
    lean, hf = load(tiny_dir).lm, load(tiny_dir, ModelOptions(backend="transformers")).lm
    assert isinstance(hf, HFCausalLM)
    ids = torch.tensor([[1, 5, 9, 13, 17]])
    for lm in (lean, hf):
        lm.reset(1, 16)
    torch.testing.assert_close(lean.forward(ids, 0), hf.forward(ids, 0), atol=2e-4, rtol=2e-4)
    # rollback: the transformers cache is cropped back to the position asked for
    hf.forward(torch.tensor([[3, 3]]), 5)
    torch.testing.assert_close(
        hf.forward(torch.tensor([[21]]), 5), lean.forward(torch.tensor([[21]]), 5), atol=2e-4, rtol=2e-4
    )


def test_layers_drafter(tiny_dir):
    target = load(tiny_dir)
    drafter = load_drafter("layers:0,3", target)
    assert drafter.config.num_hidden_layers == 2 and drafter.backend == "lean"
    hf = drafter.hf_model()
    assert hf.config.num_hidden_layers == 2
    ids = torch.tensor([[1, 7, 8]])
    drafter.lm.reset(1, 8)
    with torch.no_grad():
        torch.testing.assert_close(drafter.lm.forward(ids, 0), hf(ids).logits, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize(
    "spec,message",
    [
        ("layers:0,9", "the target has layers 0..3"),
        ("layers:1,1", "repeated"),
        ("layers:", "at least one layer"),
        ("layers:a", "integers"),
    ],
)
def test_bad_layer_lists(tiny_dir, spec, message):
    with pytest.raises(DraftwiseError, match=message):
        load_drafter(spec, load(tiny_dir))


def test_missing_path():
    with pytest.raises(DraftwiseError, match="model not found: /no/such/model"):
        load("/no/such/model")


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "vit", "hidden_size": 32},  # no architectures field: judged by model_type
        {"model_type": "bert", "architectures": ["BertForMaskedLM"]},
    ],
)
def test_not_a_causal_lm(tmp_path, config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(DraftwiseError, match="not a causal language model"):
        load(str(tmp_path))


def test_pickle_weights_are_refused(tmp_path):
    tiny_config().save_pretrained(tmp_path)
    torch.save({"x": torch.zeros(1)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(DraftwiseError, match="refusing pickle weights .*pytorch_model.bin"):
        load(str(tmp_path))


def test_directory_without_config(tmp_path):
    with pytest.raises(DraftwiseError, match="no config.json"):
        load(str(tmp_path))


def test_non_gguf_file(tmp_path):
    f = tmp_path / "weights.txt"
    f.write_text("x")
    with pytest.raises(DraftwiseError, match="not .gguf"):
        load(str(f))


def test_drafter_vocabulary_must_match(tmp_path, tiny_dir):
    tok = tiny_tokenizer()
    other = {v: k for k, v in tok.get_vocab().items()}
    # a tokenizer that swaps two ids: same size, different meaning
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {other[i]: i for i in range(len(other))}
    vocab["w1"], vocab["w2"] = vocab["w2"], vocab["w1"]
    t = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    swapped = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    path = save_checkpoint(tmp_path / "d", tiny_model(tiny_config(layers=1)), swapped)
    with pytest.raises(DraftwiseError, match="drafter vocabulary incompatible with target: 2 tokens differ"):
        load_drafter(path, load(tiny_dir))


def test_unknown_options(tiny_dir):
    with pytest.raises(DraftwiseError, match="unknown dtype"):
        load(tiny_dir, ModelOptions(dtype="fp8"))
    with pytest.raises(DraftwiseError, match="unknown backend"):
        load(tiny_dir, ModelOptions(backend="vllm"))
    if not torch.cuda.is_available():
        with pytest.raises(DraftwiseError, match="no CUDA GPU"):
            load(tiny_dir, ModelOptions(device="cuda"))


def test_gguf_of_an_architecture_transformers_cannot_read_is_named(tmp_path, monkeypatch):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "rwkv99")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(DraftwiseError, match="architecture rwkv99"):
        load(str(tmp_path / "m.gguf"))


@pytest.mark.parametrize("keep", [lambda size: size - 1, lambda size: size // 2, lambda size: 100, lambda size: 0])
def test_a_truncated_gguf_is_named_in_one_line(tmp_path, monkeypatch, tiny_gguf, keep):
    from pathlib import Path

    from draftwise.gguf.vocab import read_tokenizer
    from draftwise.targets.source import gguf_file

    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path / "cache"))
    data = Path(tiny_gguf).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: keep(len(data))])
    message = (
        r"cut.gguf is truncated: (tensor \S+ needs bytes up to \d+ but the file has \d+|its header runs past the "
        r"file's \d+ bytes) \(a partial download\?\)$"
    )
    with pytest.raises(DraftwiseError, match=message):
        load(str(cut))  # the lean engine: before transformers dequantises it
    with pytest.raises(DraftwiseError, match=message):
        gguf_file(str(cut))  # llama.cpp: before its metadata is read
    with pytest.raises(DraftwiseError, match=message):
        read_tokenizer(cut)  # a drafter's vocabulary check, a tokenizer copied into an export


def test_a_whole_gguf_passes_the_truncation_check(tiny_gguf):
    from pathlib import Path

    from draftwise.gguf.read import check_gguf

    check_gguf(Path(tiny_gguf))
    f = Path(tiny_gguf).with_name("tail.gguf")
    f.write_bytes(Path(tiny_gguf).read_bytes()[:-1])
    with pytest.raises(
        DraftwiseError, match=f"tensor .* needs bytes up to {f.stat().st_size + 1} but the file has {f.stat().st_size} "
    ):
        check_gguf(f)


def test_lazy_weights_read_each_tensor_when_asked_and_let_it_go(tiny_dir):
    """`LazyWeights` (a q4 model built a layer at a time): the checkpoint's tensors, equal to `read_weights`', read
    when first asked for and held until deleted."""
    from draftwise.targets.checkpoint import LazyWeights, read_weights

    full, lazy = read_weights(Path(tiny_dir)), LazyWeights(Path(tiny_dir))
    assert set(lazy) == set(full) and len(lazy) == len(full) and not lazy._held
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(lazy[key], full[key]) and lazy[key] is lazy[key]  # read once, then held
    del lazy[key]
    assert key not in lazy and key not in lazy._held and lazy.get(key) is None


def test_held_bytes_are_the_weights_as_loaded_each_storage_once(tiny_dir):
    from draftwise.shapes import Shape

    fp32 = load(tiny_dir)
    shape = Shape.of(fp32.config)
    assert fp32.held_bytes() == shape.weight_bytes(4)  # the tied head is the embedding's storage: counted once
    assert load(tiny_dir, ModelOptions(dtype="bf16")).held_bytes() == shape.weight_bytes(2)
    int8 = load(tiny_dir, ModelOptions(dtype="int8")).held_bytes()
    assert int8 < shape.weight_bytes(4) and int8 != shape.weight_bytes(1)  # a byte a weight, plus scales and padding
    view = load_drafter("layers:0,3", fp32)
    assert view.held_bytes(beside=fp32) == 0 < view.held_bytes()  # its layers are the target's own tensors
