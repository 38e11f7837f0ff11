"""llama.cpp as an engine: a GGUF model at its own quantization behind the interface the SD loop drives.

`LlamaCppLM` speaks the same contract as `LeanLM` — `reset(batch, max_len)`, `forward(ids [B, T], pos, n_logits)` ->
logits [B, n, V], `vocab_size` — over llama-cpp-python's low-level API (the C calls, not its `Llama` class):

  * one `llama_decode` per pass, with output rows requested for the last `n_logits` positions only (llama.cpp then
    computes the LM head for those rows alone, as the lean forward does);
  * a rollback is `llama_memory_seq_rm(seq, p0, -1)`: every cached position from p0 on is dropped before a pass that
    starts at p0, so "call forward with a smaller pos" keeps meaning what it means on the lean engine;
  * batch rows are llama.cpp sequence ids. A left-padded batch (`start`) submits each row's real tokens only, at
    positions counted from its first real token (llama.cpp wants every sequence to start at position 0; RoPE is
    relative, so the logits are the same). Batched SD (`positions`, `key_positions`, see `sd.rows`) submits each
    row's real tokens at their own positions and drops what the row rolled back.

llama.cpp keeps its own KV cache in a context whose size is fixed when it is made, so `reset` makes a new context
only when a larger one is needed. Everything llama.cpp prints goes to a log kept here: a failure is reported as one
line with llama.cpp's own reason.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections import deque
from pathlib import Path

import numpy as np
import torch

from ... import isolate
from ...errors import DraftwiseError

PINNED = "0.3.36"
GGML_TYPE_F32 = 0  # llama-cpp-python, built from source by scripts/setup.sh (its vendored llama.cpp)
_LOG: deque[str] = deque(maxlen=64)
_LOG_CALLBACK = None  # kept alive: llama.cpp calls it from C


def _lib():
    """The llama-cpp-python bindings, with llama.cpp's log routed into `_LOG` instead of stderr."""
    global _LOG_CALLBACK
    try:
        import llama_cpp
        from llama_cpp import llama_cpp as C
    except (ImportError, OSError) as e:
        raise DraftwiseError(
            f"the llama.cpp backend needs llama-cpp-python=={PINNED} built with its library: run "
            f"`bash scripts/setup.sh` ({str(e).splitlines()[0]})"
        ) from e
    if _LOG_CALLBACK is None:

        @C.llama_log_callback
        def keep(level: int, text: bytes, user_data) -> None:
            _LOG.append(text.decode("utf-8", "replace"))

        _LOG_CALLBACK = keep
        C.llama_log_set(keep, ctypes.c_void_p(0))
        C.llama_backend_init()
    return llama_cpp, C


def last_error() -> str:
    """llama.cpp's own last words (its error lines), for a one-line message."""
    lines = [l.strip() for l in "".join(_LOG).splitlines() if l.strip()]
    # llama.cpp states the reason on an "error" line, then says "failed to load model": the reason comes first
    errors = [l for l in lines if "error" in l.lower()]
    failed = [l for l in lines if "failed" in l.lower() or "unknown" in l.lower()]
    return (errors or failed or lines or ["no reason given"])[-1]


def build_info() -> dict:
    """Which llama.cpp a timing was taken with: the bindings' version, ggml's version and commit (the library the
    bindings load), and the CPU features it was built for."""
    llama_cpp, C = _lib()
    base = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    info = {"llama_cpp_python": llama_cpp.__version__}
    for name in ("ggml_version", "ggml_commit"):
        fn = getattr(base, name, None)
        if fn is not None:
            fn.restype = ctypes.c_char_p
            info[name.removeprefix("ggml_")] = fn().decode()
    info["system_info"] = C.llama_print_system_info().decode().strip().rstrip("|").strip()
    return info


def step_bytes(gguf: str | os.PathLike) -> int:
    """Bytes of weights one decoding step of a GGUF file reads, at the file's own types: every tensor, the token
    embedding only when it is the head too (a step gathers one row of it)."""
    path = Path(gguf)
    return _step_bytes(path, path.stat().st_size, path.stat().st_mtime_ns)


@functools.cache
def _step_bytes(path: Path, size: int, mtime: int) -> int:
    import gguf as gg

    tensors = {t.name: int(t.n_bytes) for t in gg.GGUFReader(str(path)).tensors}
    untied = "output.weight" in tensors
    return sum(n for name, n in tensors.items() if not (untied and name == "token_embd.weight"))


class LlamaCppModel:
    """A loaded GGUF file (weights shared by every context made from it)."""

    def __init__(self, path: str | os.PathLike, threads: int | None = None):
        _, C = _lib()
        self.path = Path(path)
        params = C.llama_model_default_params()
        params.n_gpu_layers = 0
        _LOG.clear()
        model = C.llama_model_load_from_file(str(self.path).encode(), params)
        if not model:
            raise DraftwiseError(f"llama.cpp cannot load {self.path}: {last_error()}")
        self.ptr, self.C = model, C
        self.vocab = C.llama_model_get_vocab(model)
        self.vocab_size = C.llama_vocab_n_tokens(self.vocab)
        self.threads = threads or torch.get_num_threads()

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = self.C.llama_model_meta_val_str(self.ptr, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def __del__(self):
        if getattr(self, "ptr", None):
            self.C.llama_model_free(self.ptr)
            self.ptr = None


class LlamaCppLM:
    """The engine interface (see `LeanLM`) over one llama.cpp context of a `LlamaCppModel`. By default the context
    is llama.cpp's own (what llama-server runs: flash attention where llama.cpp picks it, an f16 KV cache);
    `exact` makes both f32, for comparisons with the torch forward."""

    def __init__(self, model: LlamaCppModel, config=None, exact: bool = False):
        self.model, self.C, self.config, self.exact = model, model.C, config, exact
        self.vocab_size = model.vocab_size
        self.ctx = None
        self.n_ctx = self.n_seq = 0
        self.batch = None
        self.batch_cap = 0
        self.cached: list[int] = []  # per sequence: positions 0..cached[b]-1 are in llama.cpp's cache
        self.max_len = 0

    device = torch.device("cpu")
    dtype = torch.float32

    def reset(self, batch_size: int, max_len: int) -> None:
        """Room for `max_len` positions of each of `batch_size` sequences; the cache starts empty."""
        C = self.C
        if self.ctx is None or batch_size > self.n_seq or batch_size * max_len > self.n_ctx:
            self._free_ctx()
            params = C.llama_context_default_params()
            params.n_ctx = max(256, batch_size * max_len)
            params.n_batch = params.n_ubatch = min(params.n_ctx, 512)
            params.n_seq_max = batch_size
            params.n_threads = params.n_threads_batch = self.model.threads
            params.kv_unified = True  # sequences share one cache of n_ctx cells (each may use up to max_len)
            params.no_perf = True
            if self.exact:  # llama.cpp's defaults (an f16 KV cache; a CPU flash-attention kernel that rounds q to f16)
                params.type_k = params.type_v = GGML_TYPE_F32  # move logits by ~1e-2; exact matches torch to ~1e-5
                params.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_DISABLED
            _LOG.clear()
            self.ctx = C.llama_init_from_model(self.model.ptr, params)
            if not self.ctx:
                raise DraftwiseError(
                    f"llama.cpp cannot make a context of {params.n_ctx} positions for "
                    f"{self.model.path.name}: {last_error()}"
                )
            self.n_ctx, self.n_seq = params.n_ctx, batch_size
            self.mem = C.llama_get_memory(self.ctx)
        C.llama_memory_clear(self.mem, True)
        self.cached = [0] * batch_size
        self.max_len = max_len

    def _free_ctx(self) -> None:
        if self.ctx:
            self.C.llama_free(self.ctx)
            self.ctx = None

    def __del__(self):
        self._free_ctx()
        if self.batch is not None:
            self.C.llama_batch_free(self.batch)

    def _batch(self, n: int):
        if n > self.batch_cap:
            if self.batch is not None:
                self.C.llama_batch_free(self.batch)
            self.batch_cap = max(n, 2 * self.batch_cap, 64)
            self.batch = self.C.llama_batch_init(self.batch_cap, 0, 1)
        return self.batch

    def _rollback(self, seq: int, length: int) -> None:
        if self.cached[seq] > length:
            self.C.llama_memory_seq_rm(self.mem, seq, length, -1)
            self.cached[seq] = length

    def _decode(self, tokens: list[tuple[int, int, int, bool]]) -> np.ndarray:
        """One llama_decode over (seq, position, token, wants logits) entries -> logits [outputs, V] in entry order."""
        C = self.C
        batch = self._batch(len(tokens))
        for i, (seq, p, tok, out) in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tok, p, 1, out
            batch.seq_id[i][0] = seq
        batch.n_tokens = len(tokens)
        n_out = sum(t[3] for t in tokens)
        if len(tokens) > self.C.llama_n_batch(self.ctx):
            raise DraftwiseError(
                f"a pass of {len(tokens)} tokens exceeds llama.cpp's batch of {C.llama_n_batch(self.ctx)}"
            )
        isolate.crumb(call=f"llama_decode of {len(tokens)} token(s) on {self.model.path.name}")
        isolate.fault_point("llama.cpp")
        rc = C.llama_decode(self.ctx, batch)
        if rc != 0:
            raise DraftwiseError(f"llama_decode failed ({rc}) on {self.model.path.name}: {last_error()}")
        for seq, p, _, _ in tokens:
            self.cached[seq] = max(self.cached[seq], p + 1)
        if not n_out:
            return np.empty((0, self.vocab_size), dtype=np.float32)
        ptr = C.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_out, self.vocab_size)).copy()

    def _decode_chunked(self, tokens):
        """Long passes (prefill) in chunks of the context's batch size; logits of the chunks concatenated."""
        step = self.C.llama_n_batch(self.ctx)
        parts = [self._decode(tokens[i : i + step]) for i in range(0, len(tokens), step)]
        return np.concatenate(parts) if len(parts) > 1 else parts[0]

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        pos: int,
        n_logits: int | None = None,
        start: list[int] | None = None,
        positions: torch.Tensor | None = None,
        key_positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits [B, n, V] of the last `n_logits` of the T positions pos..pos+T-1 (all T when None; none when 0).
        See the module docstring for `start` (left padding) and `positions` / `key_positions` (batched SD)."""
        B, T = ids.shape
        if self.ctx is None or B > self.n_seq or pos + T > self.max_len:
            raise ValueError(
                f"llama.cpp context holds {self.max_len} positions for batch {self.n_seq}; need {pos + T} "
                f"for batch {B}: call reset() first"
            )
        n = T if n_logits is None or key_positions is not None and n_logits != 0 else n_logits
        rows = ids.tolist()
        entries, where = [], []  # where: (row, column) of each output entry
        for b in range(B):
            if key_positions is not None:  # batched SD: row b's real tokens are the slots its key_positions mark
                real = (key_positions[b, pos : pos + T] >= 0).tolist()
                first = int(positions[b, 0])
                self._rollback(b, first)
                cols = [t for t in range(T) if real[t]]
                entries += [(b, first + t, rows[b][t], n_logits != 0) for t in cols]
                where += [(b, t) for t in cols] if n_logits != 0 else []
                continue
            offset = start[b] if start is not None else 0
            self._rollback(b, pos - offset if pos >= offset else 0)
            for t in range(T):
                if pos + t < offset:
                    continue  # left padding: not submitted
                out = t >= T - n
                entries.append((b, pos + t - offset, rows[b][t], out))
                if out:
                    where.append((b, t - (T - n)))
        logits = self._decode_chunked(entries)
        out = torch.zeros(B, n, self.vocab_size)
        if len(where) == B * n and key_positions is None:
            out.copy_(torch.from_numpy(logits).view(B, n, self.vocab_size))
        else:
            for i, (b, t) in enumerate(where):
                out[b, t] = torch.from_numpy(logits[i])
        return out  # [B, n, V]

    def weight_bytes(self) -> int:
        """Bytes of weights one decoding step reads, at the file's own types (`step_bytes`)."""
        return step_bytes(self.model.path)

    def kv_bytes(self) -> int:
        """Bytes of llama.cpp's KV cache as allocated for this context (its state size is a close stand-in)."""
        return int(self.C.llama_state_get_size(self.ctx)) if self.ctx else 0
