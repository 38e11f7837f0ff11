"""The precision a design studies its target at (`--dtype auto`, the default).

fp32 where the budget's plan at fp32 keeps every row the config asks for (lean-int8, lean-q4, llama.cpp) and the
fp32 weights take at most half the available memory; else the target file's fastest lean precision — q4 on a GGUF
file with 4-bit blocks, else int8 — whose study takes its candidates as they are (layers of the target, the family's
small model, lookups: nothing is pruned or distilled at a precision that cannot train). A 1.7B target on a 2-core CPU
is the case: its fp32 copy is 6.8 GB and a step ~250 ms, and a 60-minute plan at fp32 leaves out every faster row.

Priced before anything loads: the fp32 step predicted as the fp32 weights' bytes read once a step at the machine's
measured bandwidth (`machine.bandwidth`), the plan at that step (`plan.Planner.preview`). The decision is a file of
the run folder (study.json), so a resumed run keeps it; the report states it with its reason.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from .. import machine
from ..config import DesignConfig
from ..config.design import AUTO
from ..rundir import write_atomic
from ..shapes import Shape
from . import cuts, lean_rows
from .plan import Planner
from .target import has_q4_blocks, target_of

FILE = "study.json"
ROWS = ("lean-int8", "lean-q4", "llama.cpp")  # the rows an fp32 study must keep to be chosen
MEMORY_SHARE = 0.5  # fp32 weights above this share of the available memory: no fp32 study


def resolve_config(config: DesignConfig, out: str | Path) -> DesignConfig:
    """`config` with its study precision decided (`--dtype auto`), from the run folder's study.json when it has one."""
    if config.dtype != AUTO:
        return config
    path = Path(out) / FILE
    if path.exists():
        decision = json.loads(path.read_text())
    else:
        decision = decide(config)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(decision, indent=2) + "\n")
    print(f"[design] studied at {decision['dtype']}: {decision['reason']}", flush=True)
    return replace(config, dtype=decision["dtype"])


def decide(config: DesignConfig) -> dict:
    """The study's precision and why (module docstring)."""
    shape = Shape.of(target_of(config).model_config())
    fp32_bytes = 4 * shape.params()["total"]
    bandwidth = machine.bandwidth(config.threads)["read_gb_per_s"]
    step_s = fp32_bytes / (bandwidth * 1e9)
    fp32 = replace(config, dtype="fp32")
    sizes = Planner.preview(fp32, step_s)
    asked = set(lean_rows.planned(fp32)) | ({"llama.cpp"} & set(config.rows))
    left_out = [] if not config.plan else sorted(asked) if sizes is None else sorted(asked & set(sizes.dropped))
    available = machine.memory().get("available_gib")
    too_big = available is not None and fp32_bytes > MEMORY_SHARE * available * 2**30
    quantized = "q4" if has_q4_blocks(config) else "int8"
    dtype = "fp32" if config.device != "cpu" or not (left_out or too_big) else quantized
    facts = f"fp32 weights {fp32_bytes / 1e9:.1f} GB, a step predicted at {1e3 * step_s:.0f} ms ({bandwidth:g} GB/s)"
    if dtype == "fp32":
        reason = f"{facts}: the plan at fp32 keeps every row"
    elif too_big:
        reason = f"{facts}: more than {MEMORY_SHARE:.0%} of the {available:g} GiB available"
    else:
        reason = f"{facts}: a {config.minutes:g}-minute plan at fp32 leaves out {', '.join(left_out)}"
    sibling = cuts.source(replace(config, dtype=dtype))
    if sibling:
        reason += (
            f"; the target's candidates are taken as they are at {dtype}, shapes cut from {sibling} trained where the"
            " time budget keeps training"
        )
    elif dtype != "fp32":
        reason += f"; candidates are taken as they are at {dtype} (nothing pruned or distilled)"
    return {
        "dtype": dtype,
        "reason": reason,
        "fp32_bytes": fp32_bytes,
        "fp32_step_ms_predicted": round(1e3 * step_s, 1),
        "bandwidth_gb_per_s": bandwidth,
        "fp32_plan_left_out": left_out,
        "available_gib": available,
    }
