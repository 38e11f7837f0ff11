"""The design's deploy command measured where applications meet it: through `draftwise serve`'s HTTP API.

After the verdict and the export, when the design's answer runs on the draftwise engine (a lean runtime: its method,
or its plain decoding), `bench-serve` runs the very command the export README gives — `draftwise serve --export DIR
--threads N` (`deploy`; plain decoding: `draftwise serve --target T --dtype D`) — as a bench baseline (`serve:ARGS`)
beside llama-server's plain decoding of the target's GGUF (the file it ships as; for a checkpoint, an f32 copy), on
the headline prompts (spec_bench), one client asking one request at a time, interleaved prompt by prompt, after an
untimed warm-up of each. Both are timed by the client's wall clock (request sent to the last byte): serve streamed
(`/v1/completions`, server-sent events), llama-server answering `/completion` whole. Process start and model loading
happen before the first request and are not timed.

  served   the decision record: the command, its tokens/s and its speedup over llama-server's (a paired bootstrap over
           prompts, `decide`) — or why nothing was measured: the answer is not on the draftwise engine (the serve
           command does not apply), the time budget left it out (`plan`'s `serve` drop), or `--no-serve`

The export READMEs carry a pending line (`deploy.PENDING`) that `annotate` replaces with the figure each time the export
is written, so a README never shows a figure the folder's records do not hold.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import statistics
from collections import Counter
from pathlib import Path

from .. import traffic
from ..config.serve import SERVE_FILE
from ..errors import DraftwiseError
from ..isolate import NativeCrash
from ..metrics import tokens_per_s
from ..peers.llama_server import find_binary
from ..rundir import read_records
from ..stages import bench
from . import decide, deploy, measure, requests
from .fastest import lean_name
from .target import target_of

STAGE, DECISION = "bench-serve", "served"
LEFT_OUT = "not measured: the time budget left it out"
TURNED_OFF = "not measured: --no-serve"
NOT_APPLICABLE = "the serve command does not apply: the design's answer does not run on the draftwise engine"
SERVER = "llama-server"  # its plain decoding, on the target's GGUF


def export_target(config) -> str:
    """The target as the export's commands name it: `default`, else the placeholder a user replaces."""
    return "default" if config.target == "default" else "<target>"


def folder_of(config, row: str) -> str:
    """A lean row's export folder, relative to export/: the design's own engine at its top, another lean row's under
    engines/."""
    return "." if row == lean_name(config) else f"engines/{row}"


def command(p, final: dict | None, readme: bool = True) -> list[str] | None:
    """The serve command of the design's answer, None when it does not run on the draftwise engine: as the export
    README prints it (run from export/), or as the bench runs it (`readme=False`: the folder absolute, the target as
    the design was given it)."""
    row = final["runtime"] if final else ""
    if not row.startswith("lean-"):
        return None
    c = p.base
    target = export_target(c) if readme else c.target
    device = c.device if row == lean_name(c) else "cpu"  # a lean row runs on the CPU (`rows`)
    where = folder_of(c, row)
    if not final["recommend"] and not by_temperature_in(p.path / "export" / where):
        return deploy.plain(target, row.removeprefix("lean-"), c.threads, device)
    return deploy.command(where if readme else str((p.path / "export" / where).resolve()), target, c.threads, device)


def by_temperature_in(folder: Path) -> bool:
    """Whether an export folder's serve.json drafts at some of the traffic's temperatures and decodes plainly at
    others (`fastest.gammas_by_temperature`): served from that folder even where plain decoding wins the whole
    traffic, as it is plain decoding on the same runtime where its method does not pay."""
    path = folder / SERVE_FILE
    return path.is_file() and bool(json.loads(path.read_text()).get("gamma_by_temperature"))


def outline(p, final: dict | None) -> dict:
    """What the plan needs to price `bench-serve` (`costs.Outline`): whether it runs, and its seconds per new token
    from the last grid's tokens/s (the answer's, and llama-server's plain decoding where a llama.cpp row measured it,
    else the fastest plain decoding's)."""
    if command(p, final) is None or not p.base.serve:
        return {"serve": False}
    server = [o["tokens_per_s"] for n, o in final["options"].items() if n.endswith("/" + SERVER)]
    return {
        "serve": True,
        "serve_token_s": 1 / final["tokens_per_s"] + 1 / (server[:1] or [final["plain_tokens_per_s"]])[0],
    }


def run(p, final: dict | None) -> dict:
    """The phase (module docstring): plan it, measure or say why not, then put the figure in the export READMEs."""
    p.replan("serve", **outline(p, final))
    args = command(p, final, readme=False)
    if args is None:
        record = p.stage(DECISION, lambda f: {"applies": False, "measured": False, "why": NOT_APPLICABLE})
    elif not p.base.serve or p.dropped("serve"):
        why = TURNED_OFF if not p.base.serve else LEFT_OUT
        record = p.stage(DECISION, lambda f: {"applies": True, "measured": False, "why": why})
    else:
        baseline = "serve:" + shlex.join(args[2:])
        try:
            measure_command(p, baseline)
        except NativeCrash as crash:  # a server process died by a signal: the figure is lost, not the design
            why = f"{crash}."
            record = p.stage(DECISION, lambda f: {"applies": True, "measured": False, "why": why})
        else:
            readme = deploy.join(command(p, final))
            record = p.stage(DECISION, lambda f: decide_served(p, baseline, readme))
    p.know(serve=False)  # settled: later plans no longer price it
    annotate(p.path / "export", record)
    return record


def measure_command(p, baseline: str) -> None:
    """`bench-serve`: the command and llama-server's plain decoding on the headline prompts, one client, interleaved;
    with the user's traffic, each request at its own temperature (a stage per temperature, `bench-serve@T1`, on that
    temperature's requests), so the figure is of the traffic's own mix."""
    try:
        find_binary(p.base.llama_server)
        peers = (baseline, SERVER)
    except DraftwiseError:  # no llama-server on this machine: the command alone
        peers = (baseline,)
    config = measure.base_config(
        p,
        None,
        1,
        p.config.headline_limit,
        suite=None if p.config.prompts else "spec_bench",  # the user's traffic, where they gave it
        baselines=peers,
        llama_server=p.base.llama_server,
        temperature=temperature(p),
    )
    by = by_temperature(p)
    if len(by) < 2:
        p.stage(STAGE, lambda f: bench.run(config, f, p.executor), command=baseline)
        return
    for t, prompts in by.items():

        def measured(f, t=t, prompts=prompts):
            own = dataclasses.replace(config, temperature=t, prompts=str(write_prompts(f, prompts)), limit=len(prompts))
            return bench.run(own, f, p.executor)

        p.stage(f"{STAGE}@T{t:g}", measured, command=baseline, temperature=t)


def by_temperature(p) -> dict[float, list]:
    """The user's traffic's first `headline_limit` prompts by the temperature each is asked at (empty: no traffic)."""
    if not p.config.prompts:
        return {}
    prompts = requests.prompts(p.config, p.config.headline_limit)
    at = {pid: t for t, pid in traffic.requests_of(prompts, p.config.temperatures, own=True)}
    out: dict[float, list] = {}
    for prompt in prompts:
        out.setdefault(at[prompt.id], []).append(prompt)
    return dict(sorted(out.items()))


def write_prompts(folder: Path, prompts: list) -> Path:
    """`prompts` as a traffic file of their own in `folder` (ids, categories, answer lengths and temperatures kept)."""
    path = Path(folder) / "prompts.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)  # the stage's folder: its bench has not made it yet
    lines = [
        json.dumps({"id": x.id.removeprefix("user/"), "category": x.category, "prompt": x.text, **dict(x.extra)})
        for x in prompts
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def stages_of(p) -> list[str]:
    """The finished `bench-serve` stages: one, or one per temperature of the traffic."""
    return [s for s in p.done if s == STAGE or s.startswith(STAGE + "@T")]


def temperature(p) -> float:
    """The temperature the command is measured at: the traffic's most common one (a tie: the lower)."""
    counts = Counter(t for t, _ in requests.requests(p.config, p.config.bench_limit))
    return min(counts, key=lambda t: (-counts[t], t))


def decide_served(p, baseline: str, readme: str) -> dict:
    """The decision record from `bench-serve`'s records: client wall tokens/s of each, the command over llama-server."""
    records = [r for s in stages_of(p) for r in read_records(p.folder(s) / "records.jsonl")]
    served = [r for r in records if r["method"] == baseline]
    server = [r for r in records if r["method"] == SERVER]
    wall = [{**r, "seconds": r["wall_s"]} for r in server]
    per_prompt = lambda rs: decide.timings(rs, lambda r: None)[None]  # noqa: E731
    over = decide.compare({"serve": per_prompt(served)}, per_prompt(wall), p.config.seed) if server else None
    own = target_of(p.base).file
    return {
        "applies": True,
        "measured": True,
        "command": readme,
        "prompts": len(served),
        "what": what(p),
        "tokens_per_s": tokens_per_s(served),
        "first_token_ms": 1e3 * statistics.median(r["first_token_s"] for r in served),
        "decode_tokens_per_s": decode_speed(served, lambda r: r["wall_s"] - r["first_token_s"]),
        "server_tokens_per_s": tokens_per_s({**r, "seconds": r["server_seconds"]} for r in served),
        "drafted": sum(r["drafted"] for r in served),
        "accepted": sum(r["accepted"] for r in served),
        "stages": stages_of(p),
        "llama_server": {
            "tokens_per_s": tokens_per_s(wall),
            "own_tokens_per_s": tokens_per_s(server),  # by its own timings
            # answered whole: its first token at its own prefill plus the client's overhead (HTTP, JSON)
            "first_token_ms": 1e3 * statistics.median(r["prefill_s"] + r["wall_s"] - r["seconds"] for r in server),
            "decode_tokens_per_s": decode_speed(server, lambda r: r["seconds"] - r["prefill_s"]),
            "file": own.name if own else "an f32 GGUF of the target's checkpoint",
        }
        if server
        else None,
        "over_llama_server": over["speedup"]["serve"] if over else None,
    }


def what(p) -> str:
    """The requests the figure is of, in words."""
    if not p.config.prompts:
        return f"spec_bench prompts at T = {temperature(p):g}"
    by = by_temperature(p)
    at = ", ".join(f"{len(v)} at T = {t:g}" for t, v in by.items())
    return f"requests of {Path(p.config.prompts).name}, each at its own temperature ({at})"


def decode_speed(records: list[dict], decode_s) -> float:
    """New tokens after the first over the seconds after it (`decode_s(record)`), summed over requests."""
    seconds = sum(decode_s(r) for r in records)
    return sum(r["new_tokens"] - 1 for r in records) / seconds if seconds > 0 else 0.0


def sentence(record: dict) -> str:
    """The served figure in one line (the READMEs' and the report's)."""
    head = "Through `draftwise serve` (HTTP, streamed, client wall time)"
    if not record.get("measured"):
        return f"{head}: {record['why']}."
    figure = f"{head}: {record['tokens_per_s']:.1f} tokens/s" + (
        f" (first token {record['first_token_ms']:.0f} ms median, decode {record['decode_tokens_per_s']:.1f} tokens/s)"
        if "decode_tokens_per_s" in record
        else ""
    )
    s = record.get("llama_server")
    if not s:
        return f"{figure} over {record['prompts']} prompts (no llama-server on this machine to measure beside it)."
    pt, lo, hi = record["over_llama_server"]
    return (
        f"{figure}, {pt:.2f}× llama-server's plain decoding under the same client [95 % {lo:.2f}–{hi:.2f}] "
        f"({s['tokens_per_s']:.1f} tokens/s on {s['file']}"
        + (
            f": first token {s['first_token_ms']:.0f} ms, decode {s['decode_tokens_per_s']:.1f} tokens/s"
            if "decode_tokens_per_s" in s
            else ""
        )
        + f"; {record['prompts']} {record.get('what', 'spec_bench prompts')}, interleaved)."
    )


def annotate(top: Path, record: dict) -> None:
    """The export READMEs' pending line replaced with what was measured (or why nothing was)."""
    for readme in [top / "README.md", *sorted(top.glob("engines/*/README.md"))]:
        if readme.is_file() and deploy.PENDING in (text := readme.read_text()):
            readme.write_text(text.replace(deploy.PENDING, sentence(record)))
