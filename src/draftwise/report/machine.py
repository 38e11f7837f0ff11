"""The machine a report's figures come from (`machine.json`), and plain decoding against its bandwidth limit."""

from __future__ import annotations

from .. import machine
from .doc import Doc
from .fmt import num


def plain_speeds(records: list[dict], key) -> dict[str, dict]:
    """Each plain method's decode speed and weight bytes per step, from bench records that carry `bytes_per_step`;
    `key(record)`: the name of its option (e.g. 'llama.cpp-Q4_1/llama-server')."""
    sums: dict[str, list] = {}
    for r in records:
        if "bytes_per_step" in r and "prefill_s" in r:
            s = sums.setdefault(key(r), [0, 0.0, r["bytes_per_step"]])
            s[0] += r["new_tokens"]
            s[1] += r["seconds"] - r["prefill_s"]
    return {k: {"decode_tokens_per_s": n / t, "bytes_per_step": b} for k, (n, t, b) in sums.items() if t > 0}


def section(doc: Doc, m: dict | None, plain: dict[str, dict], describe=str, level: int = 2) -> None:
    """The machine in words, then a table of plain decoding on each runtime against the bandwidth limit."""
    doc.h("The machine", level)
    if not m:
        doc.p("This run folder predates machine.json: its machine was not recorded.")
        return
    bw = (m.get("bandwidth") or {}).get("read_gb_per_s")
    build = m.get("llama_cpp") or {}
    doc.p(
        f"{m['cpu']} ({m['arch']}), {m['cores_usable']} of {m['cores']} cores usable, "
        f"{m.get('threads') or 'all'} threads used; {m.get('memory', {}).get('total_gib', '?')} GiB memory; "
        f"instruction sets the CPU and the OS allow: {', '.join(m['isa']) or 'none beyond SSE'}; AMX: {m['amx']}. "
        + (
            f"Measured read bandwidth: {bw:g} GB/s (a STREAM-style read probe, best of "
            f"{m['bandwidth']['passes']} passes over {m['bandwidth']['buffer_mib']} MiB, "
            f"{m['bandwidth']['threads']} threads{_readers(m['bandwidth'])}). "
            if bw
            else "Read bandwidth not measured. "
        )
        + (
            f"llama.cpp build: {build['flavour']} ({' '.join(build.get('flags') or [])}); chosen by its smoke test: "
            f"{build.get('reason')}{machine.llama_rates(build)}: every figure against llama.cpp moves with these. "
            if build.get("flavour")
            else "llama.cpp: not built by scripts/setup.sh (no build record). "
        )
        + "OpenMP: "
        + (", ".join(f"{k}={v}" for k, v in m.get("openmp", {}).get("env", {}).items()) or "defaults")
        + "."
        + "".join(f" Warning: {w}." for w in m.get("openmp", {}).get("warnings", []))
    )
    route(doc, m)
    if plain:
        doc.table(
            ["plain decoding", "decode tokens/s", "weights read a step", "bandwidth limit", "share of the limit"],
            [
                [
                    describe(name),
                    num(s["decode_tokens_per_s"], ".1f"),
                    f"{s['bytes_per_step'] / 1e6:.0f} MB",
                    num(machine.limit(s["bytes_per_step"], m), ".0f", " tokens/s"),
                    num(
                        100 * (machine.share(s["decode_tokens_per_s"], s["bytes_per_step"], m) or 0) if bw else None,
                        ".0f",
                        " %",
                    ),
                ]
                for name, s in sorted(plain.items(), key=lambda kv: -kv[1]["decode_tokens_per_s"])
            ],
        )
        doc.p(
            "Bandwidth limit: the measured read bandwidth ÷ the weight bytes one decoding step reads on that runtime "
            "(at its own precision; the embedding table counted only where it is the head too) — the fastest plain "
            "decoding this machine's memory allows. Share of the limit: decode tokens/s (prefill excluded) ÷ that "
            "limit; what is left is the headroom an engine still has."
        )


def route(doc: Doc, m: dict) -> None:
    """Which path of the lean int8/q4 kernel serves each band of rows here, with every proven path's measured rate
    (`runtimes/lean/ladder.py`)."""
    bands = m.get("matrix_route")
    if not bands:
        doc.p(
            f"Lean int8/q4 kernel: {m['matrix_path']} (proven before its bands were timed)."
            if m.get("matrix_path")
            else "Lean int8/q4 kernel: not proven on this machine when the run began."
        )
        return
    doc.p(
        f"Lean int8/q4 kernel: {m['matrix_path']}. Every path the CPU reports was proven in a child process (the "
        "torch reference's bits on every weight format) and timed there on a 1.5B model's matrices; each band of "
        "rows takes the fastest (rates: G products a second over every format and both activation bits):"
    )
    doc.table(
        ["band", "rows", "path", "measured rates", "worst pass size"],
        [
            [
                b["band"],
                b["rows"],
                _paths(b["paths"]),
                ", ".join(f"{p} {r:g}" for p, r in sorted(b["rates"].items(), key=lambda kv: -kv[1])),
                f"{100 * b['gap']:.0f} % behind the fastest" if b.get("gap") else "the fastest",
            ]
            for b in bands
        ],
    )
    prompts = m.get("matrix_prompts") or {}
    if prompts:
        by_path = {p: [k for k, v in prompts.items() if v == p] for p in sorted(set(prompts.values()))}
        doc.p(
            "Prompt passes (a prefill, whose logits nobody reads) take a lossy path where it was timed faster: "
            + "; ".join(f"{p} on {', '.join(keys)}" for p, keys in by_path.items())
            + " (its quality: `draftwise quality`, the next tokens after such a prefill)."
        )


def _paths(paths: dict[str, str]) -> str:
    """A band's paths by format in few words: the most common one, then the formats that take another."""
    common = max(set(paths.values()), key=list(paths.values()).count)
    others = [f"{k}: {p}" for k, p in paths.items() if p != common]
    return common + (f" ({'; '.join(others)})" if others else "")


def _readers(bw: dict) -> str:
    """Each reader's rate where the probe read the buffer more than one way (older folders: one)."""
    rates = bw.get("readers_gb_per_s") or {}
    return "; " + ", ".join(f"{name} {r:g}" for name, r in rates.items()) + " GB/s, the faster kept" if rates else ""
