import platform
import shutil

import pytest
import torch
import torch.nn.functional as F

from draftwise.runtimes.lean import kernels

needs_kernel = pytest.mark.skipif(not kernels.kernel_available(), reason="CPU kernel not available on this machine")


def test_kernel_builds_where_it_should():
    """On x86-64 Linux with AVX2 and gcc the fast path must be active, or decoding silently runs ~2x slower."""
    if platform.machine() != "x86_64" or shutil.which("gcc") is None:
        pytest.skip("kernel targets x86-64 with gcc")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("no AVX2")
    assert kernels.kernel_available()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 12, 16, 17])
def test_linear_matches_torch(rows):
    gen = torch.Generator().manual_seed(rows)
    w, b = torch.randn(96, 40, generator=gen), torch.randn(96, generator=gen)
    x = torch.randn(1, rows, 40, generator=gen)
    torch.testing.assert_close(kernels.linear(x, w, b), F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    assert kernels.linear(x, w).shape == (1, rows, 96)


@needs_kernel
def test_linear_rows_are_batch_invariant():
    """A row's result is bitwise the same alone (a decoding step) or among others (a verify pass)."""
    gen = torch.Generator().manual_seed(0)
    w, x = torch.randn(128, 64, generator=gen), torch.randn(5, 64, generator=gen)
    together = kernels.linear(x, w)
    for i in range(5):
        assert torch.equal(together[i], kernels.linear(x[i : i + 1], w)[0])


def test_linear_falls_back_for_shapes_and_grad():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(30, 20, generator=gen)  # K not a multiple of 8, N not of 4: torch path
    x = torch.randn(2, 20, generator=gen)
    torch.testing.assert_close(kernels.linear(x, w), F.linear(x, w))
    w2 = torch.randn(32, 32, generator=gen, requires_grad=True)
    y = kernels.linear(torch.randn(1, 32, generator=gen), w2)
    y.sum().backward()  # the fast path has no backward; with autograd on, torch must run
    assert w2.grad is not None


@needs_kernel
def test_rms_norm_matches_torch():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 4, 52, generator=gen), torch.randn(52, generator=gen)
    torch.testing.assert_close(kernels.rms_norm(x, w, 1e-5), F.rms_norm(x, (52,), w, 1e-5), atol=1e-5, rtol=1e-5)
