"""The design's answer: the fastest lossless way to decode on this machine, against the fastest plain decoding of any
runtime here — whichever engine that is.

Each row's verdict compares a method with its own engine's AR; a user compares with what they already run (today,
often llama-server on the file the model ships as). So the design's last grid (`bench-fastest`) measures side by
side, interleaved prompt by prompt in one process, on the selection grid's prompts:

  plain     every runtime's plain decoding, whatever the budget left out: draftwise AR on the lean engine at the
            design's precision and (an engine by default) at int8, draftwise AR on each llama.cpp row's file, and
            llama-server's plain decoding of each of those files, on the same token ids
  methods   each row's choice where its verdict deploys it (a method no faster than its own engine's AR cannot beat
            the fastest plain decoding)

  fastest plain   the plain option with the most tokens/s on these prompts
  verdict         every option's speedup over the fastest plain, a paired bootstrap over prompts (`decide`); the fastest
                  option beyond noise, a tie going to plain decoding, then to the cheaper draft step. Deploy it when it
                  is a method whose interval over the fastest plain lies above 1; otherwise plain decoding on the
                  fastest plain runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import BenchConfig, BenchGridConfig
from ..models.llamacpp_load import LLAMA_CPP
from ..stages.bench import SCHEDULED
from ..stages.bench_grid import label
from . import decide, measure, rows

PLAIN = ("ar", "llama-server")  # the plain methods of a row: draftwise AR, llama-server without speculation
STAGE = "bench-fastest"


@dataclass(frozen=True)
class Entry:
    """One runtime of the grid: its name, its bench (plain baselines, and its chosen method's drafter if any)."""

    name: str
    bench: BenchConfig
    method: str | None  # the chosen method (sd | sd-scheduled), None: plain decoding only
    drafter: str | None  # the chosen drafter's name (its verdict's)


def lean_name(config) -> str:
    return f"lean-{config.dtype}"


def entries(p) -> list[Entry]:
    """Every runtime of the design (the base config's, whatever the budget dropped, less the rows that died) with
    what its verdict chose."""
    c = p.config
    v = p.done["verdict"]
    scheduled = measure.scheduling(p) if v["recommend"] and v["method"] != "sd" else {}
    main = measure.base_config(
        p, v["spec"] if v["recommend"] else None, v["gamma"], c.bench_limit, baselines=("ar",), **scheduled
    )
    out = [Entry(lean_name(c), main, v["method"] if v["recommend"] else None, v["drafter"] if v["recommend"] else None)]
    for e in rows.live(p):
        done = p.done.get(f"verdict@{e.name}")
        pick = done if done and done["recommend"] else None
        scheduled = measure.scheduling(p, f"profile@{e.name}") if pick and pick["method"] != "sd" else {}
        bench = rows.bench_config(
            p,
            e,
            drafter=pick["spec"] if pick else None,
            gamma=pick["gamma"] if pick else 1,
            baselines=PLAIN if e.backend == LLAMA_CPP else ("ar",),
            **scheduled,
        )
        out.append(Entry(e.name, bench, pick and pick["method"], pick and pick["drafter"]))
    return out


def grid(entries: list[Entry]) -> BenchGridConfig:
    """The first row as the grid's own bench, the others as its rows (each on its own runtime)."""
    first, rest = entries[0], entries[1:]
    return BenchGridConfig(bench=first.bench, rows=tuple(r.bench for r in rest), row_names=tuple(r.name for r in rest))


def option(entries: list[Entry]):
    """The records key of an option: '<runtime>/<method>' (the grid's own points are the first row's runtime)."""
    chosen = {r.name: r.method for r in entries}

    def key(r: dict):
        runtime = r.get("runtime") or entries[0].name
        if r["method"] in PLAIN or r["method"] == chosen.get(runtime):
            return f"{runtime}/{r['method']}"
        return decide.IGNORE

    return key


def run(p) -> dict:
    """The grid, then the verdict record (module docstring)."""
    rs = entries(p)
    measure.run_grid(p, STAGE, grid(rs), runtime=rs[0].name, runtimes=[r.name for r in rs])
    return p.stage("fastest", lambda f: decide_fastest(p, rs))


def decide_fastest(p, rs: list[Entry]) -> dict:
    """The verdict record from the last grid's records: every option over the fastest plain one (module docstring)."""
    by = decide.timings(measure.records(p, [STAGE]), option(rs))
    speed = {n: sum(t for t, _ in v.values()) / sum(s for _, s in v.values()) for n, v in by.items()}
    plain = [n for n in by if n.split("/", 1)[1] in PLAIN]
    fastest_plain = max(plain, key=speed.get)
    result = decide.compare(by, by[fastest_plain], p.config.seed)
    drafters = {r.name: r.drafter for r in rs}
    decision = decide.choose(result, lambda n: (n not in plain, n != fastest_plain, -speed[n]))
    chosen = decision["chosen"]
    runtime, method = chosen.split("/", 1)
    recommend = chosen not in plain and result["speedup"][chosen][1] > 1.0
    if not recommend:
        chosen, (runtime, method) = fastest_plain, fastest_plain.split("/", 1)
    return {
        "recommend": recommend,
        "option": chosen,
        "runtime": runtime,
        "method": method,
        "drafter": drafters.get(runtime) if recommend else None,
        "fastest_plain": fastest_plain,
        "speedup": result["speedup"][chosen],
        "tokens_per_s": speed[chosen],
        "plain_tokens_per_s": speed[fastest_plain],
        "options": {n: {"tokens_per_s": speed[n], "speedup": result["speedup"][n], "plain": n in plain} for n in by},
        "prompts": result["prompts"],
        "decision": decision,
        "rule": "the fastest option beyond noise (paired bootstrap over prompts, one interleaved grid), a tie going to "
        "plain decoding; a method is deployed when its 95 % interval over the fastest plain decoding measured "
        "here lies above 1",
    }


def describe(option: str) -> str:
    """An option in words: 'llama.cpp-Q4_1/llama-server' -> 'llama-server plain decoding on llama.cpp-Q4_1'."""
    runtime, method = option.split("/", 1)
    what = {
        "ar": "draftwise AR",
        "llama-server": "llama-server plain decoding",
        "sd": "draftwise SD",
        SCHEDULED: "draftwise SD with the round scheduler",
    }.get(method, method)
    return f"{what} on {runtime}"


def sentence(f: dict, rows_by_name: dict[str, dict] | None = None) -> str:
    """The design's first sentence: what to deploy on this machine, against the fastest plain decoding here."""
    pt, lo, hi = f["speedup"]
    plain = f"{describe(f['fastest_plain'])}, {f['plain_tokens_per_s']:.1f} tokens/s"
    if not f["recommend"]:
        return (
            f"Use plain decoding with {describe(f['fastest_plain'])}: the fastest decoding measured on this machine "
            f"({f['plain_tokens_per_s']:.1f} tokens/s over {f['prompts']} prompts); no speculative method beat it "
            "beyond noise."
        )
    v = (rows_by_name or {}).get(f["runtime"], {})
    what = f"{f['drafter']}" + (f" ({label(v['spec'], 60)}, γ = {v['gamma']})" if v.get("spec") else "")
    return (
        f"Deploy {what} on {f['runtime']}: {f['tokens_per_s']:.1f} tokens/s, {pt:.2f}× the fastest plain decoding "
        f"measured on this machine ({plain}) [95 % interval {lo:.2f}–{hi:.2f}], {f['prompts']} prompts, one "
        "interleaved grid."
    )


def row_verdicts(p) -> dict[str, dict]:
    """Every row's verdict record by runtime name (the lean engine's under `lean_name`)."""
    out = {lean_name(p.config): p.done["verdict"]}
    out.update({name.removeprefix("verdict@"): r for name, r in p.done.items() if name.startswith("verdict@")})
    return out


__all__ = ["Entry", "entries", "grid", "run", "decide_fastest", "sentence", "describe", "row_verdicts", "lean_name"]


def versus(f: dict | None, runtime: str, method: str) -> str:
    """A row's method beside the fastest plain decoding (a clause for its sentence), when the last grid measured it."""
    o = (f or {}).get("options", {}).get(f"{runtime}/{method}")
    if not o or o["plain"] and f"{runtime}/{method}" == f["fastest_plain"]:
        return ""
    pt, lo, hi = o["speedup"]
    return (
        f" Against the fastest plain decoding measured on this machine ({describe(f['fastest_plain'])}, "
        f"{f['plain_tokens_per_s']:.1f} tokens/s) it measured {pt:.2f}× [{lo:.2f}–{hi:.2f}] in the last grid."
    )


def deploy_command(f: dict, v: dict | None, target: str, threads: int | None) -> str:
    """What to run for the fastest option (`v`: its row's verdict record), paths relative to the export folder."""
    runtime, method = f["runtime"], f["method"]
    if method == "llama-server":
        file = rows.target_name(v) if v else f"<the target's {runtime.removeprefix(LLAMA_CPP + '-')} GGUF>"
        return f"`llama-server -m {file} -t {threads or 2} --host 127.0.0.1 --port 8080`"
    if runtime.startswith("lean-"):
        dtype = runtime.removeprefix("lean-")
        if method == "ar":
            return f"`draftwise bench --target {target} --dtype {dtype} --baseline ar`"
        return "see below"  # the lean engine at the design's precision: the export's own files
    return f"see `engines/{runtime}/README.md`"


def readme_header(
    f: dict,
    rows_by_name: dict[str, dict],
    target: str,
    threads: int | None,
    quality: dict[str, str] | None = None,
    how: str | None = None,
    measured_on: str | None = None,
) -> str:
    """The export README's opening: the design's answer, and how to run it (`quality`: each lossy runtime's cost
    against fp32, by runtime name; `how`: the command, where the export knows it better than `deploy_command`;
    `measured_on`: the machine, in a line)."""
    cost = (quality or {}).get(f["runtime"])
    return (
        f"# What to run on this machine\n\n**Verdict:** {sentence(f, rows_by_name)}"
        + (f" Its quality against fp32 (a lossy runtime): {cost}." if cost else "")
        + "\n\nHow (from this folder): "
        f"{how or deploy_command(f, rows_by_name.get(f['runtime']), target, threads)}\n\n"
        f"Every option of the last grid (tokens/s; speedup over the fastest plain decoding, 95 % interval):\n\n"
        + "\n".join(
            f"- {describe(n)}: {o['tokens_per_s']:.1f} tokens/s, {o['speedup'][0]:.2f}× "
            f"[{o['speedup'][1]:.2f}–{o['speedup'][2]:.2f}]"
            + (f" (quality: {(quality or {})[n.split('/')[0]]})" if n.split("/")[0] in (quality or {}) else "")
            for n, o in sorted(f["options"].items(), key=lambda kv: -kv[1]["tokens_per_s"])
        )
        + (f"\n\nMeasured on: {measured_on}." if measured_on else "")
        + "\n\n---\n\n"
    )
