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

The grid runs the user's traffic (`traffic`): their prompt file with each request's answer length, or the selection
suites, at every temperature the traffic holds (T = 0 and T = 1 by default). Each option's figures are time to first
token (TTFT), time per output token (decode) and tokens/s with prefill; its request time is TTFT + answer × TPOT per
request, at the answer length the target gave.

  fastest plain   the plain option with the shortest expected request time over the traffic
  verdict         every option's speedup over the fastest plain — the ratio of expected request times, a paired
                  bootstrap over requests (`decide`); the fastest option beyond noise, a tie going to plain decoding,
                  then to the cheaper draft step. Deploy it when it is a method whose interval over the fastest plain
                  lies above 1; otherwise plain decoding on the fastest plain runtime. The same per temperature
                  (`temperatures`), where the traffic's temperatures want different answers.
  crossovers      for each other option, the answer length beyond (or below) which it would finish a request first
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import traffic
from ..config import BenchConfig, BenchGridConfig
from ..rundir import read_records
from ..runtimes.llamacpp.load import LLAMA_CPP
from ..stages.bench import SCHEDULED
from ..stages.bench_grid import label
from . import decide, measure, requests, rows

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
            baselines=e.plain,
            **scheduled,
        )
        out.append(Entry(e.name, bench, pick and pick["method"], pick and pick["drafter"]))
    return out


def grid(entries: list[Entry], temperatures: tuple[float, ...] = ()) -> BenchGridConfig:
    """The first row as the grid's own bench, the others as its rows (each on its own runtime), every one at each of
    `temperatures`."""
    first, rest = entries[0], entries[1:]
    return BenchGridConfig(
        bench=first.bench,
        rows=tuple(r.bench for r in rest),
        row_names=tuple(r.name for r in rest),
        temperatures=temperatures,
    )


def option(entries: list[Entry]):
    """The records key of an option: '<runtime>/<method>' (the grid's own points are the first row's runtime)."""
    chosen = {r.name: r.method for r in entries}

    def key(r: dict):
        runtime = r.get("runtime") or entries[0].name
        if r["method"] in rows.PLAIN or r["method"] == chosen.get(runtime):
            return f"{runtime}/{r['method']}"
        return decide.IGNORE

    return key


def run(p) -> dict:
    """The grid, then the verdict record (module docstring)."""
    rs, temps = entries(p), requests.temperatures(p.config, p.config.bench_limit)
    measure.run_grid(p, STAGE, grid(rs, temps), runtime=rs[0].name, runtimes=[r.name for r in rs])
    wanted = requests.requests(p.config, p.config.bench_limit)
    return p.stage("fastest", lambda f: decide_fastest(p, rs, wanted))


def decide_fastest(p, rs: list[Entry], wanted: set[tuple[float, str]] | None = None) -> dict:
    """The verdict record from the last grid's records: the traffic's whole (its `wanted` (temperature, prompt id)
    requests; None: every request measured), and each temperature's (module docstring)."""
    by = traffic.phases(read_records(p.folder(STAGE) / "records.jsonl"), option(rs), ignore=decide.IGNORE)
    measured = {at for per in by.values() for at in per}
    wanted = wanted & measured if wanted and wanted & measured else measured
    temps = sorted({t for t, _ in measured})
    whole = decide_over(p, rs, by, lambda at: at in wanted)
    per = {f"{t:g}": decide_over(p, rs, by, lambda at, t=t: at[0] == t) for t in temps}
    return {**whole, "temperatures": per, "traffic": sorted(f"{t:g}" for t in {t for t, _ in wanted})}


def decide_over(p, rs: list[Entry], by: dict, wanted) -> dict:
    """Every option over the fastest plain one by expected request time on the `wanted` requests (docstring)."""
    times = {n: t for n, t in traffic.request_times(by, wanted).items() if t}
    figures = {n: traffic.figures(by[n], times[n]) for n in times}
    plain = [n for n in times if n.split("/", 1)[1] in rows.PLAIN]
    fastest_plain = min(plain, key=lambda n: figures[n].request_s)
    result = decide.compare(times, times[fastest_plain], p.config.seed)
    drafters = {r.name: r.drafter for r in rs}
    decision = decide.choose(result, lambda n: (n not in plain, n != fastest_plain, figures[n].request_s))
    chosen = decision["chosen"]
    recommend = chosen not in plain and result["speedup"][chosen][1] > 1.0
    if not recommend:
        chosen = fastest_plain
    runtime, method = chosen.split("/", 1)
    return {
        "recommend": recommend,
        "option": chosen,
        "runtime": runtime,
        "method": method,
        "drafter": drafters.get(runtime) if recommend else None,
        "fastest_plain": fastest_plain,
        "speedup": result["speedup"][chosen],
        "tokens_per_s": figures[chosen].tokens_per_s,
        "plain_tokens_per_s": figures[fastest_plain].tokens_per_s,
        "options": {n: {**figures[n].as_dict(), "speedup": result["speedup"][n], "plain": n in plain} for n in figures},
        "crossovers": {n: traffic.crossover(figures[chosen], figures[n]) for n in figures if n != chosen},
        "prompts": result["prompts"],
        "decision": decision,
        "rule": "the shortest expected request time (time to first token + answer length × time per output token, "
        "summed over the traffic's requests) beyond noise (paired bootstrap over requests, one interleaved grid), a "
        "tie going to plain decoding; a method is deployed when its 95 % interval over the fastest plain decoding "
        "measured here lies above 1",
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


def phases_text(o: dict) -> str:
    """An option's figures in words: its request time, TTFT and decode speed (an older record: its tokens/s)."""
    if "ttft_s" not in o:
        return f"{o['tokens_per_s']:.1f} tokens/s"
    return (
        f"{o['request_s']:.2f} s a request: first token {1e3 * o['ttft_s']:.0f} ms, decode "
        f"{o['decode_tokens_per_s']:.1f} tokens/s"
    )


def sentence(f: dict, rows_by_name: dict[str, dict] | None = None) -> str:
    """The design's first sentence: what to deploy on this machine for the traffic, against the fastest plain decoding
    here; then where a temperature of the traffic wants another answer, and the fastest plain's crossover."""
    pt, lo, hi = f["speedup"]
    plain = f"{describe(f['fastest_plain'])}, {phases_text(f['options'][f['fastest_plain']])}"
    traffic_text = f"{f['prompts']} requests" + (f" at T = {', '.join(f['traffic'])}" if f.get("traffic") else "")
    if not f["recommend"]:
        head = (
            f"Use plain decoding with {plain}: the fastest decoding measured on this machine for this traffic "
            f"({traffic_text}); no speculative method beat it beyond noise."
        )
    else:
        v = (rows_by_name or {}).get(f["runtime"], {})
        what = f"{f['drafter']}" + (f" ({label(v['spec'], 60)}, γ = {v['gamma']})" if v.get("spec") else "")
        head = (
            f"Deploy {what} on {f['runtime']}: {phases_text(f['options'][f['option']])} — {pt:.2f}× [95 % interval "
            f"{lo:.2f}–{hi:.2f}] the request time of the fastest plain decoding measured on this machine ({plain}); "
            f"{traffic_text}, one interleaved grid."
        )
    return head + "".join(_temperature_clause(f, t, x) for t, x in f.get("temperatures", {}).items()) + crossover(f)


def _temperature_clause(f: dict, t: str, x: dict) -> str:
    """Where one temperature alone wants another answer than the traffic's whole."""
    if x["option"] == f["option"]:
        return ""
    what = f"{describe(x['option'])}" + (f" ({x['drafter']})" if x["recommend"] else "")
    return f" At T = {t} alone the answer is {what}: {phases_text(x['options'][x['option']])}."


def crossover(f: dict) -> str:
    """The first option to overtake the answer as answers grow: of those decoding faster, the one with the shortest
    crossover (a sentence); that nothing measured decodes faster, where so."""
    if "ttft_s" not in f["options"][f["option"]]:
        return ""
    figs = {n: traffic.Figures(**_fields(o)) for n, o in f["options"].items()}
    mine = figs.pop(f["option"])
    ahead = {n: at for n, x in figs.items() if x.tpot_s < mine.tpot_s and (at := traffic.crossover(mine, x))}
    if not ahead:
        return " No other option measured decodes faster: it stays the fastest however long the answer."
    n = min(ahead, key=ahead.get)
    return (
        f" For answers beyond ~{ahead[n]:.0f} new tokens {describe(n)} would be faster (decode "
        f"{figs[n].decode_tokens_per_s:.1f} tokens/s)."
    )


def _fields(o: dict) -> dict:
    return {k: o[k] for k in ("ttft_s", "tpot_s", "tokens_per_s", "request_s", "requests")}


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
        f"{phases_text(f['options'][f['fastest_plain']])}) it measured {pt:.2f}× [{lo:.2f}–{hi:.2f}] in the last "
        f"grid ({phases_text(o)})."
    )


def gammas_by_temperature(f: dict | None, runtime: str, gamma: int) -> str | None:
    """`serve --gamma-by-temperature` for `runtime`'s method at γ `gamma` where the traffic's temperatures want
    different answers on it: at each temperature γ where the method's interval over that temperature's fastest plain
    decoding lies above the runtime's own plain decoding (the deploy rule, on this runtime), else 0 (plain decoding);
    None where one answer serves every temperature, or the grid did not measure both on it."""
    f, out = f or {}, {}
    traffic = set(f.get("traffic") or ())  # the temperatures the traffic asks at (others measured do not matter)
    for t, at in (f.get("temperatures") or {}).items():
        if traffic and t not in traffic:
            continue
        options = at["options"]
        method = next((o for n, o in options.items() if n.startswith(runtime + "/") and not o["plain"]), None)
        plain = options.get(f"{runtime}/ar")
        if method is None or plain is None:
            return None
        out[t] = gamma if method["speedup"][1] > plain["speedup"][0] else 0
    return ",".join(f"{t}:{g}" for t, g in out.items()) if len(set(out.values())) > 1 else None


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
        f"Every option of the last grid (request time, first token and decode speed on the traffic; speedup in request "
        "time over the fastest plain decoding, 95 % interval):\n\n"
        + "\n".join(
            f"- {describe(n)}: {phases_text(o)}, {o['tokens_per_s']:.1f} tokens/s with prefill; {o['speedup'][0]:.2f}× "
            f"[{o['speedup'][1]:.2f}–{o['speedup'][2]:.2f}]"
            + (f" (quality: {(quality or {})[n.split('/')[0]]})" if n.split("/")[0] in (quality or {}) else "")
            for n, o in sorted(f["options"].items(), key=lambda kv: -kv[1]["speedup"][0])
        )
        + (f"\n\nMeasured on: {measured_on}." if measured_on else "")
        + "\n\n---\n\n"
    )
