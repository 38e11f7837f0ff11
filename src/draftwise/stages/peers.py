"""llama.cpp's own decoding as `bench` baselines, beside draftwise's methods, on the same token ids.

  llama-cpp                 llama-cpp-python's `Llama.generate()`: autoregressive, greedy (sampled at T > 0)
  llama-cpp-prompt-lookup   the same with its `LlamaPromptLookupDecoding` drafter: γ tokens, n-grams up to the n-gram
                            drafter's `max` when the point's drafter is one, else its default (2)
  llama-cpp-lookup          the same with the point's own draftwise lookup drafter as its draft model
                            (`sd.llama_draft.LookupDraftModel`: what the export's llama-cpp-python snippet runs)
  llama-server[:ARGS]       llama.cpp's server (`peers.llama_server`), one process per baseline for the whole run,
                            started with ARGS (shell-quoted), e.g. `--spec-type ngram-mod` or `-md d.gguf`
  serve[:ARGS]              draftwise's own server (`peers.draftwise_server`: `draftwise serve ARGS`, e.g. a design's
                            `--export DIR --threads 2`; bare: the bench's own target, drafter, γ and runtime options),
                            one process per baseline, asked through its OpenAI API, streamed: `ServeMethod`

llama.cpp's baselines run the target's GGUF: the file the llama.cpp backend runs, else the one a lean / transformers
target names ('default': the shipped Q4_1 file; a .gguf), else one draftwise writes at f32 from the target's HF
checkpoint. So they sit beside either engine: beside the llama.cpp backend on the very file it runs; beside the lean
engine on an f32 copy of an HF checkpoint (the same weights), or on the quantized file a GGUF target is (lean runs its
dequantised weights, so greedy tokens can part at near-ties).

Each method is an object called like bench's methods, `(prompt ids, seed, max_new_tokens) -> record`, that loads or
starts what it needs on its first call and frees it on `close()` (bench's Runner closes them in a `finally`).
Records carry `tokens`, `new_tokens` and `seconds` (prefill included); the server's `seconds` are its own timings
(prompt_ms + predicted_ms, no HTTP), with `prefill_s` (prompt_ms), the client's `wall_s` and its raw `timings`; the
drafting methods carry `drafted` and `accepted` (llama-server's draft_n / draft_n_accepted; counted here for
llama-cpp-prompt-lookup). Every call starts from an empty KV cache: each pays its own prefill, as draftwise's do.

Sampling: the target's distribution itself — no top-k, min-p, typical or repetition penalty. llama-server applies
temperature then top-p (as draftwise does); llama-cpp-python's fixed chain applies top-p *before* temperature, so at
top_p < 1 and T != 1 its distribution differs from draftwise's (the same at top_p = 1).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import torch

from .. import isolate
from ..config import BenchConfig, llama_server_args
from ..config.bench import serve_args
from ..errors import DraftwiseError
from ..gguf.export import written
from ..peers.draftwise_server import DraftwiseServer
from ..peers.llama_server import LlamaServer, find_binary
from ..runtimes.base import Model
from ..targets.spec import parse

PEERS = ("llama-cpp", "llama-cpp-prompt-lookup", "llama-cpp-lookup")
LLAMA_CPP_LOOKUP_NGRAM = 2  # LlamaPromptLookupDecoding's default max_ngram_size


def target_gguf(target: Model) -> Path:
    """The GGUF llama.cpp's baselines run for `target` (see the module docstring)."""
    if target.gguf:
        return Path(target.gguf)
    named = parse(target.name)
    if named.built:
        raise DraftwiseError(f"{target.name}: a random-weight target has no GGUF file for llama.cpp's baselines")
    return named.file or written(target.name, target.name, "f32")


def context_size(longest_prompt: int, config: BenchConfig) -> int:
    """KV positions for the longest prompt, its continuation and a round of drafts, in llama.cpp's 256 steps."""
    need = longest_prompt + config.max_new_tokens + config.gamma + 16
    return max(512, -(-need // 256) * 256)


def _threads(config: BenchConfig) -> int:
    return config.threads or torch.get_num_threads()


def _cut(tokens: list[int], eos: frozenset[int], max_new_tokens: int) -> list[int]:
    """Stop after the first EOS, as the draftwise engine does (llama.cpp may know end tokens the tokenizer does not)."""
    end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
    return tokens[: min(end, max_new_tokens)]


class _Lookup:
    """A llama-cpp-python draft model (its prompt lookup, or draftwise's `LookupDraftModel`), counting what it drafts;
    drafts are cut to the tokens still wanted, as the draftwise engine and llama-server cut theirs (never draft past
    max_new_tokens)."""

    def __init__(self, inner):
        self.inner = inner
        self.room, self.draft, self.fresh, self.drafted = 0, [], False, 0

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        draft = self.inner(input_ids)[: max(self.room, 0)]
        self.draft, self.fresh = draft.tolist(), True
        self.drafted += len(draft)
        return draft


class LlamaCppMethod:
    """llama-cpp-python's `Llama.generate()` on the target's GGUF, with its prompt lookup when `lookup` is set
    ((max n-gram, γ))."""

    def __init__(self, gguf: Path, config: BenchConfig, eos: frozenset[int], n_ctx: int, lookup=None):
        self.gguf, self.config, self.eos, self.n_ctx, self.lookup = gguf, config, eos, n_ctx, lookup
        self.llm = self.draft = None

    def _load(self):
        if self.llm is None:
            from llama_cpp import Llama

            self.draft = _Lookup(self.lookup()) if self.lookup else None
            threads = _threads(self.config)
            # flash attention on: what llama.cpp's default 'auto' (the draftwise engine's and llama-server's) resolves
            # to on the CPU; llama-cpp-python's own default turns it off, and at Q4 that alone changes greedy tokens
            self.llm = Llama(
                model_path=str(self.gguf),
                n_ctx=self.n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                n_gpu_layers=0,
                flash_attn=True,
                draft_model=self.draft,
                verbose=False,
            )
        return self.llm

    def __call__(self, ids: list[int], seed: int, max_new_tokens: int | None = None) -> dict:
        max_new_tokens = max_new_tokens or self.config.max_new_tokens
        llm, c = self._load(), self.config
        llm.reset()  # an empty KV cache: generate() would otherwise reuse a prefix left by the previous call
        isolate.crumb(call=f"llama-cpp-python's generate() on {self.gguf.name}")
        llm.set_seed(seed)
        draft, accepted, k = self.draft, 0, 0
        tokens: list[int] = []
        if draft:  # the first token comes from the prefill, before any draft
            draft.room, draft.fresh, draft.draft, draft.drafted = max_new_tokens - 1, False, [], 0
        start = time.perf_counter()
        gen = llm.generate(
            ids,
            temp=c.temperature,
            top_p=c.top_p,
            top_k=0,
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
            frequency_penalty=0.0,
            presence_penalty=0.0,
            reset=True,
        )
        try:
            for tok in gen:
                if draft:  # a token of the pass that verified the latest draft: accepted while it matches
                    if draft.fresh:
                        draft.fresh, k = False, 0
                    accepted += k < len(draft.draft) and tok == draft.draft[k]  # a mismatch ends the pass
                    k += 1
                tokens.append(int(tok))
                if tok in self.eos or len(tokens) >= max_new_tokens:
                    break
                if draft:
                    draft.room = max_new_tokens - len(tokens) - 1
            seconds = time.perf_counter() - start
        finally:
            gen.close()
        rec = {"tokens": tokens, "new_tokens": len(tokens), "seconds": seconds}
        if draft:
            rec.update(drafted=draft.drafted, accepted=accepted)
        return rec

    def close(self) -> None:
        if self.llm is not None:
            self.llm.close()
            self.llm = None


def _log(log_dir: Path | None, name: str) -> Path | None:
    """A server baseline's log file in the run folder, named after the baseline (None: a temporary file)."""
    if log_dir is None:
        return None
    return Path(log_dir) / (re.sub(r"[^A-Za-z0-9._=-]+", "_", name).strip("_")[:80] + ".log")


class ServerMethod:
    """One llama-server for a `llama-server[:ARGS]` baseline, asked for each completion."""

    def __init__(
        self, name: str, gguf: Path, config: BenchConfig, eos: frozenset[int], n_ctx: int, log_dir: Path | None
    ):
        self.config, self.eos = config, eos
        find_binary(config.llama_server)  # a missing binary is reported before anything is benchmarked
        self.server = LlamaServer(
            gguf,
            threads=_threads(config),
            n_ctx=n_ctx,
            args=llama_server_args(name),
            binary=config.llama_server,
            log=_log(log_dir, name),
        )

    def __call__(self, ids: list[int], seed: int, max_new_tokens: int | None = None) -> dict:
        max_new_tokens = max_new_tokens or self.config.max_new_tokens
        c = self.server.complete(ids, max_new_tokens, self.config.temperature, self.config.top_p, seed)
        tokens = _cut(c.tokens, self.eos, max_new_tokens)
        return {
            "tokens": tokens,
            "new_tokens": len(tokens),
            "seconds": c.seconds,
            "prefill_s": c.timings["prompt_ms"] / 1e3,
            "wall_s": c.wall_s,
            "drafted": c.drafted,
            "accepted": c.accepted,
            "timings": c.timings,
        }

    def close(self) -> None:
        self.server.close()


class ServeMethod:
    """One `draftwise serve` process for a `serve[:ARGS]` baseline (the deploy command of a design's verdict, or any
    serve command line), started on the first call and stopped on `close()`, asked for each completion the way an
    application asks it: `/v1/completions` with the prompt's token ids, streamed (server-sent events).

    `seconds` is the client's wall time through HTTP — the request sent to its last event, the server's queue, JSON and
    streaming included — and that is the point: the command is measured through the API applications call, not by the
    engine's own clock. The record also keeps `wall_s` (the same), `first_token_s` (the client's time to the first
    token), and the server's own figures for the request: `server_seconds` (its decode time, prefill included),
    `prefill_s`, `server_rounds`, `drafted` and `accepted` (totals: a server sends no per-round records)."""

    def __init__(self, name: str, config: BenchConfig, eos: frozenset[int], log_dir: Path | None):
        self.config, self.eos = config, eos
        self.server = DraftwiseServer(serve_args(name, config), log=_log(log_dir, name))

    def __call__(self, ids: list[int], seed: int, max_new_tokens: int | None = None) -> dict:
        max_new_tokens = max_new_tokens or self.config.max_new_tokens
        c = self.server.complete(ids, max_new_tokens, self.config.temperature, self.config.top_p, seed)
        stats = c.extra.get("draftwise")
        if not stats:
            raise DraftwiseError(
                f"{self.server.name} sent no draftwise figures with its usage (log: {self.server.log_path})"
            )
        tokens = _cut(c.token_ids, self.eos, max_new_tokens)
        return {
            "tokens": tokens,
            "new_tokens": len(tokens),
            "seconds": c.wall_s,
            "wall_s": c.wall_s,
            "first_token_s": c.first_token_s if c.first_token_s is not None else c.wall_s,
            "prefill_s": stats["prefill_s"],
            "server_seconds": stats["seconds"],
            "server_rounds": stats["rounds"],
            "drafted": stats["drafted"],
            "accepted": stats["accepted"],
            "finish_reason": c.finish_reason,
        }

    def close(self) -> None:
        self.server.close()


def build(
    name: str,
    config: BenchConfig,
    target: Model,
    lookup_ngram: int | None,
    n_ctx: int,
    log_dir: Path | None = None,
    lookup=None,
):
    """The method of baseline `name` (one of `PEERS`, llama-server[:ARGS] or serve[:ARGS]); `lookup_ngram` is the
    point's n-gram drafter's max n (None when the point's drafter is not one), `lookup` the point's lookup drafter."""
    if serve_args(name) is not None:
        return ServeMethod(name, config, target.eos_ids, log_dir)
    gguf = target_gguf(target)
    if name == "llama-cpp":
        return LlamaCppMethod(gguf, config, target.eos_ids, n_ctx)
    if name == "llama-cpp-prompt-lookup":
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        n = lookup_ngram or LLAMA_CPP_LOOKUP_NGRAM
        return LlamaCppMethod(
            gguf,
            config,
            target.eos_ids,
            n_ctx,
            lookup=lambda: LlamaPromptLookupDecoding(max_ngram_size=n, num_pred_tokens=config.gamma),
        )
    if name == "llama-cpp-lookup":
        from ..sd.llama_draft import LookupDraftModel

        if lookup is None:
            raise DraftwiseError(
                "baseline llama-cpp-lookup runs the point's lookup drafter: give an ngram or suffix drafter"
            )
        return LlamaCppMethod(
            gguf, config, target.eos_ids, n_ctx, lookup=lambda: LookupDraftModel(lookup, config.gamma)
        )
    if llama_server_args(name) is None:
        raise DraftwiseError(f"unknown llama.cpp baseline {name!r}")
    return ServerMethod(name, gguf, config, target.eos_ids, n_ctx, log_dir)
