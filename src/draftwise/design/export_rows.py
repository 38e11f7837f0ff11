"""Export per row: for each row, `export/engines/<engine>/README.md` with what its verdict says to run, written by its
row kind's export (`EXPORTS`). A llama.cpp row: the llama-server command line (the nearest built-in of the chosen
method with its settings, or plain decoding), the llama-cpp-python call (draftwise's lookup drafter as a
`LlamaDraftModel`), the model drafter as GGUF where one is chosen — each with the figure measured for that exact command
on this machine, or "not measured here". A lean row (lean-int8): the draftwise command at that precision, with its
figure.

Paths are relative to the folder the README is in; the target file is named, not located (it is the user's)."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from .. import machine
from ..config.serve import SERVE_FILE
from ..gguf.export import written
from ..sd.families import family_of
from . import deploy, fastest, row_verdict, rows
from .export import copy_schedule, local_lookup

SERVER = """llama-server (measured here: {measured}):
```
llama-server -m {target} -t {threads} --host 127.0.0.1 --port 8080 {args}
```
"""

PYTHON_LOOKUP = """llama-cpp-python with draftwise's {method} drafter (pip install draftwise; \
measured here: {measured}):
```python
from llama_cpp import Llama
from draftwise.sd.llama_draft import LookupDraftModel
llm = Llama(model_path="{target}", n_threads={threads},
            draft_model=LookupDraftModel.from_spec("{spec}", num_pred_tokens={gamma}))
out = llm.create_completion("Hello", max_tokens=128, temperature=0)
```
"""

PYTHON_PLAIN = """llama-cpp-python, plain decoding (measured here: {measured}):
```python
from llama_cpp import Llama
llm = Llama(model_path="{target}", n_threads={threads})
out = llm.create_completion("Hello", max_tokens=128, temperature=0)
```
"""


LEAN = """Re-measure it with draftwise bench at {precision} (run from this folder; measured here: {measured}):
```
{command}
```
"""


def export_rows(
    top: Path,
    verdicts_done: list[dict],
    config,
    final: dict | None = None,
    verdicts: dict[str, dict] | None = None,
    quality: dict[str, str] | None = None,
    dead: dict[str, dict] | None = None,
) -> None:
    """Every engine row's folder, a pointer to each in the export's README, and the README's opening: the design's
    answer (`final`, see `fastest`; `verdicts`: every row's verdict by runtime name; `quality`: each lossy runtime's
    cost against fp32), how to run it and the machine it was measured on; `dead`: the rows whose engine died."""
    spec = "default" if config.target == "default" else "<target>"
    lines = ["\n## Per engine\n", "Each engine's own verdict (what to run if you deploy on that engine):\n"]
    for v in verdicts_done:
        folder = EXPORTS[rows.kind_of(v)].folder(top, v, config, spec, final)
        lines.append(f"- `{folder.relative_to(top)}/`: {row_verdict.sentence(v)}{_versus(final, v)}")
    lines += [f"- {row}: not measured. {d['reason']}" for row, d in sorted((dead or {}).items())]
    readme = top / "README.md"
    how = _how(top, final, verdicts, spec, config)
    where = top.parent / "machine.json"  # the design folder's
    on = machine.line(json.loads(where.read_text())) if where.is_file() else None
    head = fastest.readme_header(final, verdicts or {}, spec, config.threads, quality, how, on) if final else ""
    readme.write_text(head + readme.read_text() + ("\n".join(lines) + "\n" if len(lines) > 2 else ""))


def _how(top: Path, final: dict | None, verdicts: dict[str, dict] | None, target_spec: str, config) -> str | None:
    """How to run the design's answer. On the draftwise engine: `draftwise serve` (`deploy`) — the export folder of
    its runtime (serve.json: the method as measured), or plain decoding at its precision — with the figure `served`
    measures, and the bench command that re-measures it. Elsewhere `fastest.deploy_command`, saying that the serve
    command does not apply."""
    if not final:
        return None
    row, threads = final["runtime"], config.threads
    device = getattr(config, "device", "cpu") if row == fastest.lean_name(config) else "cpu"  # rows: the CPU
    if not row.startswith("lean-"):
        return (
            fastest.deploy_command(final, (verdicts or {}).get(row), target_spec, threads)
            + " (`draftwise serve` does not apply: the answer does not run on the draftwise engine)"
        )
    dtype = row.removeprefix("lean-")
    if not final["recommend"]:
        bench = f"draftwise bench --target {target_spec} --dtype {dtype} --baseline ar"
        return deploy.block(deploy.plain(target_spec, dtype, threads, device), None, target_spec, bench, pending=True)
    where = "." if row == fastest.lean_name(config) else f"engines/{row}"
    saved = json.loads((top / where / SERVE_FILE).read_text())
    v = (verdicts or {}).get(row)
    bench = lean_command(v, target_spec, where + "/") if v and where != "." else None  # the top folder's says below
    args, same = deploy.command(where, target_spec, threads, device), deploy.explicit(saved, where, threads, device)
    return deploy.block(args, same, target_spec, bench, pending=True)


def _versus(final: dict | None, v: dict) -> str:
    return fastest.versus(final, v["engine"], v.get("method", "sd") if v["recommend"] else "ar")


def _measured(b: dict | None, what: str = "draftwise AR on this engine") -> str:
    if not b:
        return "not measured here"
    pt, lo, hi = b["speedup"]
    return f"{b['tokens_per_s']:.1f} tokens/s, {pt:.2f}× {what} [95 % {lo:.2f}–{hi:.2f}]"


def _local_args(args: str, out: Path) -> str:
    """The built-in's arguments with its drafter GGUF copied next to the README (`-md drafter.gguf`)."""
    parts = shlex.split(args)
    if "-md" in parts:
        i = parts.index("-md") + 1
        shutil.copy2(parts[i], out / "drafter.gguf")
        parts[i] = "drafter.gguf"
    return shlex.join(parts)


def _verdict_json(out: Path, v: dict) -> None:
    (out / "verdict.json").write_text(
        json.dumps(
            {
                k: v[k]
                for k in (
                    "engine",
                    "quant",
                    "shipped",
                    "recommend",
                    "drafter",
                    "method",
                    "gamma",
                    "speedup",
                    "best_builtin",
                )
                if k in v
            },
            indent=1,
        )
        + "\n"
    )


def lean_command(v: dict, target_spec: str, folder: str = "") -> str:
    """The draftwise bench command that measures a lean row's verdict; `folder`: where its files lie (`deploy`'s
    layout: a lookup's corpus, a model drafter's checkpoint in `drafter/`, a hybrid's lookup part in `lookup/`),
    relative to the command's folder."""
    if not v["recommend"]:
        return f"draftwise bench --target {target_spec} --dtype {v['dtype']} --baseline ar"
    local = deploy.local_drafter(v["spec"], None).replace(deploy.PLACEHOLDER + "/", folder)
    return f"draftwise bench --target {target_spec} --dtype {v['dtype']} --drafter '{local}' --gamma {v['gamma']}"


def export_lean_row(top: Path, v: dict, config, target_spec: str, final: dict | None = None) -> Path:
    """A lean row's folder: serve.json and the `draftwise serve` command that deploys its verdict (the drafter's files
    copied beside them, `deploy`), and the bench command that re-measures it at the row's precision."""
    out = top / "engines" / v["engine"]
    out.mkdir(parents=True, exist_ok=True)
    saved = deploy.write(out, _serve_options(top, out, v, target_spec, final))
    measured = (
        _measured({"speedup": v["speedup"], "tokens_per_s": v["tokens_per_s"]}, "its plain decoding")
        if v["recommend"]
        else f"{v['ar_tokens_per_s']:.1f} tokens/s"
    )
    answer = bool(final) and final["recommend"] and final["runtime"] == v["engine"]  # `served` measures this folder's
    args, same = deploy.command(".", target_spec, config.threads), deploy.explicit(saved, ".", config.threads)
    parts = [
        *_head(v, final),
        "Deploy (from this folder): " + deploy.block(args, same, target_spec, pending=answer),
        LEAN.format(precision=v["dtype"], measured=measured, command=lean_command(v, target_spec)),
    ]
    if v["kind"] != "lookup" and v["recommend"] and not v["spec"].startswith("layers:"):
        parts.append(
            f"`drafter/` is the design's `{v['drafter']}` checkpoint; draftwise quantizes it to the same precision "
            "when it loads it.\n"
        )
    (out / "README.md").write_text("\n".join(parts))
    _verdict_json(out, v)
    return out


def _serve_options(top: Path, out: Path, v: dict, target_spec: str, final: dict | None = None) -> dict:
    """A lean row's serve.json: its verdict's drafter and γ (files copied into `out`), and the round scheduler's inputs
    — this engine's verify curve and the design's calibration, from the design folder's stages/ beside export/ —
    when its method is scheduled; plain decoding when its verdict is."""
    scheduled = v["recommend"] and v.get("method", "sd") != "sd"
    if scheduled:
        stages = top.parent / "stages"
        copy_schedule(stages / f"profile@{v['engine']}", stages / "calibrate-lookup", out / "schedule")
    spec = deploy.local_drafter(v["spec"], out) if v["recommend"] else None
    by = fastest.gammas_by_temperature(final, v["engine"], v["gamma"])
    return deploy.options(target_spec, v["dtype"], spec, v["gamma"], scheduled, "lean", by)


def export_row(top: Path, v: dict, config, target_spec: str, final: dict | None = None) -> Path:
    """A llama.cpp row's folder (`v`: its verdict; `v["python"]`: the llama-cpp-python snippet's measured figure, when
    a lookup drafter was chosen)."""
    out = top / "engines" / v["engine"]
    out.mkdir(parents=True, exist_ok=True)
    threads, target_name = config.threads or 2, rows.target_name(v)
    parts = _head(v, final)
    if not v["shipped"]:
        parts.append(
            f"`{target_name}` is the target written at this precision: `draftwise export-gguf {target_spec} "
            f"--quant {v['quant'].lower()} --out {target_name}`.\n"
        )
    parts += (
        _server_deploy(v, out, target_name, threads) if v["recommend"] else _server_plain(v, out, target_name, threads)
    )
    local = local_lookup(v["spec"], out) if v["kind"] == "lookup" and v["recommend"] else v["spec"]
    if v.get("method", "sd") != "sd" and v["recommend"]:
        parts.append(_scheduler_note(target_name, local, v["gamma"]))
    parts.append(_python(v, local, target_name, threads))
    if v["kind"] == "model" and v["recommend"] and not (out / "drafter.gguf").exists():
        shutil.copy2(written(v["spec"], v["target_path"], v["drafter_quant"]), out / "drafter.gguf")
    parts.append("vLLM: not measured here (no GPU on this machine).\n")
    (out / "README.md").write_text("\n".join(parts))
    _verdict_json(out, v)
    return out


def _head(v: dict, final: dict | None) -> list[str]:
    """A row README's title (what to deploy) and its verdict sentence, against the design's answer."""
    return [
        f"# {v['engine']}: {'deploy ' + v['drafter'] if v['recommend'] else 'plain decoding'}\n",
        f"**Verdict:** {row_verdict.sentence(v)}{_versus(final, v)}\n",
    ]


def _server_deploy(v: dict, out: Path, target_name: str, threads: int) -> list[str]:
    """The llama-server part when draftwise's method is deployed: its nearest built-in, measured against it."""
    key = v["candidates"][v["drafter"]]["nearest"]
    near = v["builtins"].get(key)
    against = (
        f": {near['tokens_per_s']:.1f} tokens/s against draftwise's own {v['tokens_per_s']:.1f} on this engine.\n"
        if near
        else ".\n"
    )
    return [
        f"llama-server has no draftwise drafter; the nearest built-in to `{v['drafter']}` is below" + against,
        SERVER.format(
            measured=_measured(near),
            target=target_name,
            threads=threads,
            args=_local_args(key.removeprefix("llama-server:"), out),
        ),
    ]


def _server_plain(v: dict, out: Path, target_name: str, threads: int) -> list[str]:
    """The llama-server part when plain decoding is the verdict: the best built-in if it beat plain decoding, else
    plain llama-server."""
    best = v["best_builtin"]
    b = v["builtins"].get(best) if best else None
    # beyond noise over its own plain decoding, and by speculating: a built-in that drafted nothing on these prompts
    # ran plain decoding, whatever its figure says (server processes differ by a few % among themselves)
    beats = b is not None and bool(b.get("drafted")) and (b.get("over_server_plain") or [0, 0, 0])[1] > 1.0
    args = best.removeprefix("llama-server:") if beats else ""
    parts = [
        SERVER.format(
            measured=_measured(v["builtins"].get(best if beats else "llama-server")),
            target=target_name,
            threads=threads,
            args=_local_args(args, out),
        )
    ]
    if beats:
        parts.append(f"(llama-server's `{args}` beat plain decoding beyond noise here; no draftwise method did.)\n")
    return parts


def _scheduler_note(target_name: str, local: str, gamma: int) -> str:
    """Where the round scheduler runs (draftwise's own loop only), with the command that runs it."""
    return (
        "The round scheduler runs in draftwise's own loop only (llama-server and llama-cpp-python "
        "propose without it): `draftwise bench --backend llama.cpp --target "
        + target_name
        + f" --drafter '{local}' --gamma {gamma} --schedule <a profile of this engine> "
        "--calibration <the design export's schedule/>`.\n"
    )


def _python(v: dict, local: str, target_name: str, threads: int) -> str:
    """The llama-cpp-python snippet: with draftwise's lookup drafter when one is deployed, else plain generate."""
    if v["kind"] == "lookup" and v["recommend"]:
        return PYTHON_LOOKUP.format(
            method=family_of(local).name,
            measured=_measured(v.get("python", {}).get("llama-cpp-lookup"), "llama-cpp-python's plain generate"),
            target=target_name,
            threads=threads,
            spec=local,
            gamma=v["gamma"],
        )
    return PYTHON_PLAIN.format(
        measured=f"{v['llama_cpp_generate_tokens_per_s']:.1f} tokens/s"
        if v.get("llama_cpp_generate_tokens_per_s")
        else "not measured here",
        target=target_name,
        threads=threads,
    )


class Export(NamedTuple):
    """A row kind's export: its folder (`folder(top, v, config, target spec, final)`), and the command its verdict
    runs from the export's top folder when that is draftwise's own (None: the folder's README says how to run it)."""

    folder: Callable[..., Path]
    command: Callable[[dict, str, str], str] | None = None


EXPORTS: dict[type[rows.Row], Export] = {
    rows.LeanRow: Export(export_lean_row, lean_command),
    rows.LlamaCppRow: Export(export_row),
}
