"""`draftwise load-test`: concurrent clients against servers started on 127.0.0.1 — draftwise's own (`serve:ARGS`)
and llama.cpp's (`llama-server[:ARGS]`) — on the same token-id prompts: no request lost or failed, time to first
token, tokens/s per client and in aggregate.

A block is one (server, clients): the server is started for it (llama-server with `-np clients`, the slots a
deployment for that many clients would set, unless ARGS set -np), answers one untimed warm-up request, then every
client sends its requests one after another, all clients at once (`peers.clients`); it is stopped after the block,
also when the block crashes. Blocks run client count by client count, each server in turn, so the servers compared
at one count run close together in time.

The prompts (the suites' or a file's) are encoded once with the target's tokenizer, through its chat template, as
bench encodes them; client k's j-th request sends prompt (k·requests + j) mod len(prompts).

Each answered request is appended to records.jsonl as it comes (kind `request`); a block's record (kind `block`) is
appended once all its requests are in. A rerun on the same folder skips the blocks that have one; a block cut short
by a kill is run again whole under its next `attempt` (its earlier records stay, raw, and the summary reads only the
attempt that finished): a block's timing is a whole, so half a block cannot be resumed. summary.json, the table and
load_test.png are derived from the records.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from .. import data
from ..config.load_test import LoadConfig, server_args
from ..errors import DraftwiseError
from ..peers.clients import Block, log_name, make_server, run_block
from ..peers.clients import check as check_servers
from ..rundir import RunDir
from ..runtimes.base import Model
from ..targets.checkpoint import config_and_tokenizer
from ..targets.source import metadata
from ..targets.spec import parse
from . import peers

LLAMA_SERVER = "llama-server"
DEFINITIONS = """Per (server, clients) block, from its request records: sent = clients x requests; ok = requests
answered with their tokens; failed = requests that got an error (each recorded with it); lost = sent - ok - failed
(requests with no record: 0 unless the client side broke). retries: 503 answers (queue full) retried after their
Retry-After. TTFT: seconds from a request's first send (503 waits included) to the first event carrying a token, p50
and p99 over the ok requests. TPOT (time per output token, vLLM's): (a request's wall time - its TTFT) / (its new
tokens - 1), p50 and p99 over the ok requests of 2 tokens or more. tokens/s per client: the mean over clients of the
client's new tokens / its busy time (the sum of its requests' wall times). aggregate tokens/s: every new token of the
block / the block's wall time, first send to last answer. vs llama-server: aggregate over that of the first plain
llama-server (no ARGS) at the same clients. drafted, alpha: the tokens the server says it drafted and the share of them
accepted (draftwise's stats, llama-server's timings), over the ok requests. load_avg: the machine's 1-minute load
average at the block's start and end (its block record): the clients and the server's threads count in it; more means
other work shared the cores."""


def tokenizer_model(target: str) -> Model:
    """`target`'s config and tokenizer (no weights): a GGUF's from its metadata, an HF directory's from its files."""
    named = parse(target)
    if named.file is not None:
        config, tokenizer = metadata(named.file)
        return Model(target, config, tokenizer, None, "tokenizer", gguf=named.file)
    if named.built:
        raise DraftwiseError(f"{target}: a load test needs a target with a tokenizer ('default', a .gguf, an HF dir)")
    path = named.directory()
    config, tokenizer = config_and_tokenizer(path)
    return Model(target, config, tokenizer, None, "tokenizer", path)


def encode_prompts(config: LoadConfig, target: Model) -> list[tuple[str, list[int], int, float]]:
    """(prompt id, token ids, new tokens asked, temperature) of every prompt, as bench encodes them: a prompt file's
    line asks for its own `max_tokens` and `temperature` (a mixed workload), else --max-new-tokens and
    --temperature."""
    if config.prompts:
        prompts = data.spread(data.read_prompt_file(config.prompts), config.limit)
    else:
        prompts = data.load_prompts(config.suite, config.split, config.limit)
    encoded = [
        (
            p.id,
            target.encode(p.text),
            p.extra.get("max_tokens", config.max_new_tokens),
            p.extra.get("temperature", config.temperature),
        )
        for p in prompts
    ]
    empty = [pid for pid, ids, _, _ in encoded if not ids]
    if not encoded or empty:
        raise DraftwiseError(f"prompt {empty[0]} encodes to no tokens" if empty else "no prompts to send")
    return encoded


def context_per_slot(prompts: list[tuple[str, list[int], int, float]]) -> int:
    """llama-server's KV positions per slot: the longest request (prompt and answer) and room for drafts, in 256s."""
    need = max(len(ids) + n for _, ids, n, _ in prompts) + 32
    return max(512, -(-need // 256) * 256)


def run(config: LoadConfig, out: str | Path) -> Path:
    check_servers(config)  # bad server arguments, a missing llama-server: refused before the folder exists
    target = tokenizer_model(config.target)
    prompts = encode_prompts(config, target)
    run_dir = RunDir(out, config)
    records = run_dir.records()
    done = {(r["server"], r["clients"]) for r in records if r["kind"] == "block"}
    tried: dict[tuple, set] = {}
    for r in records:
        tried.setdefault((r["server"], r["clients"]), set()).add(r["attempt"])
    todo = [(s, c) for c in config.clients for s in config.servers if (s, c) not in done]
    llama = any(server_args(s)[0] == LLAMA_SERVER for s, _ in todo)
    gguf, n_ctx = (peers.target_gguf(target) if llama else None), context_per_slot(prompts)
    total = sum(c * config.requests for _, c in todo)
    bar = tqdm(total=total, desc="load-test", unit="req", file=sys.stderr, dynamic_ncols=True, disable=not todo)
    try:
        for spec, clients in todo:
            attempt = max(tried.get((spec, clients), {0})) + 1
            block = Block(spec, clients, attempt, config, prompts)
            server = make_server(spec, clients, config, gguf, n_ctx, run_dir.path / "logs" / log_name(spec, clients))
            bar.set_postfix_str(f"{spec[:40]} × {clients}")
            run_dir.append(run_block(block, server, run_dir.append, bar.update))
    finally:
        bar.close()
    summary = summarize(run_dir.records(), config)
    summary["prompts"] = len(prompts)
    run_dir.write_json("summary.json", summary)
    plot(summary, run_dir.path)
    print(format_table(summary))
    print(f"run folder: {run_dir.path}")
    return run_dir.path


def reference(config: LoadConfig) -> str | None:
    """The first plain llama-server (no ARGS): what each aggregate is compared with."""
    return next((s for s in config.servers if server_args(s) == (LLAMA_SERVER, [])), None)


def summarize(records: list[dict], config: LoadConfig) -> dict:
    """summary.json from the records alone: one entry per finished block, in run order (see DEFINITIONS)."""
    finished = {(r["server"], r["clients"]): r for r in records if r["kind"] == "block"}
    blocks = []
    for clients in config.clients:
        for spec in config.servers:
            block = finished.get((spec, clients))
            if block is None:
                continue
            mine = [
                r
                for r in records
                if r["kind"] == "request"
                and (r["server"], r["clients"], r["attempt"]) == (spec, clients, block["attempt"])
            ]
            figs = figures(mine, clients, config.requests)
            blocks.append({**figs, "server": spec, "clients": clients, "load_avg": block.get("load_avg")})
    ref = reference(config)
    base = {b["clients"]: b["aggregate_tokens_per_s"] for b in blocks if b["server"] == ref}
    for b in blocks:
        agg, over = b["aggregate_tokens_per_s"], base.get(b["clients"])
        b["vs_llama_server"] = agg / over if agg is not None and over else None
    return {"definitions": DEFINITIONS, "reference": ref, "blocks": blocks}


def figures(reqs: list[dict], clients: int, requests: int) -> dict:
    """One block's figures from its request records (see DEFINITIONS)."""
    ok = [r for r in reqs if r["ok"]]
    ttft = [r["ttft_s"] for r in ok]
    tpot = [(r["wall_s"] - r["ttft_s"]) / (r["new_tokens"] - 1) for r in ok if r["new_tokens"] > 1]
    per_client = []
    for k in range(clients):
        theirs = [r for r in reqs if r["client"] == k]
        busy = sum(r["wall_s"] for r in theirs)
        if busy > 0:
            per_client.append(sum(r["new_tokens"] for r in ok if r["client"] == k) / busy)
    tokens = sum(r["new_tokens"] for r in ok)
    drafted = sum(r.get("drafted") or 0 for r in ok)
    span = max(r["end_s"] for r in reqs) - min(r["start_s"] for r in reqs) if reqs else 0.0
    errors: dict[str, int] = {}
    for r in reqs:
        if not r["ok"]:
            errors[r["error"]] = errors.get(r["error"], 0) + 1
    return {
        "sent": clients * requests,
        "ok": len(ok),
        "failed": len(reqs) - len(ok),
        "lost": clients * requests - len(reqs),
        "retries": sum(r["retries"] for r in reqs),
        "new_tokens": tokens,
        "wall_s": span,
        "ttft_p50_s": float(np.percentile(ttft, 50)) if ttft else None,
        "ttft_p99_s": float(np.percentile(ttft, 99)) if ttft else None,
        "tpot_p50_s": float(np.percentile(tpot, 50)) if tpot else None,
        "tpot_p99_s": float(np.percentile(tpot, 99)) if tpot else None,
        "tokens_per_s_per_client": float(np.mean(per_client)) if per_client else None,
        "aggregate_tokens_per_s": tokens / span if span > 0 else None,
        "drafted": drafted,
        "alpha": sum(r.get("accepted") or 0 for r in ok) / drafted if drafted else None,
        "errors": errors,
    }


def format_table(summary: dict) -> str:
    def fmt(v, spec: str, unit: str = "") -> str:
        return "-" if v is None else format(v, spec) + unit

    w = max([8] + [len(b["server"]) + 2 for b in summary["blocks"]])
    cols = f"{'clients':>8}{'ok':>6}{'failed':>7}{'lost':>5}{'503s':>5}{'TTFT p50':>10}{'TTFT p99':>10}"
    cols += f"{'TPOT p50':>10}{'TPOT p99':>10}"
    lines = [f"{'server':<{w}}{cols}{'tok/s/client':>13}{'aggregate':>10}{'vs llama-server':>16}{'load':>10}"]
    for b in summary["blocks"]:
        lines.append(
            f"{b['server']:<{w}}{b['clients']:>8}{b['ok']:>6}{b['failed']:>7}{b['lost']:>5}{b['retries']:>5}"
            f"{fmt(b['ttft_p50_s'], '.3f', ' s'):>10}{fmt(b['ttft_p99_s'], '.3f', ' s'):>10}"
            f"{fmt(b.get('tpot_p50_s'), '.4f', ' s'):>10}{fmt(b.get('tpot_p99_s'), '.4f', ' s'):>10}"
            f"{fmt(b['tokens_per_s_per_client'], '.1f'):>13}{fmt(b['aggregate_tokens_per_s'], '.1f'):>10}"
            f"{fmt(b['vs_llama_server'], '.2f', 'x'):>16}{'/'.join(f'{x:.1f}' for x in b['load_avg'] or ()):>10}"
        )
    for b in summary["blocks"]:
        if b.get("drafted"):
            lines.append(f"{b['server']} × {b['clients']}: drafted {b['drafted']}, {b['alpha']:.1%} accepted")
    for b in summary["blocks"]:
        for error, n in b["errors"].items():
            lines.append(f"{b['server']} × {b['clients']}: {n} failed: {error}")
    lines.append("tokens/s: new tokens; aggregate: all clients' tokens / the block's wall time (summary.json: how)")
    return "\n".join(lines)


def plot(summary: dict, folder: Path) -> Path | None:
    """load_test.png: aggregate tokens/s and TTFT p50 / p99 against clients, one line per server."""
    if not summary["blocks"]:
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only, as report.plots draws
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    servers = list(dict.fromkeys(b["server"] for b in summary["blocks"]))
    for spec in servers:
        rows = sorted((b for b in summary["blocks"] if b["server"] == spec), key=lambda b: b["clients"])
        x = [b["clients"] for b in rows]
        label = spec if len(spec) <= 60 else spec[:57] + "..."
        line = ax1.plot(x, [b["aggregate_tokens_per_s"] or 0 for b in rows], "o-", label=label)[0]
        ax2.plot(x, [b["ttft_p50_s"] or 0 for b in rows], "o-", color=line.get_color(), label=f"{label} p50")
        ax2.plot(x, [b["ttft_p99_s"] or 0 for b in rows], "s--", color=line.get_color(), lw=1, label=f"{label} p99")
    clients = sorted({b["clients"] for b in summary["blocks"]})
    ax1.set(xlabel="concurrent clients", ylabel="tokens/s, all clients", title="Aggregate throughput", xticks=clients)
    ax2.set(
        xlabel="concurrent clients", ylabel="seconds", title="Time to first token (p50, p99 dashed)", xticks=clients
    )
    ax1.set_ylim(bottom=0)
    ax2.set_ylim(bottom=0)
    ax1.legend(fontsize=6)
    ax2.legend(fontsize=6)
    fig.text(0.01, 0.005, f"draftwise load-test; {folder}", fontsize=6, color="0.4", ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = folder / "load_test.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
