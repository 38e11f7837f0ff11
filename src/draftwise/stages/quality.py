"""`draftwise quality`: what a lossy runtime costs in quality, against the target on the lean engine at fp32.

int8 weights and activations (`lean:int8`), bf16 (`lean:bf16`) and quantized GGUF files on llama.cpp (`llama.cpp`: the
target's own file, Q4_1 for `default`; `llama.cpp:q8_0|f16|f32`: the target written at that precision) are choices
that trade quality for speed, and a speedup measured on one of them is only worth its quality cost. Teacher-forced on
the prompt texts of the eval split (through the chat template), each runtime is scored at every position t of a prompt
(predicting token t+1) by (a) top-1 agreement: how often its argmax is the fp32 reference's, and (b) the NLL (nats per
token) of the text's actual next token, beside the fp32 reference's own NLL on the same positions.

Records (one per runtime and prompt) hold counts and sums, so quality.json's figures are exact pooled means.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from .. import continuations, isolate
from ..config import QualityConfig, asked_activations, check_runtime
from ..gguf.export import written
from ..rundir import RunDir
from ..runtimes.base import ModelOptions
from ..runtimes.lean import activations, prompt
from ..runtimes.lean.forward import LeanLM
from ..runtimes.llamacpp.load import LLAMA_CPP
from ..runtimes.registry import load
from ..targets.source import gguf_file

REFERENCE = "lean:fp32"


def parse_runtime(name: str, target: str) -> tuple[str, ModelOptions, str]:
    """(label, options, spec to load) of a runtime of `target`. `llama.cpp:QUANT` of a target that is a GGUF file
    ('default': the shipped Q4_1) runs the target written at QUANT (cached; written here on first use)."""
    engine, precision = check_runtime(name)
    if engine == "lean":  # lean:q4-a8: q4, its activation bits set after the load (`run`)
        return name, ModelOptions(dtype=precision.partition("-a")[0], backend="lean"), target
    if precision is None or gguf_file(target) is None:  # an HF dir is written at gguf_quant by load itself
        return name, ModelOptions(backend=LLAMA_CPP, gguf_quant=precision or "f32"), target
    return name, ModelOptions(backend=LLAMA_CPP), str(written(target, target, precision))


@torch.inference_mode()
def _logits(model, ids: list[int], vocab: int | None = None) -> torch.Tensor:
    """Logits [T-1, V] (fp32) at positions 0..T-2 of one whole prompt. A GGUF's vocabulary may hold extra (padding)
    rows beyond the checkpoint's, or the other way round: only the first min(V_ref, V_runtime) logits (`vocab`) are
    compared; the rows past them are no token of the text."""
    model.lm.reset(1, len(ids))
    logits = model.lm.forward(torch.tensor([ids], device=model.lm.device), 0)[0, :-1].float().cpu()
    return logits[:, :vocab] if vocab else logits


def _next_logp(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """log p(actual token t+1) at each position t."""
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)


def _score(model, ids: list[int], ref: dict) -> dict:
    """One prompt's record figures under `model`, against the reference's argmax and log-probs (`ref`); on a lean
    model whose prompt passes take a lossy path here, also its figures after such a prefill (`_prefilled`)."""
    vocab = min(ref["vocab"], model.vocab_size)
    logits = _logits(model, ids, vocab)
    out = {
        "positions": len(ids) - 1,
        "agree": int((logits.argmax(-1) == ref["argmax"]).sum()),
        "nll_sum": float(-_next_logp(logits, ids).sum()),
        "ref_nll_sum": float(-ref["logp"].sum()),
    }
    h = len(ids) // 2
    lossy = prompt.lossy(model.lm, h) if h and h + 1 < len(ids) and isinstance(model.lm, LeanLM) else []
    if lossy:
        out |= _prefilled(model, ids, ref, h, vocab) | {"prefilled_path": "/".join(lossy)}
    return out


@torch.inference_mode()
def _prefilled(model, ids: list[int], ref: dict, h: int, vocab: int) -> dict:
    """The next tokens after a prefill: the prompt's first h tokens through a prompt pass (no logits: the path a
    request's prefill takes), then positions h.. in one pass on the exact path, scored at h..T-2 as `_score` does."""
    lm = model.lm
    lm.reset(1, len(ids))
    lm.forward(torch.tensor([ids[:h]]), 0, n_logits=0)
    logits = lm.forward(torch.tensor([ids[h:]]), h)[0, :-1, :vocab].float()  # positions h..T-2
    logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[h + 1 :]).unsqueeze(1)).squeeze(1)
    return {
        "prefilled_positions": len(ids) - 1 - h,
        "prefilled_agree": int((logits.argmax(-1) == ref["argmax"][h:]).sum()),
        "prefilled_nll_sum": float(-logp.sum()),
        "prefilled_ref_nll_sum": float(-ref["logp"][h:].sum()),
    }


def run(config: QualityConfig, out: str | Path) -> Path:
    if config.threads:
        torch.set_num_threads(config.threads)  # llama.cpp's loads read their thread count from torch
    run_dir = RunDir(out, config)
    done = {(r["runtime"], r["prompt_id"]) for r in run_dir.records()}
    reference = load(config.target, ModelOptions())
    prompts = continuations.prompts_for(reference, "eval", config.suites, config.max_prompt_tokens, config.limit)
    prompts = [(p, ids) for p, ids in prompts if len(ids) > 1]  # a one-token prompt has no next token to score
    todo = {rt: [(p, ids) for p, ids in prompts if (rt, p.id) not in done] for rt in config.runtimes}
    needed = {p.id for pairs in todo.values() for p, _ in pairs}
    bar = tqdm(
        total=len(needed) + sum(map(len, todo.values())),
        desc=f"quality {REFERENCE} (reference)",
        unit="prompt",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=not needed,
    )
    refs = {}  # prompt id -> the reference's argmax and next-token log-probs (not its logits)
    for p, ids in prompts:
        if p.id in needed:
            logits = _logits(reference, ids)
            refs[p.id] = {"argmax": logits.argmax(-1), "logp": _next_logp(logits, ids), "vocab": logits.shape[-1]}
            bar.update(1)
    del reference
    gc.collect()
    for rt, pairs in todo.items():
        if not pairs:
            continue
        bar.set_description(f"quality {rt}")
        isolate.crumb(runtime=rt)  # in an isolated child: the runtime a crash would cost
        label, options, spec = parse_runtime(rt, config.target)
        model = load(spec, options)
        if isinstance(model.lm, LeanLM):  # measured whatever this file's kept verdict (`prompt.keep`) says
            model.lm.prompt_lossy = True
        bits = asked_activations(rt)
        if bits:
            activations.with_activations(model.lm, bits)
        for p, ids in pairs:
            run_dir.append({"runtime": label, "prompt_id": p.id, "suite": p.suite, **_score(model, ids, refs[p.id])})
            bar.update(1)
        del model  # one runtime's model in memory at a time
        gc.collect()
    bar.close()
    summary = summarize(run_dir.records(), config)
    summary["activations_kept"] = keep_activations(config, summary) | keep_prompt_path(config, summary)
    run_dir.write_json("quality.json", summary)
    print(format_quality(summary))
    return run_dir.path


def keep_activations(config: QualityConfig, summary: dict) -> dict[str, str]:
    """A lean:q4-a8 measurement of a GGUF target, kept as that file's activation bits on this machine
    (`activations.keep`): per block from its next load where it kept the bar, 16 bits where it did not. Each such
    runtime's verdict in words."""
    gguf = gguf_file(config.target)
    out = {}
    for rt in config.runtimes:
        s = summary[rt]
        if asked_activations(rt) != 8 or gguf is None or s["agreement"] is None:
            continue
        kept = activations.keep(gguf, 8, s["agreement"], s["nll_delta"])
        bar = f"agreement >= {activations.AGREEMENT_MIN}, ΔNLL <= +{activations.NLL_DELTA_MAX}"
        out[rt] = (
            f"8-bit activations per block keep the bar on {gguf.name} ({bar}): lean q4 runs them on it from now on"
            if kept
            else f"8-bit activations per block miss the bar on {gguf.name} ({bar}): lean q4 keeps 16 bits on it"
        )
    return out


def keep_prompt_path(config: QualityConfig, summary: dict) -> dict[str, str]:
    """A measurement of the next tokens after a lossy prefill of a GGUF target, kept as that file's verdict on this
    machine (`prompt.keep`): where it missed the bar its prompt passes keep the exact path. Each verdict in words."""
    gguf = gguf_file(config.target)
    out = {}
    for name, s in summary.items():
        rt, _, path = name.partition(" after a ")
        if gguf is None or rt not in config.runtimes or not path or s["agreement"] is None:
            continue
        kept = prompt.keep(gguf, s["agreement"], s["nll_delta"])
        out[name] = (
            f"a {path} keeps the bar on {gguf.name}: prompt passes take it where the ladder timed it faster"
            if kept
            else f"a {path} misses the bar on {gguf.name}: prompt passes on it keep the exact path from now on"
        )
    return out


def summarize(records: list[dict], config: QualityConfig) -> dict:
    out = {
        "definitions": "agreement: fraction of scored positions (each prompt position t, predicting token t+1, "
        "teacher-forced on eval prompt texts) where the runtime's argmax equals the fp32 lean "
        "reference's. nll: mean negative log-likelihood (nats/token) of the text's actual next tokens "
        "under the runtime; nll_delta: runtime minus fp32 on the same positions.",
        "target": config.target,
    }
    for rt in config.runtimes:
        rs = [r for r in records if r["runtime"] == rt]
        out[rt] = _pooled(rs, "")
        for path in sorted({r["prefilled_path"] for r in rs if "prefilled_path" in r}):
            prefilled = [r for r in rs if r.get("prefilled_path") == path]  # the next tokens after a lossy prefill
            out[f"{rt} after a {path} prefill"] = _pooled(prefilled, "prefilled_")
    ref = {r["prompt_id"]: r for r in records}  # one record per prompt: the reference's sums are every runtime's
    n = sum(r["positions"] for r in ref.values())
    nll = sum(r["ref_nll_sum"] for r in ref.values()) / n if n else None
    out["reference"] = {"runtime": REFERENCE, "nll": nll, "positions": n, "prompts": len(ref)}
    return out


def _pooled(rs: list[dict], prefix: str) -> dict:
    """Pooled figures of records (`prefix`: the prefilled ones' fields)."""
    n = sum(r[f"{prefix}positions"] for r in rs)
    agree, nll, ref = (sum(r[f"{prefix}{k}"] for r in rs) for k in ("agree", "nll_sum", "ref_nll_sum"))
    return {
        "agreement": agree / n if n else None,
        "nll": nll / n if n else None,
        "nll_delta": (nll - ref) / n if n else None,
        "positions": n,
        "prompts": len(rs),
    }


def sentence(summary: dict, runtime: str) -> str:
    """One runtime's figures in one phrase, e.g. 'top-1 agreement with fp32 0.953, NLL 2.41 (+0.030 over fp32) on 24
    eval prompts'."""
    s = summary.get(runtime)
    if not s or s["agreement"] is None:
        return f"no quality figures for {runtime}"
    return (
        f"top-1 agreement with fp32 {s['agreement']:.3f}, NLL {s['nll']:.2f} ({_signed(s['nll_delta'])} over fp32) "
        f"on {s['prompts']} eval prompts"
    )


def _signed(x: float) -> str:
    return f"{round(x, 3) + 0.0:+.3f}"  # + 0.0: no "-0.000" for a delta that rounds to zero


def format_quality(summary: dict) -> str:
    ref = summary["reference"]
    rows = {rt: s for rt, s in summary.items() if isinstance(s, dict) and s.get("agreement") is not None}
    w = max([16, *map(len, rows)])
    lines = [
        f"{'runtime':<{w}} {'agreement':>9} {'NLL':>7} {'ΔNLL':>7}",
        f"{'fp32 (reference)':<{w}} {'1.000':>9} {ref['nll']:>7.3f} {'':>7}"
        if ref["nll"] is not None
        else f"{'fp32 (reference)':<{w}} (no positions scored)",
    ]
    for rt, s in rows.items():
        if rt != "reference":
            lines.append(f"{rt:<{w}} {s['agreement']:>9.3f} {s['nll']:>7.3f} {_signed(s['nll_delta']):>7}")
    lines.append(f"({ref['positions']} positions of {ref['prompts']} eval prompts; nats/token)")
    lines += list(summary.get("activations_kept", {}).values())
    return "\n".join(lines)
