"""The `design` report's per-runtime part: one verdict per row (a runtime), beside llama-server's best built-in, and the
verify curves of every engine on one chart (see `design/row_verdict.py` for how each row is measured)."""

from __future__ import annotations

import json
from pathlib import Path

from ...report.doc import Doc
from ...report.fmt import interval as _interval
from ...report.fmt import num as _f
from ...report.plots import _save, plt
from ...stages.bench_grid import label
from .. import fastest, row_verdict, rows
from ..pipeline import DesignFolder


def verify_curves(curves: dict[str, dict[int, float]], folder: Path, footer: str) -> Path:
    """t_verify(γ) / t_step of each engine: what a round of γ drafted tokens costs the target, in AR steps."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, curve in curves.items():
        gammas = sorted(curve)
        ax.plot(gammas, [curve[g] for g in gammas], "o-", label=name)
    ax.axhline(1.0, color="0.6", lw=1)
    ax.set(
        xlabel="γ (verify pass over γ+1 tokens)",
        ylabel="verify pass ÷ one AR step",
        title="Verify cost per runtime (batch 1, same machine)",
    )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    return _save(fig, folder / "verify_per_engine.png", footer)


def _curve(profile_json: Path) -> dict[int, float]:
    entry = json.loads(profile_json.read_text())["batches"]["1"]
    return {0: 1.0, **{int(g): r for g, r in entry["verify_over_ar_step"].items()}}


def rows_of(p: DesignFolder) -> list[dict]:
    return [r for name, r in sorted(p.done.items()) if name.startswith("verdict@")]


def quality_note(p: DesignFolder) -> str:
    """What the quality column means, with its sample."""
    if "quality" not in p.done:
        return ""
    ref = json.loads((p.folder("quality") / "quality.json").read_text())["reference"]
    return (
        f"Quality (a lossy runtime's cost, `draftwise quality`): teacher-forced top-1 agreement with the lean engine "
        f"at fp32 and the change in mean NLL of the text's next tokens (nats; fp32: {ref['nll']:.3f}) over "
        f"{ref['positions']} positions of {ref['prompts']} eval prompts. For a GGUF target, fp32 is that file "
        "dequantised: the file's own rounding is not counted, llama.cpp's activation and KV rounding is."
    )


def section(doc: Doc, p: DesignFolder, plots: Path, footer: str) -> None:
    """The rows' table, each row's own verdict and candidates, and the verify curves (nothing when the design ran on
    the lean runtime alone)."""
    verdicts = rows_of(p)
    if not verdicts and not p.dead:
        return
    doc.h("Per runtime: where the verdict is deployed")
    if verdicts:
        _summary(doc, p, verdicts)
    died(doc, p)
    for v in verdicts:
        _row(doc, p, v)
    if verdicts:
        _curves(doc, p, verdicts, plots, footer)


def died(doc: Doc, p: DesignFolder) -> None:
    """The rows whose engine died (by a signal, in a child process): what they cost, and how to measure them again."""
    for row, d in sorted(p.dead.items()):
        doc.p(
            f"**{row}: not measured.** {d['reason']} (in `{d['stage']}`; its folder is kept as "
            f"`stages/{d['stage']}.died`). The crash cost this row only: the design went on and its verdict comes "
            "from the rows that ran. A rerun skips it; `draftwise design ... --retry-died` measures it again."
        )


def _summary(doc: Doc, p: DesignFolder, verdicts: list[dict]) -> None:
    """One line per runtime: its plain decoding, its verdict, its quality, and llama-server's best built-in."""
    lean = p.done["verdict"]
    lean_pt = next(iter(json.loads((p.folder("bench-select") / "grid.json").read_text())["points"]))
    quality = rows.quality_of(p)
    table = [
        [
            f"draftwise lean ({p.config.dtype})",
            _f(lean_pt["methods"]["ar"]["tokens_per_s"], ".1f"),
            _what(lean),
            _interval(lean["speedup"]),
            "reference" if p.config.dtype == "fp32" else "-",
            "-",
            "-",
            "-",
            "-",
            "-",
        ]
    ]
    for v in verdicts:
        b = v["builtins"].get(v["best_builtin"]) if v["best_builtin"] else None
        plain = v["builtins"].get("llama-server")
        table.append(
            [
                v["engine"] + _written(v),
                _f(v["ar_tokens_per_s"], ".1f"),
                _what(v),
                _interval(v["speedup"]),
                quality.get(v["engine"], "-"),
                f"`{row_verdict.short_args(v['best_builtin'])}`" if b else "-",
                _f(b and b["tokens_per_s"], ".1f"),
                _interval(b and b["speedup"]),
                _interval(v["verdict_over_best_builtin"]),
                _f(plain and plain["tokens_per_s"], ".1f"),
            ]
        )
    doc.table(
        [
            "engine",
            "plain decoding tok/s (draftwise AR)",
            "verdict",
            "speedup over plain [95 %]",
            "quality vs fp32",
            "best llama-server built-in",
            "its tok/s",
            "its speedup over draftwise AR [95 %]",
            "verdict ÷ best built-in [95 %]",
            "llama-server plain tok/s",
        ],
        table,
    )
    if quality:
        doc.p(quality_note(p))
    doc.p(
        "Each row: one interleaved grid on that engine, the same eval prompts and token ids for every method, T = 0, "
        "prefill included; intervals are paired bootstraps over prompts. llama-server built-ins run with their own "
        "defaults and, for each draftwise candidate, its nearest built-in with its settings; their tokens/s come from "
        "the server's own timings (prompt + generation)."
    )


def _profile_step_s(p: DesignFolder, engine: str) -> float | None:
    """The AR step (seconds) of a row's profile, the unit its replayed predictions were priced in."""
    path = p.folder(f"profile@{engine}") / "profile.json"
    return json.loads(path.read_text())["batches"]["1"]["ar_step_ms"] / 1e3 if path.exists() else None


def _predictions(doc: Doc, p: DesignFolder, v: dict) -> None:
    """A row's candidates: measured speedup, TAR, α, and the replayed decode prediction beside the measured one."""
    tuned = p.done.get(f"tune-lookup@{v['engine']}", {})
    points = json.loads((p.folder(f"bench-select@{v['engine']}") / "grid.json").read_text())["points"]
    decode = {r["drafter"]: r["methods"]["sd"].get("decode_tokens_per_s") for r in points}
    ar = next((r["methods"]["ar"].get("decode_tokens_per_s") for r in points if "ar" in r["methods"]), None)
    step = _profile_step_s(p, v["engine"])
    rows = []
    for n, c in v["candidates"].items():
        alone = (tuned.get(n) or {}).get("predicted_tokens_per_s")
        ratio = alone * step if alone and step else None  # the replayed SD / AR, from the profile's own AR step
        anchored = ratio * ar if ratio and ar else None
        measured = decode.get(c["spec"])
        rows.append(
            [
                f"{n} ({label(c['spec'], 48)}, γ={c['gamma']})",
                _interval(c["speedup"]),
                _f(c["tar"]),
                _f(c["alpha"], ".3f"),
                _f(alone, ".1f"),
                _f(ratio, ".2f", "×"),
                _f(anchored, ".1f"),
                _f(measured, ".1f"),
                _f(100 * (anchored / measured - 1), "+.1f", " %") if anchored and measured else "-",
            ]
        )
    doc.table(
        [
            "method",
            "SD / AR [95 %]",
            "TAR",
            "α",
            "predicted decode tok/s (replayed, the profile's times)",
            "predicted SD / AR (decode)",
            "predicted decode tok/s (that × this grid's AR)",
            "measured decode tok/s",
            "predicted ÷ measured",
        ],
        rows,
    )
    doc.p(
        "Predicted: the tuned setting's rounds replayed over the target's greedy text and priced with this engine's "
        "profiled verify curve (a model drafter's step, the hybrid's, likewise: its ratio to the target step timed "
        "beside it); its ratio to the profile's AR step is anchored on the AR decode speed measured in this same "
        "grid, as a profile's absolute milliseconds, taken in another process, move by 5–10 % from run to run while "
        "ratios measured side by side hold."
    )


def _row(doc: Doc, p: DesignFolder, v: dict) -> None:
    """A row's verdict sentence, how faithful its runtime is, its candidates and its llama-server built-ins."""
    doc.p(
        row_verdict.sentence(v)
        + fastest.versus(p.done.get("fastest"), v["engine"], v.get("method", "sd") if v["recommend"] else "ar")
    )
    doc.p(_fidelity(v))
    _predictions(doc, p, v)
    if not v["builtins"]:
        return
    doc.table(
        [
            "llama-server built-in",
            "tok/s",
            "over draftwise AR [95 %]",
            "over llama-server plain [95 %]",
            "drafted",
            "accepted",
        ],
        [
            [
                f"`{row_verdict.short_args(m)}`",
                _f(b["tokens_per_s"], ".1f"),
                _interval(b["speedup"]),
                _interval(b.get("over_server_plain")),
                _f(b.get("drafted"), "d"),
                _f(b.get("accepted"), "d"),
            ]
            for m, b in v["builtins"].items()
        ],
    )


def _curves(doc: Doc, p: DesignFolder, verdicts: list[dict], plots: Path, footer: str) -> None:
    """Every runtime's verify curve on one chart, and in words."""
    curves = {f"draftwise lean ({p.config.dtype})": _curve(p.folder("profile") / "profile.json")}
    curves.update({v["engine"]: _curve(p.folder(f"profile@{v['engine']}") / "profile.json") for v in verdicts})
    doc.img(verify_curves(curves, plots, footer), "Verify pass over γ+1 tokens in AR steps, per runtime")
    doc.p(
        "Verify cost per runtime (γ: AR steps): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{g} {r:.2f}" for g, r in sorted(c.items()) if g) for name, c in curves.items()
        )
        + "."
    )


def _written(v: dict) -> str:
    """How a row's file came to be: the target's own, an f32 copy (its weights as they are), or a requantization."""
    if v.get("dtype") == "q4":
        return " (the target file's own 4-bit blocks)"
    if v["shipped"]:
        return " (the file the target ships as)"
    return " (an F32 copy)" if v["quant"] == "F32" else " (requantized: a lossy choice)"


def _what(v: dict) -> str:
    if not v["recommend"]:
        return f"plain decoding (best: {v['drafter']}, γ={v['gamma']})"
    return f"{v['drafter']} ({label(v['spec'], 40)}), γ={v['gamma']}"


def _fidelity(v: dict) -> str:
    """What the greedy identical fraction means on this engine."""
    same, div = v.get("identical"), v.get("divergence") or {}
    if same is None:
        return ""
    text = f"Greedy SD gave AR's tokens on {100 * same:.0f} % of prompts with {v['drafter']} on {v['engine']}"
    if same < 1 and div.get("first"):
        text += (
            f"; where they differ, the first difference came after {div['first_min']}–{div['first_max']} "
            f"identical tokens (median {div['first_median']})"
        )
    if v.get("backend", "llama.cpp") != "llama.cpp":
        return text + (
            ". On the lean engine each row of a verify pass has its one-token step's bits (per-token int8 "
            "scales, exact integer sums), so greedy SD must reproduce AR: anything below 100 % is a bug."
        )
    if v["quant"] in ("F32",):
        return (
            text + ". At F32 the two should agree: a difference means llama.cpp's multi-token pass rounds "
            "differently from its one-token step here."
        )
    return text + (
        ". At quantized precision llama.cpp's multi-token pass may round differently from its one-token "
        "step, so a near-tie between two tokens can go the other way: each output is still the target's "
        "greedy text under one of the two roundings, not a sample from another model."
    )
