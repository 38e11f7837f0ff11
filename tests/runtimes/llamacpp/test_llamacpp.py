"""The llama.cpp engine behind the LM interface, on tiny GGUF files the tests write (f32: exact comparisons)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from draftwise.errors import DraftwiseError
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.llamacpp.lm import LlamaCppLM, LlamaCppModel
from draftwise.runtimes.registry import load, load_drafter, stamp
from draftwise.sd.batched_sd import generate_batch_sd
from draftwise.sd.lookup import NgramDrafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams

LLAMA = ModelOptions(backend="llama.cpp")
IDS = [1, 5, 9, 14, 3, 22, 40, 7, 7, 31, 12, 60]


def lm_of(path) -> LlamaCppLM:
    return LlamaCppLM(LlamaCppModel(path, threads=2))


def test_logits_equal_llama_cpp_python_scores(tiny_gguf):
    from llama_cpp import Llama

    # flash attention as llama.cpp (and llama-server) choose by default: the backend keeps their default
    llm = Llama(model_path=str(tiny_gguf), n_ctx=64, n_threads=2, logits_all=True, flash_attn=True, verbose=False)
    llm.eval(IDS)
    ref = np.array(llm.scores[: len(IDS)])  # [T, V]
    lm = lm_of(tiny_gguf)
    lm.reset(1, 64)
    out = lm.forward(torch.tensor([IDS]), 0, None)[0].numpy()  # [T, V]
    assert out.shape == ref.shape
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-5)
    lm.reset(1, 64)  # only the last n rows when asked for them
    np.testing.assert_allclose(lm.forward(torch.tensor([IDS]), 0, 3)[0].numpy(), ref[-3:], rtol=0, atol=1e-5)


def test_a_pass_after_a_rollback_equals_a_fresh_pass(tiny_gguf):
    lm, fresh = lm_of(tiny_gguf), lm_of(tiny_gguf)
    for m in (lm, fresh):
        m.reset(1, 32)
        m.forward(torch.tensor([IDS[:8]]), 0, 0)
    lm.forward(torch.tensor([[50, 51, 52, 53]]), 8, 4)  # rejected drafts, then rolled back by passing pos 8 again
    again = lm.forward(torch.tensor([IDS[8:]]), 8, 4)
    assert torch.equal(again, fresh.forward(torch.tensor([IDS[8:]]), 8, 4))


def test_left_padded_rows_are_sequences_of_their_own(tiny_gguf):
    prompts = [IDS[:5], IDS, IDS[3:9]]
    T = max(map(len, prompts))
    start = [T - len(p) for p in prompts]
    lm = lm_of(tiny_gguf)
    lm.reset(3, T + 4)
    batch = lm.forward(torch.tensor([[0] * s + p for s, p in zip(start, prompts)]), 0, 1, start)  # [3, 1, V]
    for b, p in enumerate(prompts):
        lm.reset(1, T + 4)
        torch.testing.assert_close(batch[b], lm.forward(torch.tensor([p]), 0, 1)[0], rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def target(tiny_dir):
    return load(tiny_dir, LLAMA)  # an HF dir: written as an f32 GGUF, then run in llama.cpp


def test_greedy_sd_is_ar_token_for_token_at_f32(target, tiny_drafter_dir):
    drafter = load_drafter(tiny_drafter_dir, target, LLAMA)
    assert drafter.backend == "llama.cpp" and drafter.gguf.suffix == ".gguf"
    greedy = SamplingParams()
    for prompt in (IDS[:4], IDS[2:10], [1, 3, 3, 3, 3]):
        ar = generate(target.lm, prompt, greedy, 24, torch.Generator()).tokens
        for d, gamma in ((drafter.lm, 1), (drafter.lm, 3), (NgramDrafter(1, 3), 4)):
            assert generate(target.lm, prompt, greedy, 24, torch.Generator(), drafter=d, gamma=gamma).tokens == ar


def test_batched_sd_on_llama_cpp_is_ar(target, tiny_drafter_dir):
    drafter = load_drafter(tiny_drafter_dir, target, LLAMA)
    prompts = [IDS[:4], IDS[2:10], [1, 3, 3, 3, 3]]
    g = torch.Generator()
    ar = [generate(target.lm, p, SamplingParams(), 16, g).tokens for p in prompts]
    gens, _ = generate_batch_sd(target.lm, prompts, SamplingParams(), 16, g, drafter=drafter.lm, gamma=2)
    assert [x.tokens for x in gens] == ar


def test_timings_name_engine_build_quant_and_threads(target):
    s = stamp(target, LLAMA)
    assert s["engine"] == "llama.cpp" and s["quant"] == "F32" and s["dtype"] == "F32"
    assert s["threads"] >= 1 and s["llama_cpp"]["llama_cpp_python"] and s["llama_cpp"]["commit"]


def test_unknown_architecture_is_one_line(tmp_path):
    import gguf

    path = tmp_path / "odd.gguf"
    w = gguf.GGUFWriter(str(path), "nonesuch")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(DraftwiseError, match="llama.cpp cannot load .*nonesuch") as e:
        LlamaCppModel(path)
    assert "\n" not in str(e.value)


def test_engines_do_not_mix(tiny_dir):
    lean = load(tiny_dir)
    with pytest.raises(DraftwiseError, match="one engine"):
        load_drafter("layers:0", lean, LLAMA)


def test_a_gguf_drafter_of_another_vocabulary_is_refused(target, tmp_path):
    from conftest import tiny_config, tiny_model, tiny_tokenizer
    from draftwise.gguf.write import write_gguf

    tok = tiny_tokenizer()
    tok.add_tokens(["zz-extra"])  # 65 ids: a vocabulary the target (64) does not have
    other = write_gguf(
        tiny_config(layers=1, vocab=65),
        tiny_model(tiny_config(layers=1, vocab=65)).state_dict(),
        tok,
        tmp_path / "other.gguf",
    )
    with pytest.raises(DraftwiseError, match="another vocabulary") as e:
        load_drafter(str(other), target, LLAMA)
    assert "\n" not in str(e.value)
    assert load_drafter(str(target.gguf), target, LLAMA).vocab_size == target.vocab_size  # its own file is fine
