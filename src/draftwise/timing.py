"""Wall-clock measurement: warm-up, repeats, medians, and device synchronisation so GPU work is counted."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work (a no-op on the CPU), so a timer read after it covers that work."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn: Callable[[], object], device: torch.device | str = "cpu", warmup: int = 3, repeats: int = 15) -> list[float]:
    """Milliseconds of `repeats` calls of `fn`, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    sync(device)
    out = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync(device)
        out.append(1e3 * (time.perf_counter() - start))
    return out


def measure_interleaved(fns: list[Callable[[], object]], device: torch.device | str = "cpu", warmup: int = 3,
                        repeats: int = 15) -> list[list[float]]:
    """Milliseconds of each function, called in turn within every repeat: machine drift then hits all alike, so
    ratios between them are trustworthy even when absolute times wander."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    sync(device)
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, out):
            start = time.perf_counter()
            fn()
            sync(device)
            times.append(1e3 * (time.perf_counter() - start))
    return out


def median(values: list[float]) -> float:
    return statistics.median(values)
