"""Prompt passes through torch's bf16 product (`prompt.py`): the next tokens after such a prefill stay near those of
the exact path (the quality bar itself on the default target: test_default_target.py); passes whose logits are read
never take it; a chunk of a continuous batch that
takes it runs apart with the same result; it stays off where its copies would not fit in memory and on a file
measured to miss the bar."""

import json

import pytest
import torch

from conftest import c_paths, tiny_config, tiny_model
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean import kernels, ladder, library, prompt, rates, smoke
from draftwise.runtimes.lean.forward import LeanLM
from draftwise.runtimes.lean.int8 import LINEARS
from draftwise.runtimes.registry import load
from draftwise.sd.lookup import NgramDrafter
from draftwise.sd.loop import generate
from draftwise.sd.sampling import SamplingParams

PATHS = c_paths()
pytestmark = pytest.mark.skipif(not PATHS, reason="no int8 C kernel on this machine")


@pytest.fixture
def routes(monkeypatch):
    """Set the route every later pass takes: 'exact' (one exact path) or 'bf16' (prompt passes through bf16)."""
    exact = ladder.Route.one(PATHS[0])
    lossy = {
        p: kernels.forced(f"{ladder.NAMES[PATHS[0]]},{p}") for p in ladder.candidates(max(PATHS)) if p in ladder.LOSSY
    }

    def use(name: str) -> None:
        if name != "exact" and name not in lossy:
            pytest.skip(f"this CPU does not run the {name} prompt path")
        monkeypatch.setattr(kernels, "route", lambda: lossy.get(name, exact))

    return use


@pytest.fixture
def tiny_q4k_lm():
    """A tiny lean model whose matrices are random Q4_K blocks (inputs whole super-blocks of 256)."""
    config = tiny_config(vocab=64, layers=2, hidden_size=256, intermediate_size=512)
    lm = LeanLM(config, tiny_model(config, seed=3, std=0.05).state_dict(), precision="int8")
    gen = torch.Generator().manual_seed(4)
    for layer in lm.layers:
        for name in LINEARS:
            w = getattr(layer, name)
            setattr(layer, name, rates.weights(w.out_features, w.in_features, gen)["q4k"])
    return lm


def prompts(n: int = 12, length: int = 48) -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(100, 2000, (length,), generator=gen).tolist() for _ in range(n)]


def next_logits(lm, ids: list[int], h: int) -> torch.Tensor:
    """The logits of positions h.. after a prefill of the first h tokens (a prompt pass, no logits)."""
    lm.reset(1, len(ids))
    lm.forward(torch.tensor([ids[:h]]), 0, n_logits=0)
    return lm.forward(torch.tensor([ids[h:]]), h)[0]


def test_the_next_tokens_after_a_bf16_prefill_stay_near_the_exact_paths(small_q4_gguf, routes):
    """A tiny random model's distributions are flat (near ties flip): bf16's rounding moves a few of its argmaxes."""
    lm = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    agree = total = 0
    for ids in prompts():
        routes("exact")
        want = next_logits(lm, ids, 40)
        routes("bf16")
        got = next_logits(lm, ids, 40)
        assert not torch.equal(got, want)  # another path did run: its own rounding
        agree += int((got.argmax(-1) == want.argmax(-1)).sum())
        total += got.shape[0]
    assert agree / total >= 0.9, (agree, total)
    assert prompt.copies_bytes(lm) == sum(2 * w.out_features * w.in_features for w in prompt.matrices(lm))


def test_passes_whose_logits_are_read_keep_the_exact_path(small_q4_gguf, routes):
    lm = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    ids = torch.tensor([prompts(1)[0]])
    routes("exact")
    lm.reset(1, 64)
    want = lm.forward(ids, 0)
    routes("bf16")
    assert torch.equal(lm.forward(ids, 0), want)  # 48 rows with logits: a verify-like pass, bit for bit
    assert prompt.copies_bytes(lm) == 0
    lm.forward(ids[:, :8], 0, n_logits=0)  # a short prompt: the prompt path too
    assert prompt.copies_bytes(lm) > 0


def test_a_chunk_beside_decoding_rows_that_takes_bf16_runs_apart(small_q4_gguf, routes):
    lm = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    routes("bf16")
    ids = prompts(2)
    lm.reset(2, 64)
    cache = (lm.k_cache, lm.v_cache)
    lm.forward_segments([(ids[0][:40], 0, 0, 0)], cache)  # row 0's prompt, on its own
    step = [(ids[0][40:41], 0, 40, 1), (ids[1][:32], 1, 0, 0)]  # row 0 decodes while row 1's chunk joins
    logits = lm.forward_segments(step, cache)
    assert logits[0].shape[0] == 1 and logits[1].shape[0] == 0
    alone = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    alone.reset(1, 64)
    alone.forward(torch.tensor([ids[1][:32]]), 0, n_logits=0)  # the same chunk prefilled alone
    assert torch.equal(lm.k_cache[:, 1, :, :32], alone.k_cache[:, 0, :, :32])
    alone.reset(1, 64)
    alone.forward(torch.tensor([ids[0][:40]]), 0, n_logits=0)
    assert torch.equal(logits[0], alone.forward(torch.tensor([ids[0][40:41]]), 40)[0])  # the decoding row as alone


def test_copies_that_would_not_fit_keep_the_exact_path(small_q4_gguf, routes, monkeypatch, capsys):
    lm = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    routes("bf16")
    monkeypatch.setattr(prompt.machine, "memory", lambda: {"available_gib": 1e-6})
    assert not prompt.takes_bf16(lm, 40)
    assert "keep the exact path" in capsys.readouterr().err


def test_a_file_measured_to_miss_the_bar_keeps_the_exact_path(small_q4_gguf, routes, tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWISE_CACHE", str(tmp_path))
    routes("bf16")
    lm = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    assert lm.prompt_lossy and prompt.lossy(lm, 40) == ["bf16"]
    assert prompt.keep(small_q4_gguf, 0.999, 0.0) and prompt.allowed(small_q4_gguf)
    assert not prompt.keep(small_q4_gguf, 0.95, 0.02)
    lm = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    assert not lm.prompt_lossy and not prompt.lossy(lm, 40) and not prompt.takes_bf16(lm, 40)
    ids = torch.tensor([prompts(1)[0]])
    lm.reset(1, 64)
    lm.forward(ids, 0, n_logits=0)
    assert prompt.copies_bytes(lm) == 0
    record = prompt._record(small_q4_gguf)  # a record written before its key was named for every lossy path
    record.write_text(json.dumps({"file": str(small_q4_gguf), "bf16": False, "agreement": 0.98, "nll_delta": 0.0}))
    assert not prompt.allowed(small_q4_gguf)


@pytest.mark.parametrize("fmt", ["q4k", "q6k"])
@pytest.mark.parametrize("build", ["native", "avx2"])
def test_q8k_gives_its_references_bits_the_same_in_any_chunks(fmt, build):
    """On the CPU's own path (AVX-512 VNNI, else AVX2), and on AVX2's where AVX-512 is the native one."""
    if build == "avx2" and max(PATHS) < ladder.CODES["avx512"]:
        pytest.skip("AVX2 is this CPU's own Q8_K path: the native build tests it")
    lib = library.load(("DRAFTWISE_Q8K_AVX2",)) if build == "avx2" else None
    w = rates.weights(128, 512, torch.Generator().manual_seed(0))[fmt]
    gen = torch.Generator().manual_seed(1)
    x = smoke.activations(40, 512, gen)  # outlier channels in some rows
    x[5, 300:] = 0.0  # a row with blocks of zeros: their scales at the finest
    whole = prompt.q8k_gemm(x, w, lib)
    assert torch.equal(whole, prompt.reference_q8k(x, w))
    parts = torch.cat([prompt.q8k_gemm(x[a:b].contiguous(), w, lib) for a, b in ((0, 3), (3, 19), (19, 40))])
    assert torch.equal(parts, whole)  # each row its own: a prompt's cache is the same whole or in chunks
    ref = x @ w.dequantize().T
    assert (whole - ref).norm() < 0.05 * ref.norm()  # 8 bits a value, a scale per 256


def test_q8k_reaches_only_k_quant_matrices_of_prompt_passes(tiny_q4k_lm, routes):
    lm = tiny_q4k_lm
    ids = torch.randint(3, 64, (1, 40), generator=torch.Generator().manual_seed(5))
    routes("exact")
    lm.reset(1, 64)
    want = lm.forward(ids, 0)
    lm.forward(ids, 0, n_logits=0)
    exact_keys = lm.k_cache.clone()
    routes("q8k")
    assert prompt.lossy(lm, 40) == prompt.lossy(lm, 8) == ["q8k"]  # any size: the same whole or in chunks
    assert torch.equal(lm.forward(ids, 0), want)  # logits read: the exact path
    lm.forward(ids, 0, n_logits=0)
    assert not torch.equal(lm.k_cache, exact_keys)  # a prompt pass: Q8_K's own rounding


@pytest.mark.parametrize("path", ["q8k", "bf16"])
def test_greedy_sd_is_ar_after_a_lossy_prefill(tiny_q4k_lm, routes, path):
    """SD and AR prefill a prompt alike: greedy SD stays token-identical to greedy AR on every lossy prompt path."""
    routes(path)
    lm = tiny_q4k_lm
    prompt_ids = torch.randint(3, 64, (40,), generator=torch.Generator().manual_seed(6)).tolist()
    assert prompt.lossy(lm, 39) == [path]
    ar = generate(lm, prompt_ids, SamplingParams(), 24, torch.Generator())
    for gamma in (1, 3):
        sd = generate(lm, prompt_ids, SamplingParams(), 24, torch.Generator(), drafter=NgramDrafter(1, 3), gamma=gamma)
        assert sd.tokens == ar.tokens
