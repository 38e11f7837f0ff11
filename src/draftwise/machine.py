"""The machine a figure comes from: the CPU, what it and the OS allow, the memory and its measured bandwidth.

Every run folder holds `machine.json` (`facts`, written by `rundir.RunDir`); the stages that report plain decoding add
the measured read bandwidth (`bandwidth`) and, beside each plain-decoding figure, the share of the machine's limit it
reached (`share`):

  ISA features     the instruction sets that decide which kernels run (AVX2, AVX-512 and its VNNI / BF16 / FP16,
                   AVX-VNNI, AMX), as /proc/cpuinfo lists them: Linux lists an AVX or AVX-512 feature only when it
                   saves that register state (XCR0), so a flag there is one the CPU *and* the OS allow. AMX is the
                   exception: its tile data is granted per process, on request (`arch_prctl(ARCH_REQ_XCOMP_PERM)`);
                   `amx` says whether this kernel grants it (`ARCH_GET_XCOMP_SUPP`, a read that changes nothing).
  llama.cpp build  what `scripts/setup.sh` built and why (`runtimes.llamacpp.build`: the flags, the smoke test, the
                   builds that failed it), read from the record it leaves beside the libraries.
  OpenMP           the variables that decide whether idle OpenMP threads spin (OMP_WAIT_POLICY, GOMP_SPINCOUNT,
                   KMP_BLOCKTIME), with a warning where two engines on one machine (draftwise and llama-server) would
                   steal each other's cores while one of them waits.
  bandwidth        a STREAM-style read probe: the best of a few passes over a buffer far larger than the caches (1 GiB,
                   or a quarter of the free memory), with the run's threads, read two ways — a matrix-vector product
                   (the weight reads of a decoding step are such products) and a sum — the faster one kept; a few
                   seconds. Either alone understated some machine: the sum read 10-25 % slower than the product on an
                   Intel Xeon, torch's product ~40 % slower than the sum on an AMD EPYC, where lean fp32 decoding
                   (its own kernel) then read faster than the "limit".
  share of limit   decode tokens/s × weight bytes read per step ÷ bandwidth: how close plain decoding came to the
                   fastest this machine's memory allows (the glossary's *bandwidth limit*).
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import time
from functools import cache
from pathlib import Path

ISA = (  # /proc/cpuinfo's names of the features that decide which kernels run
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "avx_vnni",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
)
XFEATURE_XTILEDATA = 18  # AMX tile data's bit in the xsave feature masks
ARCH_GET_XCOMP_SUPP = 0x1021
SYS_ARCH_PRCTL = 158  # x86-64
SPIN = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS", "OMP_PROC_BIND", "GOMP_CPU_AFFINITY")
BANDWIDTH_ENV = "DRAFTWISE_BANDWIDTH"
BUILD_RECORD = "draftwise-build.json"  # what setup built, beside the llama.cpp libraries (`runtimes.llamacpp.build`)


def cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, set[str]]:
    """(CPU model name, the flags of its first processor) as the OS reports them; ('', set()) where it does not."""
    model, flags = "", set()
    try:
        text = Path(path).read_text()
    except OSError:
        return platform.processor() or platform.machine(), flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "cpu model") and not model:
            model = value.strip()
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    return model or platform.machine(), flags


def amx(flags: set[str]) -> str:
    """Whether AMX can run here: 'no' (not in the CPU's flags), 'refused' (the kernel does not support its tile
    data), 'on request' (a process that asks for the permission gets it)."""
    if not {"amx_tile", "amx_int8"} <= flags:
        return "no"
    if platform.machine() != "x86_64":
        return "refused"
    mask = ctypes.c_uint64(0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_SUPP, ctypes.byref(mask)) != 0:
        return "refused"
    return "on request" if mask.value >> XFEATURE_XTILEDATA & 1 else "refused"


def memory() -> dict:
    """Total and available memory in GiB (/proc/meminfo)."""
    out = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("MemTotal", "MemAvailable"):
                out[key.removeprefix("Mem").lower() + "_gib"] = round(int(value.split()[0]) / 2**20, 1)
    except OSError:
        pass
    return out


def openmp(env: dict[str, str] | None = None) -> dict:
    """The OpenMP variables set, and warnings where idle threads would spin on cores another engine needs."""
    env = os.environ if env is None else env
    vars_ = {k: env[k] for k in SPIN if k in env}
    warn = []
    if vars_.get("OMP_WAIT_POLICY", "").lower() == "active":
        warn.append("OMP_WAIT_POLICY=active: idle OpenMP threads spin instead of sleeping")
    count = vars_.get("GOMP_SPINCOUNT", "").lower()
    if count == "infinite" or count.isdigit() and int(count) > 10_000_000:
        warn.append(f"GOMP_SPINCOUNT={count}: idle OpenMP threads spin for long")
    if vars_.get("KMP_BLOCKTIME", "").lower() == "infinite":
        warn.append("KMP_BLOCKTIME=infinite: idle OpenMP threads never sleep")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if vars_.get("OMP_NUM_THREADS", "").isdigit() and int(vars_["OMP_NUM_THREADS"]) > cores:
        warn.append(f"OMP_NUM_THREADS={vars_['OMP_NUM_THREADS']} is more than the {cores} cores this process may use")
    if warn:  # the engines draftwise runs side by side: its own process and llama-server's
        warn = [
            w + " — two engines on this machine (draftwise and llama-server) then steal each other's cores"
            for w in warn
        ]
    return {"env": vars_, "warnings": warn}


def llama_build() -> dict | None:
    """The record `scripts/setup.sh` left of the llama.cpp build the bindings load (None: not built by setup)."""
    import importlib.util

    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "lib" / BUILD_RECORD
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


MATRIX_PATH_RECORD = "matrix-path.json"  # the lean int8/q4 kernel's route here (`runtimes/lean/ladder.py`)


def cpu_key() -> str:
    """This CPU's model name and feature flags, hashed: what a proven kernel path holds for (a disk image or a live
    migration may move to another CPU)."""
    import hashlib

    model, flags = cpuinfo()
    return hashlib.sha256("\n".join([model, *sorted(flags)]).encode()).hexdigest()[:12]


def matrix_route() -> dict | None:
    """The route the lean int8/q4 kernel takes on this CPU as the ladder proved and timed it (None: not yet here):
    its paths in words (`path`), which paths passed their smoke test (`tried`), and per band of rows the path of
    each weight format and every proven path's measured rate (`bands`)."""
    from .paths import cache_dir

    try:
        kept = json.loads((cache_dir("kernels") / MATRIX_PATH_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return kept if kept.get("cpu") == cpu_key() else None


def facts(threads: int | None = None) -> dict:
    """What is known of this machine without measuring anything (instant): machine.json of every run folder."""
    model, flags = cpuinfo()
    cores = os.cpu_count() or 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    build = llama_build()
    route = matrix_route() or {}
    return {
        "cpu": model,
        "arch": platform.machine(),
        "cores": cores,
        "cores_usable": usable,
        "threads": threads,
        "isa": [f for f in ISA if f in flags],
        "amx": amx(flags),
        "matrix_path": route.get("path"),
        "matrix_route": route.get("bands"),
        "matrix_prompts": route.get("prompts"),
        "memory": memory(),
        "openmp": openmp(),
        "llama_cpp": {k: build.get(k) for k in ("flavour", "flags", "reason", "smoke")} if build else None,
        "kernel": platform.release(),
    }


def _probe_bytes() -> int:
    """The probe's buffer: 1 GiB, or a quarter of the available memory when that is less (never under 64 MiB)."""
    free = memory().get("available_gib")
    return int(max(64 * 2**20, min(2**30, free * 2**30 / 4))) if free else 2**30


def bandwidth(threads: int | None = None) -> dict:
    """Measured read bandwidth in GB/s (10^9 bytes): the best of a few matrix-vector products over a matrix far larger
    than the caches, with `threads` threads (module docstring). Measured once per process and thread count; a child
    process (`isolate`) takes its parent's measurement from the environment (DRAFTWISE_BANDWIDTH) instead."""
    inherited = json.loads(os.environ.get(BANDWIDTH_ENV, "{}"))
    if inherited.get("asked_threads", "unset") == threads:
        return inherited
    found = {**_measure(threads), "asked_threads": threads}
    os.environ[BANDWIDTH_ENV] = json.dumps(found)
    return found


@cache
def _measure(threads: int | None, passes: int = 5) -> dict:
    import torch

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        cols = 4096
        mat = torch.ones(_probe_bytes() // (4 * cols), cols)  # written once: its pages are mapped
        vec = torch.ones(cols)
        # two readers of the whole buffer, each a lower bound on what the memory gives: which one is nearer depends on
        # the CPU and torch's BLAS (an Intel Xeon: the product 10-25 % faster; an AMD EPYC: the sum ~65 % faster)
        readers = {"matrix-vector product": lambda: mat @ vec, "sum": mat.sum}
        start = time.perf_counter()
        rates = {name: mat.numel() * 4 / _best_seconds(read, passes) / 1e9 for name, read in readers.items()}
        best = max(rates, key=rates.get)
        return {
            "read_gb_per_s": round(rates[best], 2),
            "reader": best,
            "readers_gb_per_s": {name: round(r, 2) for name, r in rates.items()},
            "buffer_mib": mat.numel() * 4 // 2**20,
            "passes": passes,
            "threads": torch.get_num_threads(),
            "seconds": round(time.perf_counter() - start, 2),
        }
    finally:
        torch.set_num_threads(before)


def _best_seconds(read, passes: int) -> float:
    """The fastest of `passes` calls of `read`, after one to warm up."""
    read()
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        read()
        best = min(best, time.perf_counter() - t)
    return best


def describe(threads: int | None = None) -> dict:
    """`facts` with the measured bandwidth."""
    return {**facts(threads), "bandwidth": bandwidth(threads)}


def share(decode_tokens_per_s: float | None, bytes_per_step: int | None, machine: dict | None) -> float | None:
    """The share of the bandwidth limit a plain decoding reached: tokens/s × bytes read per step ÷ bandwidth."""
    bw = ((machine or {}).get("bandwidth") or {}).get("read_gb_per_s")
    if not (decode_tokens_per_s and bytes_per_step and bw):
        return None
    return decode_tokens_per_s * bytes_per_step / (bw * 1e9)


def limit(bytes_per_step: int | None, machine: dict | None) -> float | None:
    """The bandwidth limit: the tokens/s at which one step's weight reads would take all the measured bandwidth."""
    bw = ((machine or {}).get("bandwidth") or {}).get("read_gb_per_s")
    return bw * 1e9 / bytes_per_step if bw and bytes_per_step else None


def llama_rates(build: dict) -> str:
    """The llama.cpp build's own rates as its smoke test measured them on the default target (llama-bench: a 40- and
    a 4-token prompt, decoding), in words: ' (its smoke test: pp40 489, pp4 330, tg4 205 tokens/s)'."""
    tools = (build.get("smoke") or {}).get("tools") or {}
    return f" (its smoke test: {', '.join(f'{k} {v:g}' for k, v in tools.items())} tokens/s)" if tools else ""


def line(m: dict) -> str:
    """The machine in one line, for a CLI or a report."""
    isa = ", ".join(m["isa"]) or "no AVX2"
    mem = m.get("memory", {}).get("total_gib")
    bw = (m.get("bandwidth") or {}).get("read_gb_per_s")
    build = m.get("llama_cpp") or {}
    parts = [
        f"{m['cpu']} ({m['arch']}), {m['cores_usable']} of {m['cores']} cores usable"
        + (f", {m['threads']} threads used" if m.get("threads") else ""),
        f"ISA: {isa}; AMX {m['amx']}"
        + (f"; int8/q4 kernel: {m['matrix_path']} (smoke-tested, timed)" if m.get("matrix_path") else ""),
        f"{mem:g} GiB memory" if mem else "memory unknown",
        f"read bandwidth {bw:g} GB/s (measured)" if bw else "bandwidth not measured",
        f"llama.cpp build: {build['flavour']}" + llama_rates(build)
        if build.get("flavour")
        else "llama.cpp: not built by setup",
    ]
    return "; ".join(parts) + "".join(f". Warning: {w}" for w in m.get("openmp", {}).get("warnings", []))
