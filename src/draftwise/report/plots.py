"""PNG plots, drawn from a stage's derived summary (never from anything the summary does not hold).

Each plot's footer names the command that reproduces it, so a figure pasted elsewhere still says where it came from.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, path: Path, footer: str) -> Path:
    fig.text(0.01, 0.005, footer, fontsize=6, color="0.4", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_profile(summary: dict, folder: Path) -> list[Path]:
    footer = f"draftwise profile --target {summary['target']['spec']} (context {summary['context']}); {folder}"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for b, e in summary["batches"].items():
        verify = {int(g): ms for g, ms in e["verify_ms"].items()}  # int keys in memory, str keys read from JSON
        ratio = {int(g): r for g, r in e["verify_over_ar_step"].items()}
        gammas = sorted(verify)
        ax1.plot(gammas, [verify[g] for g in gammas], "o-", label=f"verify, batch {b}")
        ax1.axhline(e["ar_step_ms"], ls=":", color=ax1.lines[-1].get_color(), lw=1)
        ax2.plot(gammas, [ratio[g] for g in gammas], "o-", label=f"batch {b}")
    ax1.set(xlabel="γ (verify pass over γ+1 tokens)", ylabel="ms", title="Target verify pass (dotted: one AR step)")
    ax2.axhline(1.0, color="0.6", lw=1)
    ax2.set(xlabel="γ", ylabel="verify / AR step", title="Verify cost relative to one AR step")
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    paths = [_save(fig, folder / "verify_vs_gamma.png", footer)]

    fig, ax = plt.subplots(figsize=(6, 4))
    for b, e in summary["batches"].items():
        pts = sorted((d["layers"], d["step_ms"]) for d in e["drafters"].values() if d["layers"])
        pts.append((summary["target"]["shape"]["layers"], e["ar_step_ms"]))
        line = ax.plot(*zip(*sorted(pts)), "o", label=f"measured, batch {b}")[0]
        fit = e.get("depth_fit")
        if fit:
            xs = [0, max(p[0] for p in pts)]
            ax.plot(
                xs,
                [fit["fixed_ms"] + fit["per_layer_ms"] * x for x in xs],
                "-",
                color=line.get_color(),
                lw=1,
                label=f"fit {fit['fixed_ms']:.1f} + {fit['per_layer_ms']:.2f}·L ms",
            )
        if e.get("head_ms"):
            ax.axhline(
                e["head_ms"], ls="--", color=line.get_color(), lw=1, label=f"LM head alone ({e['head_ms']:.1f} ms)"
            )
    ax.set(xlabel="layers (full width)", ylabel="ms per step", title="Step time vs depth")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    paths.append(_save(fig, folder / "step_vs_layers.png", footer))
    return paths


def _series(rows: list[dict], family: str, x: str):
    """{(batch, vocab): sorted [(x, row)]} for one family."""
    out: dict[tuple, list] = {}
    for r in rows:
        if r["family"] == family:
            out.setdefault((r["batch"], r["shape"]["vocab"]), []).append((r["shape"][x], r))
    return {k: sorted(v, key=lambda p: p[0]) for k, v in sorted(out.items())}


def plot_sweep(summary: dict, folder: Path) -> list[Path]:
    rows = summary["rows"]
    footer = (
        f"draftwise sweep (budget {summary['budget'] / 1e6:.0f}M non-embedding, context {summary['context']}); {folder}"
    )
    paths = []

    def latency_plot(family_styles, x: str, xlabel: str, title: str, name: str) -> Path:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for family, style, label in family_styles:
            for (b, v), pts in _series(rows, family, x).items():
                shape = pts[0][1]["shape"]
                ax.plot(
                    [p[0] for p in pts],
                    [p[1]["step_ms"] for p in pts],
                    style,
                    label=label.format(layers=shape["layers"], hidden=shape["hidden"]) + f", V={v}, batch {b}",
                )
        ax.set(xlabel=xlabel, ylabel="ms per draft step", title=title)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=6)
        return _save(fig, folder / name, footer)

    paths.append(
        latency_plot(
            [("equal_budget", "o-", "equal budget"), ("truncation", "s--", "target truncated (d={hidden})")],
            "layers",
            "layers",
            "Step time vs depth at equal non-embedding parameters",
            "latency_vs_layers.png",
        )
    )
    paths.append(
        latency_plot(
            [("width", "o-", "{layers} layers")],
            "hidden",
            "hidden size",
            "Step time vs width at fixed depth",
            "latency_vs_width.png",
        )
    )

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for family, marker in (("equal_budget", "o-"), ("truncation", "s--")):
        series = _series(rows, family, "layers")
        if series:
            pts = next(iter(series.values()))
            ax.plot(
                [p[0] for p in pts],
                [p[1]["kv_bytes_per_seq"] / 1e6 for p in pts],
                marker,
                label=family.replace("_", " "),
            )
    ax.set(
        xlabel="layers",
        ylabel=f"KV cache MB per sequence ({summary['context']} positions, {summary.get('dtype', 'fp32')})",
        title="KV footprint vs depth",
    )
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7)
    paths.append(_save(fig, folder / "kv_vs_layers.png", footer))
    return paths


def plot_learning_curve(records: list[dict], folder: Path) -> Path:
    """Training loss and held-out agreement against trained tokens (a resumed run's repeated steps: the last wins)."""
    latest = {(r.get("event"), r.get("step")): r for r in records}
    train = sorted((r for r in latest.values() if r.get("event") == "train"), key=lambda r: r["step"])
    evals = sorted((r for r in latest.values() if r.get("event") == "eval"), key=lambda r: r["step"])
    fig, ax1 = plt.subplots(figsize=(7, 4))
    if train:
        ax1.plot([r["tokens"] for r in train], [r["loss"] for r in train], color="0.6", lw=0.8, label="train loss")
    ax1.set(xlabel="trained tokens", ylabel="loss")
    ax2 = ax1.twinx()
    ax2.plot(
        [r["tokens"] for r in evals],
        [r["agreement"] for r in evals],
        "o-",
        color="C0",
        label="held-out top-1 agreement",
    )
    ax2.set_ylabel("agreement")
    ax2.set_ylim(0, 1)
    fig.legend(loc="upper center", fontsize=7, ncol=2)
    return _save(fig, folder / "learning_curve.png", f"draftwise distill; {folder}")


def plot_learning_fits(series: list[dict], path: Path, footer: str) -> Path:
    """Held-out agreement against teacher tokens per trained drafter (`series`: name, points [(tokens, agreement)],
    fit [(tokens, agreement)] or None, alpha_needed, alpha_to_beat), its fitted curve extended to the tokens the
    predictions need, and its break-even α (dotted) and the α that would beat the best lookup (dash-dot) as lines."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, s in enumerate(series):
        color = f"C{i}"
        ax.plot(*zip(*s["points"]), "o", color=color, label=f"{s['name']}, measured")
        if s.get("fit"):
            ax.plot(*zip(*s["fit"]), "-", color=color, lw=1, label=f"{s['name']}, fitted curve")
        for key, style, what in (("alpha_needed", ":", "break-even α"), ("alpha_to_beat", "-.", "α to beat lookup")):
            if s.get(key) is not None:
                ax.axhline(s[key], ls=style, color=color, lw=1, label=f"{s['name']}, {what} {s[key]:.2f}")
    first = min((t for s in series for t, _ in s["points"] if t > 0), default=1.0)
    ax.set_xscale("symlog", linthresh=first)  # step 0 (no tokens) stays on the axis
    ax.set(
        xlabel="teacher tokens trained",
        ylabel="held-out top-1 agreement (≈ greedy α)",
        title="When would training pay?",
    )
    ax.set_xlim(left=0)
    ax.set_ylim(0, 1)
    ax.legend(fontsize=6)
    return _save(fig, path, footer)
