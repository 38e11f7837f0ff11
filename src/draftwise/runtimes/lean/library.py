"""The lean engine's C kernels as a library: the sources compiled once with the system C compiler into the draftwise
cache (named by a hash of the sources, flags and compiler), loaded with ctypes, their signatures declared; and the
ctypes mirrors of `cpu_layer.c`'s structs. `kernels.py` wraps the functions for torch tensors.

`load(("DRAFTWISE_AMX_EMULATE",))` builds the AMX path with the tile instructions in plain C (`cpu_int8_amx.c`): how
tests check its tiling on a CPU without AMX.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from functools import lru_cache
from importlib.resources import files

import torch

from ...paths import cache_dir

# AVX-512 code paths say so per function; no contraction into FMA where the code does not ask for one (the int8
# kernel's operations must be torch's, bit for bit)
FLAGS = ["-O3", "-mavx2", "-mfma", "-mf16c", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC"]
SOURCES = (
    "cpu_kernels.c",
    "cpu_int8.h",
    "cpu_int8_avx512.h",
    "cpu_int8_avx2.h",
    "cpu_int8.c",
    "cpu_int8_quant.c",
    "cpu_int8_avx512.c",
    "cpu_int8_avx2.c",
    "cpu_int8_amx.c",
    "cpu_int8_q8k.c",
    "cpu_int8_q8k_avx2.c",
    "cpu_layer.c",
)


@lru_cache(maxsize=4)
def load(defines: tuple[str, ...] = ()):
    """The compiled kernel library (with these -D `defines`), or None (with one warning saying why) when it cannot be
    used here."""
    if os.environ.get("DRAFTWISE_NO_KERNEL"):
        return None
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        return None
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        warnings.warn("draftwise: no C compiler found; CPU decoding falls back to torch matmul (slower)", stacklevel=2)
        return None
    sources = {name: files("draftwise.runtimes.lean").joinpath(name).read_text() for name in SOURCES}
    flags = FLAGS + [f"-D{d}" for d in defines]
    key = hashlib.sha256(("".join(sources.values()) + " ".join(flags) + compiler).encode()).hexdigest()[:16]
    lib = cache_dir("kernels") / f"cpu_kernels-{key}.so"
    if not lib.exists():
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in sources.items():
                with open(os.path.join(tmp, name), "w") as f:
                    f.write(text)
            out = os.path.join(tmp, "cpu_kernels.so")
            paths = [os.path.join(tmp, name) for name in sources if name.endswith(".c")]
            done = subprocess.run([compiler, *flags, *paths, "-o", out], capture_output=True, text=True)
            if done.returncode != 0:
                warnings.warn(
                    f"draftwise: compiling the CPU kernel failed, falling back to torch: {done.stderr.strip()[:300]}",
                    stacklevel=2,
                )
                return None
            os.replace(out, lib)  # atomic: a concurrent process sees the whole file or none
    dll = ctypes.CDLL(str(lib))
    dll.draftwise_small_gemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 3 + [ctypes.c_int]
    dll.draftwise_rms_norm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float]
    dll.draftwise_attention.argtypes = (
        [ctypes.c_void_p] * 5
        + [ctypes.c_int64] * 7
        + [ctypes.c_float, ctypes.c_int]
        + [ctypes.c_void_p] * 2
        + [ctypes.c_float, ctypes.c_int64, ctypes.c_float]
    )
    dll.draftwise_silu_mul.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
    dll.draftwise_gelu_tanh_mul.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 2
    dll.draftwise_softcap.argtypes = [ctypes.c_void_p] + [ctypes.c_int64] * 2 + [ctypes.c_float]
    dll.draftwise_int8_gemm.argtypes = (
        [ctypes.c_void_p] * 8 + [ctypes.c_int64] * 4 + [ctypes.c_int, ctypes.c_char_p] + [ctypes.c_int] * 3
    )
    dll.draftwise_int8_isa.restype = ctypes.c_int
    dll.draftwise_q8k_gemm.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 4 + [ctypes.c_int] * 2
    dll.draftwise_int8_band.argtypes = [ctypes.c_int64]
    dll.draftwise_int8_band.restype = ctypes.c_int
    dll.draftwise_amx_granted.restype = ctypes.c_int
    dll.draftwise_layers.argtypes = (
        [ctypes.POINTER(ctypes.POINTER(LayerStruct)), ctypes.c_void_p, ctypes.c_int64]
        + [ctypes.c_void_p] * 3
        + [ctypes.c_int64] * 3
        + [ctypes.c_void_p] * 2
        + [ctypes.c_int64]
        + [ctypes.c_void_p] * 2
        + [ctypes.c_int64, ctypes.c_int, ctypes.c_char_p]
    )
    return dll


class Matrix(ctypes.Structure):
    """cpu_layer.c's dw_matrix: an fp32 weight (w) or an int8 / q4 one (q, s, z, sd, zd, qsum; bits, fmt), its bias
    or NULL."""

    _fields_ = [(n, ctypes.c_void_p) for n in ("w", "q", "s", "z", "sd", "zd", "qsum", "bias")] + [
        (n, ctypes.c_int64) for n in ("N", "K", "Kp", "bits", "fmt", "abits")
    ]


class LayerStruct(ctypes.Structure):
    """cpu_layer.c's dw_layer: pointers into one `lean.Layer`'s buffers, and its settings."""

    _fields_ = (
        [("qkv", Matrix), ("o", Matrix), ("gu", Matrix), ("down", Matrix)]
        + [(n, ctypes.c_void_p) for n in ("ln_attn", "ln_attn_out", "ln_mlp", "ln_mlp_out", "q_norm", "k_norm")]
        + [(n, ctypes.c_int64) for n in ("H", "KV", "hd", "window")]
        + [(n, ctypes.c_float) for n in ("eps", "scale", "softcap")]
        + [("gelu", ctypes.c_int)]
    )
