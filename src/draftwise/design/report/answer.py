"""The design report's answer (`fastest`): the verdict sentence, then every option of the last grid on the user's
traffic — time to first token, decode speed, tokens/s with prefill and request time, for the traffic's whole and per
temperature — with each option's crossover against the verdict, and a plot of request time against answer length."""

from __future__ import annotations

from pathlib import Path

from ... import traffic
from ...report.doc import Doc
from ...report.fmt import interval as _interval
from ...report.fmt import num as _f
from ...report.plots import _save, plt
from .. import fastest, rows
from ..pipeline import DesignFolder
from . import per_row, served


def section(doc: Doc, p: DesignFolder, f: dict, plots: Path, footer: str) -> None:
    """The answer's sentence, its table and plot, the served figure."""
    quality = rows.quality_of(p)
    reference = {fastest.lean_name(p.config): "the reference"} if p.config.dtype == "fp32" else {}
    cost = quality.get(f["runtime"])
    doc.p(
        fastest.sentence(f, fastest.row_verdicts(p))
        + (f" Its quality against fp32 (a lossy runtime): {cost}." if cost else "")
    )
    groups = [("traffic", f)] + [(f"T = {t}", x) for t, x in f.get("temperatures", {}).items()]
    doc.table(
        [
            "requests",
            "option (one interleaved grid)",
            "first token (ms)",
            "decode tokens/s",
            "tokens/s with prefill",
            "request (s)",
            "over the fastest plain [95 %]",
            "crossover with the verdict",
            "quality vs fp32",
        ],
        [
            [
                name if i == 0 else "",
                fastest.describe(n) + (" (plain)" if o["plain"] else "") + (" ← verdict" if n == x["option"] else ""),
                _f(1e3 * o["ttft_s"], ".0f") if "ttft_s" in o else "-",
                _f(o["decode_tokens_per_s"], ".1f") if "ttft_s" in o else "-",
                _f(o["tokens_per_s"], ".1f"),
                _f(o["request_s"], ".2f") if "ttft_s" in o else "-",
                _interval(o["speedup"]),
                _crossover(x, n),
                quality.get(n.split("/")[0], reference.get(n.split("/")[0], "-")),
            ]
            for name, x in groups
            for i, (n, o) in enumerate(sorted(x["options"].items(), key=lambda kv: -kv[1]["speedup"][0]))
        ],
    )
    if f.get("temperatures"):
        doc.img(
            plot_request_time(f, plots / "request_time.png", footer),
            "Request time against answer length (first token + answer × time per output token) per temperature: "
            "the verdict and the fastest plain decoding of each engine; dots where they cross",
        )
    doc.p(
        "The rule: " + f["rule"] + ". Request time = first token + answer length × time per output token (decode "
        "seconds over tokens decoded), at the answer length the target gave each request; the crossover is the answer "
        "length at which an option and the verdict take equally long. Each runtime's own verdict, below and under "
        "*Per runtime*, compares a method with that engine's AR. " + per_row.quality_note(p)
    )
    served.section(doc, p)


def _crossover(x: dict, n: str) -> str:
    """Option n's crossover with x's verdict, in words."""
    if n == x["option"] or "ttft_s" not in x["options"][n]:
        return "-"
    a, b = (traffic.Figures(**fastest._fields(x["options"][m])) for m in (x["option"], n))
    at = traffic.crossover(a, b)
    if at is None:
        return "never faster" if a.at(1) <= b.at(1) else "always faster"
    return f"faster beyond ~{at:.0f} tokens" if b.tpot_s < a.tpot_s else f"faster below ~{at:.0f} tokens"


def lines(x: dict, longest: int) -> dict[str, traffic.Figures]:
    """The options a plot draws for one verdict record: the verdict, each engine's fastest plain decoding, and any
    option that crosses the verdict within `longest` new tokens."""
    figs = {n: traffic.Figures(**fastest._fields(o)) for n, o in x["options"].items() if "ttft_s" in o}
    if x["option"] not in figs:
        return {}
    verdict = figs[x["option"]]
    out = {x["option"]: verdict}
    engines = {x["option"].split("-")[0]} if x["options"][x["option"]]["plain"] else set()
    for n, fg in sorted(figs.items(), key=lambda kv: kv[1].request_s):
        engine = n.split("-")[0]  # lean-int8 and lean-fp32: the lean engine; llama.cpp-Q4_1: llama.cpp
        at = traffic.crossover(verdict, fg)
        if x["options"][n]["plain"] and engine not in engines or at is not None and at <= longest:
            out[n] = fg
            engines |= {engine} if x["options"][n]["plain"] else set()
    return out


def plot_request_time(f: dict, path: Path, footer: str, longest: int = 512) -> Path:
    """One panel per temperature: request time against answer length for `lines`, crossings marked."""
    temps = f["temperatures"]
    fig, axes = plt.subplots(1, len(temps), figsize=(5 * len(temps), 3.8), squeeze=False)
    for ax, (t, x) in zip(axes[0], temps.items()):
        drawn = lines(x, longest)
        for n, fg in drawn.items():
            ax.plot(
                [0, longest],
                [fg.at(0), fg.at(longest)],
                lw=2 if n == x["option"] else 1.2,
                label=fastest.describe(n) + (" (verdict)" if n == x["option"] else ""),
            )
        verdict = drawn.get(x["option"])
        for n, fg in drawn.items():
            at = traffic.crossover(verdict, fg) if verdict and n != x["option"] else None
            if at is not None and at <= longest:
                ax.plot([at], [fg.at(at)], "ko", ms=4)
                ax.annotate(f"{at:.0f}", (at, fg.at(at)), textcoords="offset points", xytext=(4, -10), fontsize=7)
        ax.set(xlabel="answer length (new tokens)", ylabel="request time (s)", title=f"T = {t}")
        ax.legend(fontsize=6)
    return _save(fig, path, footer)
