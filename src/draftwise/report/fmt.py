"""How the reports write numbers: a missing figure is '-', a speedup comes with its 95 % interval."""

from __future__ import annotations


def num(v, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def interval(s) -> str:
    """[point, low, high] -> '1.23× [1.10–1.35]'."""
    return "-" if not s else f"{s[0]:.2f}× [{s[1]:.2f}–{s[2]:.2f}]"
