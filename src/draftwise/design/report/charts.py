"""The `design` report's own plots (profile and sweep plots come from `plots`), each drawn from derived tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ...report.plots import _save, plt


def tar_per_task(tar: dict[float, dict[str, float]], folder: Path, footer: str) -> Path:
    """Grouped bars: measured TAR of the chosen drafter per task (suite) and temperature."""
    suites = sorted({s for per in tar.values() for s in per})
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.8 / max(1, len(tar))
    for i, (t, per) in enumerate(sorted(tar.items())):
        ax.bar(np.arange(len(suites)) + i * width, [per.get(s, 0) for s in suites], width, label=f"T={t:g}")
    ax.set_xticks(np.arange(len(suites)) + width * (len(tar) - 1) / 2, suites, rotation=20, fontsize=8)
    ax.axhline(1.0, color="0.5", lw=1)
    ax.set(ylabel="TAR (tokens per round, bonus counted)", title="TAR per task and temperature (chosen drafter, γ*)")
    ax.legend(fontsize=7)
    return _save(fig, folder / "tar_per_task.png", footer)


def speedup_per_task(speedup: dict[str, dict[str, float]], folder: Path, footer: str) -> Path:
    """Grouped bars: measured speedup over draftwise AR per task (suite) and candidate, with the break-even line."""
    suites = sorted({s for per in speedup.values() for s in per})
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(speedup))
    for i, (name, per) in enumerate(speedup.items()):
        ax.bar(np.arange(len(suites)) + i * width, [per.get(s, 0) for s in suites], width, label=name)
    ax.set_xticks(np.arange(len(suites)) + width * (len(speedup) - 1) / 2, suites, rotation=20, fontsize=8)
    ax.axhline(1.0, color="0.3", lw=1, ls="--")
    ax.set(
        ylabel="SD tokens/s ÷ AR tokens/s", title="Speedup per task (T=0, same prompts; below 1: plain decoding wins)"
    )
    ax.legend(fontsize=7, ncol=3)
    return _save(fig, folder / "speedup_per_task.png", footer)


def tokens_per_s(rows: list[dict], ar: float | None, folder: Path, footer: str) -> Path:
    """Bars: measured SD tokens/s per drafter and γ at T=0, with the AR line of the same engine."""
    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"{r['drafter']}\nγ={r['gamma']}" for r in rows]
    ax.bar(range(len(rows)), [r["tokens_per_s"] for r in rows], color=["C1" if r.get("chosen") else "C0" for r in rows])
    if ar:
        ax.axhline(ar, color="C3", ls="--", lw=1.2, label=f"AR (draftwise engine) {ar:.1f}")
        ax.legend(fontsize=7)
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set(ylabel="tokens/s (T=0)", title="SD throughput per drafter and γ (orange: chosen)")
    return _save(fig, folder / "tokens_per_s.png", footer)


def predicted_vs_measured(rows: list[dict], folder: Path, footer: str) -> Path:
    fig, ax = plt.subplots(figsize=(5, 5))
    xs, ys = [r["predicted"] for r in rows], [r["measured"] for r in rows]
    ax.scatter(xs, ys)
    for r in rows:
        ax.annotate(f"{r['drafter']} γ={r['gamma']}", (r["predicted"], r["measured"]), fontsize=6)
    top = 1.1 * max(xs + ys + [1.0])
    ax.plot([0, top], [0, top], color="0.6", lw=1)
    ax.set(
        xlim=(0, top),
        ylim=(0, top),
        xlabel="predicted decode tokens/s (cost model)",
        ylabel="measured decode tokens/s",
        title="Cost model vs measurement",
    )
    return _save(fig, folder / "predicted_vs_measured.png", footer)


def kv_footprint(kv_mb: dict[str, float], context: int, folder: Path, footer: str) -> Path:
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.barh(list(kv_mb), list(kv_mb.values()))
    ax.set(xlabel=f"KV cache MB per sequence ({context} positions, fp32)", title="KV footprint")
    return _save(fig, folder / "kv_footprint.png", footer)


def accuracy_vs_tar(points: list[dict], folder: Path, footer: str) -> tuple[Path, dict[str, float | None]]:
    """Scatter of each drafter's task accuracy against its measured TAR; returns the Pearson r per task."""
    fig, ax = plt.subplots(figsize=(6, 4.5))
    corr = {}
    for task, marker in (("mmlu", "o"), ("hellaswag", "s")):
        pts = [(p[task], p["tar"]) for p in points if p.get(task) is not None and p.get("tar") is not None]
        if not pts:
            continue
        xs, ys = zip(*pts)
        corr[task] = float(np.corrcoef(xs, ys)[0, 1]) if len(pts) > 2 and np.std(xs) > 0 and np.std(ys) > 0 else None
        r = f"r={corr[task]:.2f}" if corr[task] is not None else "r undefined"
        ax.scatter(xs, ys, marker=marker, label=f"{task} ({r})")
    for p in points:
        for task in ("mmlu", "hellaswag"):
            if p.get(task) is not None and p.get("tar") is not None:
                ax.annotate(p["drafter"], (p[task], p["tar"]), fontsize=6)
    ax.set(
        xlabel="task accuracy (log-likelihood)", ylabel="greedy TAR at γ=4 (from agree)", title="Task accuracy vs TAR"
    )
    if corr:
        ax.legend(fontsize=7)
    return _save(fig, folder / "accuracy_vs_tar.png", footer), corr
