"""Measurement: warm-up, repeats, medians. On a GPU each call is timed with CUDA events recorded around it on the
current stream and read after a synchronise (so queued work is counted, and host time between calls is not); on
the CPU with the wall clock. `machine()` names what a timing was taken on, so timings of different machines,
dtypes or engines are never mixed in one run folder.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from .errors import DraftwiseError


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work (a no-op on the CPU), so a timer read after it covers that work."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Milliseconds of one call of `fn`, its GPU work included."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    begin = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - begin)


def machine(device: torch.device | str, dtype: str, engine: str) -> dict:
    """What a timing was taken on: device kind and name, dtype, engine, torch version and CPU threads."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = platform.processor() or platform.machine()
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
            name = next(line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name"))
        except (OSError, StopIteration):
            pass
    return {
        "device": device.type,
        "device_name": name,
        "dtype": dtype,
        "engine": engine,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "host_cpus": os.cpu_count(),
    }


def native_bf16(device: str) -> bool:
    """Whether bf16 matmuls run natively here: a GPU, or a CPU with AVX-512 BF16 or AMX (/proc/cpuinfo's flags) —
    where they measured ~4× fp32's speed on 2 EPYC Zen 5 cores; elsewhere bf16 is emulated and slower."""
    if str(device).startswith("cuda"):
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def check_machine(records: list[dict], here: dict, folder) -> None:
    """Refuse to add timings to a folder whose timings were taken elsewhere (another GPU, dtype, engine, ...)."""
    other = next((r["machine"] for r in records if r.get("machine") and r["machine"] != here), None)
    if other:
        differ = ", ".join(f"{k}: {other.get(k)} vs {here.get(k)}" for k in here if other.get(k) != here.get(k))
        raise DraftwiseError(f"{folder} holds timings from another machine ({differ}): use another --out")


def measure(
    fn: Callable[[], object], device: torch.device | str = "cpu", warmup: int = 3, repeats: int = 15
) -> list[float]:
    """Milliseconds of `repeats` calls of `fn`, after `warmup` untimed ones."""
    return measure_interleaved([fn], device, warmup, repeats)[0]


def measure_interleaved(
    fns: list[Callable[[], object]], device: torch.device | str = "cpu", warmup: int = 3, repeats: int = 15
) -> list[list[float]]:
    """Milliseconds of each function, called in turn within every repeat: machine drift then hits all alike, so
    ratios between them are trustworthy even when absolute times wander."""
    device = torch.device(device)
    for _ in range(warmup):
        for fn in fns:
            fn()
    sync(device)
    out: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, out):
            times.append(_timed_ms(fn, device))
    return out


def median(values: list[float]) -> float:
    return statistics.median(values)
