"""The design report's sections on where the time goes (profile and sweep: step, head and verify costs, KV) and the
accuracy sanity check (task accuracy against TAR)."""

from __future__ import annotations

from pathlib import Path

from ...report.doc import Doc
from ...report.fmt import num as _f
from ...report.plots import plot_profile, plot_sweep
from ..pipeline import DesignFolder
from . import charts
from .models import KV_CONTEXT, LEFT_OUT, read_json


def time_section(doc: Doc, p: DesignFolder, prof: dict, kv: dict[str, float], plots: Path, footer: str) -> None:
    """The profile's step and verify costs, the sweep's findings and plots, and KV per sequence."""
    b1 = prof["batches"]["1"]
    doc.h("Where the time goes (profile and sweep)")
    fit = b1.get("depth_fit") or {}
    doc.p(
        f"Step time ≈ {_f(fit.get('fixed_ms'))} + {_f(fit.get('per_layer_ms'))} ms per full-width layer; LM head alone "
        f"{_f(b1.get('head_ms'))} ms. Verify pass over γ+1 tokens relative to one AR step: "
        + ", ".join(f"γ={g}: {v:.2f}" for g, v in b1["verify_over_ar_step"].items())
        + "."
    )
    for path in plot_profile(prof, plots):
        doc.img(
            path, {"verify_vs_gamma.png": "Verify pass vs γ", "step_vs_layers.png": "Step time vs layers"}[path.name]
        )
    sweep_path = p.folder("sweep") / "sweep.json"
    if sweep_path.exists():
        sw = read_json(sweep_path)
        for line in sw.get("findings", []):
            doc.p(line)
        for path in plot_sweep(sw, plots):
            doc.img(path, path.stem.replace("_", " "))
    doc.img(charts.kv_footprint(kv, KV_CONTEXT, plots, footer), f"KV cache per sequence at {KV_CONTEXT} positions")


def accuracy_section(doc: Doc, p: DesignFolder, acc_points: list[dict], plots: Path, footer: str) -> None:
    """Task accuracy against greedy TAR; a sentence alone when the budget left the check out."""
    doc.h("Accuracy sanity check: task accuracy vs TAR")
    if "accuracy" not in p.done:
        doc.p(LEFT_OUT)
        return
    path, corr = charts.accuracy_vs_tar(acc_points, plots, footer)
    doc.p(
        "Pearson correlation of drafter accuracy with greedy TAR(γ=4): "
        + ", ".join(f"{t}: {_f(r)}" for t, r in corr.items())
        + f" (over {len(acc_points)} drafters). "
        "Accuracy is a sanity check only; drafters are chosen by measured agreement and throughput."
    )
    doc.img(path, "Task accuracy vs TAR")
