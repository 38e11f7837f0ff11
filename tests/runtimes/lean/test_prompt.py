"""Prompt passes through torch's bf16 product (`prompt.py`): the next tokens after such a prefill stay near those of
the exact path (the quality bar itself on the default target: test_default_target.py); passes whose logits are read
never take it; a chunk of a continuous batch that
takes it runs apart with the same result; it stays off where its copies would not fit in memory and on a file
measured to miss the bar."""

import pytest
import torch

from conftest import c_paths
from draftwise.runtimes.base import ModelOptions
from draftwise.runtimes.lean import kernels, ladder, prompt
from draftwise.runtimes.registry import load

PATHS = c_paths()
pytestmark = pytest.mark.skipif(not PATHS, reason="no int8 C kernel on this machine")


@pytest.fixture
def routes(monkeypatch):
    """Set the route every later pass takes: 'exact' (one exact path) or 'bf16' (prompt passes through bf16)."""
    exact = ladder.Route.one(PATHS[0])
    bf16 = kernels.forced(f"{ladder.NAMES[PATHS[0]]},bf16")

    def use(name: str) -> None:
        monkeypatch.setattr(kernels, "route", lambda: bf16 if name == "bf16" else exact)

    return use


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
    lm.forward(ids[:, :8], 0, n_logits=0)  # a short prompt: below the prompt bands, exact too
    assert prompt.copies_bytes(lm) == 0


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
    assert load(small_q4_gguf, ModelOptions(dtype="q4")).lm.prompt_bf16
    assert prompt.keep(small_q4_gguf, 0.999, 0.0) and prompt.allowed(small_q4_gguf)
    assert not prompt.keep(small_q4_gguf, 0.95, 0.02)
    lm = load(small_q4_gguf, ModelOptions(dtype="q4")).lm
    assert not lm.prompt_bf16 and not prompt.takes_bf16(lm, 40)
