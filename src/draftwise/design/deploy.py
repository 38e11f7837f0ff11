"""The deploy command of a verdict on the draftwise engine: `draftwise serve`, reading the export folder's serve.json.

Each lean engine's export folder — `export/` for the engine at the design's precision, `export/engines/<row>/` for a
lean row (lean-int8) — holds `serve.json`: the decoding options of its verdict, as `draftwise serve --export DIR`
reads them (`config.serve.from_export`):

  target        as the export names it: `default`, or the placeholder `<target>` (a path of this machine is never
                written; give `--target` on the command line, which wins over the file)
  dtype         the engine's precision (backend `lean` on a lean row; the design's own engine as it was measured)
  drafter, γ    the verdict's drafter (none for plain decoding), its data copied into the folder — a lookup's corpus, a
                model drafter's checkpoint — and named through the placeholder "{export}", which `--export` replaces
                with the folder's absolute path ("paths" lists the keys that hold one)
  schedule, calibration   the round scheduler's inputs (`schedule/`) when the verdict's method is scheduled

The README gives the command (`draftwise serve --export DIR --threads N`), its explicit equivalent, and how to call it;
`served` measures that very command through HTTP after the export.
"""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

from ..config.serve import PLACEHOLDER, SERVE_FILE, ServeConfig
from ..sd.families import drafter_kind, family_of, feature, hybrid
from ..targets.source import resolve

PORT = ServeConfig.default_port()  # the port the README's calls name
PENDING = "Through `draftwise serve` (HTTP, streamed, client wall time): not measured yet."  # `served` replaces it
ORDER = (
    "target",
    "backend",
    "dtype",
    "drafter",
    "gamma",
    "gamma_by_temperature",
    "schedule",
    "calibration",
)  # flags of the explicit command


def local_drafter(spec: str, out: Path | None) -> str:
    """`spec` as serve.json names it: a lookup's data copied into `out` (a hybrid's under `out/lookup`), a model
    drafter's or a feature head's checkpoint into `out/drafter` (a `layers:` subset of the target stays a spec), each
    named through the placeholder; `out` None: the name only, nothing copied."""
    kind = drafter_kind(spec)
    if kind == "lookup":
        if out is not None:
            family_of(spec).copy_data(spec, out)
        return family_of(spec).relocate(spec, PLACEHOLDER + "/")
    if kind == "hybrid":
        model, lookup, model_gamma = hybrid.split(spec)
        inner = local_drafter(lookup, out / "lookup" if out else None).replace(PLACEHOLDER, PLACEHOLDER + "/lookup")
        return hybrid.compose(local_drafter(model, out), inner, model_gamma)
    if spec.startswith("layers:"):
        return spec
    if kind == "feature":  # its head's checkpoint (the target's embedding and head rows are read from the target)
        if out is not None and not (out / "drafter" / "config.json").exists():
            shutil.copytree(feature.checkpoint_folder(spec), out / "drafter", dirs_exist_ok=True)
        return f"{feature.NAME}:{PLACEHOLDER}/drafter"
    if out is not None and not (out / "drafter" / "config.json").exists():
        shutil.copytree(resolve(spec), out / "drafter", dirs_exist_ok=True)
    return PLACEHOLDER + "/drafter"


def options(
    target: str,
    dtype: str,
    drafter: str | None,
    gamma: int,
    scheduled: bool,
    backend: str | None,
    by_temperature: str | None = None,
) -> dict:
    """serve.json's content (module docstring); `drafter` already as `local_drafter` names it (None: plain);
    `by_temperature`: γ by request temperature where the traffic's temperatures want different answers
    (`fastest.gammas_by_temperature`)."""
    saved: dict = {"target": target, "dtype": dtype}
    if backend:
        saved["backend"] = backend
    if drafter:
        saved.update(drafter=drafter, gamma=gamma)
        if by_temperature:
            saved["gamma_by_temperature"] = by_temperature
        if scheduled:
            saved.update(schedule=PLACEHOLDER + "/schedule", calibration=PLACEHOLDER + "/schedule")
    saved["paths"] = [k for k, v in saved.items() if isinstance(v, str) and PLACEHOLDER in v]
    return saved


def write(out: Path, saved: dict) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    (out / SERVE_FILE).write_text(json.dumps(saved, indent=1) + "\n")
    return saved


def _where_it_runs(threads: int | None, device: str) -> list[str]:
    """What serve.json does not hold: the threads the design ran with, a device other than the CPU."""
    return (["--device", device] if device != "cpu" else []) + (["--threads", str(threads)] if threads else [])


def command(where: str, target: str, threads: int | None, device: str = "cpu") -> list[str]:
    """`draftwise serve --export WHERE` (the folder relative to the README): `--target` where serve.json holds the
    placeholder, `--device` and `--threads` as the design ran."""
    args = ["draftwise", "serve", "--export", where]
    if target != "default":
        args += ["--target", target]
    return args + _where_it_runs(threads, device)


def explicit(saved: dict, where: str | None, threads: int | None, device: str = "cpu") -> list[str]:
    """The same decoding with every option on the command line (the placeholder as the folder, relative)."""
    prefix = "" if where in (None, ".") else where.rstrip("/") + "/"
    args = ["draftwise", "serve"]
    for key in ORDER:
        if saved.get(key) is not None:
            args += ["--" + key.replace("_", "-"), str(saved[key]).replace(PLACEHOLDER + "/", prefix)]
    return args + _where_it_runs(threads, device)


def plain(target: str, dtype: str, threads: int | None, device: str = "cpu") -> list[str]:
    """The command that serves plain decoding on the lean engine at `dtype` (no export folder needed)."""
    return explicit({"target": target, "dtype": dtype}, None, threads, device)


def join(args: list[str]) -> str:
    """A command line as the README prints it (the target placeholder as the user replaces it, unquoted)."""
    return shlex.join(args).replace("'<target>'", "<target>")


def block(args: list[str], same: list[str] | None, model: str, bench: str | None = None, pending: bool = False) -> str:
    """A README's deploy part: the serve command (`same`: its explicit equivalent), how to call it, the figure
    `served` measures (`pending`: its line, until then), and the bench command that re-measures the method."""
    call = f"curl -s http://127.0.0.1:{PORT}/v1/completions -H 'Content-Type: application/json' -d " + shlex.quote(
        json.dumps({"model": model, "prompt": "Hello", "max_tokens": 128, "temperature": 0})
    )
    lines = [
        f"`{join(args)}`: an OpenAI-compatible server on http://127.0.0.1:{PORT} decoding as the verdict was "
        "measured" + (f" (the same as `{join(same)}`)." if same else "."),
        "",
        "Call it (`/v1/completions` and `/v1/chat/completions`, streamed or not; `model` is the `--target` as given; "
        f'with the openai client, `OpenAI(base_url="http://127.0.0.1:{PORT}/v1", api_key="unused")`; docs/serve.md '
        "has more):",
        f"```\n{call}\n```",
    ]
    if pending:
        lines += ["", PENDING]
    if bench:
        lines += ["", f"Re-measure it against plain decoding on this engine: `{bench}`."]
    return "\n".join(lines) + "\n"
