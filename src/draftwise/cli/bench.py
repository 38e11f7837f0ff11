"""`draftwise bench`: one config, or a grid over drafters × γ × temperatures × batch sizes."""

from __future__ import annotations

import argparse
from dataclasses import replace

from ..errors import DraftwiseError
from . import dtype_arg, engine_args, executor, executor_args, floats, ints


def add(sub) -> dict:
    _bench_parser(sub)
    return {"bench": _bench}


def _bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="speculative decoding with a drafter vs baselines, same prompts, same process",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default", help="'default', a local HF model directory or a .gguf file")
    p.add_argument("--drafter", action="append", default=[],
                   help="a checkpoint directory, a .gguf file, layers:i,j,..., random:..., ngram[:...], suffix[:DIR,...] or "
                        "hybrid:MODEL+LOOKUP (repeat for a grid; SPEC@γ gives that drafter its own γ)")
    p.add_argument("--gamma", type=ints, default=(4,), help="lookahead: tokens drafted per round (a comma list: a grid)")
    p.add_argument("--draft-stop", type=float, default=0.0,
                   help="adaptive lookahead: stop a round's drafting once the drafter's probability of its token is below this")
    p.add_argument("--temperature", type=floats, default=(0.0,), help="0 = greedy (a comma list: a grid)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--suite", default="spec_bench", help="packaged suite(s): a name, a comma list or 'all'")
    p.add_argument("--split", default="eval", choices=["train", "eval", "all"])
    p.add_argument("--prompts", help="your own prompts: JSONL (prompt or turns per line) or text, one per line")
    p.add_argument("--limit", type=int, default=10, help="number of prompts, spread over categories (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--baseline", action="append", default=None,
                   help="comma list of ar, hf-generate, hf-assisted, hf-prompt-lookup, llama-cpp, llama-cpp-prompt-lookup, "
                        "llama-server or llama-server:ARGS (ARGS: the server's options, taken whole, commas included); "
                        "repeatable; default ar ('' for none)")
    p.add_argument("--llama-server", metavar="PATH",
                   help="the llama-server binary of llama-server baselines (default: on PATH, else beside this Python)")
    p.add_argument("--batch-size", type=ints, default=(1,),
                   help="prompts decoded together (batched SD and AR; a comma list: a grid)")
    p.add_argument("--synthetic-alpha", type=float,
                   help="accept each drafted token with this probability instead of testing it: measures system cost "
                        "for random-weight shapes (not lossless)")
    p.add_argument("--schedule", metavar="PROFILE",
                   help="also run SD with the round scheduler: each round verifies the prefix of the proposal that the "
                        "verify curve of this profile run folder (same engine and precision) and the proposer's "
                        "confidence, calibrated online from the run's own rounds, price best; γ is its longest run")
    p.add_argument("--calibration", metavar="RUN",
                   help="start the scheduler's calibration from a calibration folder (a design's stages/calibrate-lookup "
                        "or its export/schedule: the table at this temperature) or from the scheduled rounds of a bench run "
                        "folder (same drafter and temperature) instead of from nothing")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each method before measuring")
    dtype_arg(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    engine_args(p)
    p.add_argument("--llama-exact", action="store_true",
                   help="llama.cpp: an f32 KV cache and no flash attention instead of llama.cpp's defaults (f16 KV; "
                        "flash attention, whose CPU kernel rounds q to f16): multi-token passes then round as steps do")
    p.add_argument("--compile", action="store_true", help="torch.compile the lean forward's layers (helps on GPUs)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    executor_args(p)
    p.add_argument("--out", required=True, help="run folder (rerun on the same folder to resume)")


def baselines(values: list[str] | None) -> tuple[str, ...]:
    """--baseline values: comma lists, except that from an item starting with llama-server: on, the rest of the value
    is that one baseline (its server arguments may hold commas: --spec-type ngram-simple,ngram-mod)."""
    out: list[str] = []
    for value in ["ar"] if values is None else values:
        rest = value
        while rest:
            if rest.startswith("llama-server:"):
                out.append(rest)
                break
            item, _, rest = rest.partition(",")
            if item.strip():
                out.append(item.strip())
    return tuple(out)


def _bench(args) -> None:
    from ..config import BenchConfig, BenchGridConfig
    from ..stages import bench, bench_grid

    config = BenchConfig(
        target=args.target, drafter=_own_gamma((args.drafter or [None])[0])[0] if args.drafter else None,
        gamma=args.gamma[0], draft_stop=args.draft_stop,
        temperature=args.temperature[0], top_p=args.top_p,
        suite=args.suite, split=args.split, prompts=args.prompts, limit=args.limit or None,
        max_new_tokens=args.max_new_tokens, baselines=baselines(args.baseline), llama_server=args.llama_server,
        batch_size=args.batch_size[0], synthetic_alpha=args.synthetic_alpha, schedule=args.schedule, calibration=args.calibration,
        seed=args.seed, warmup=args.warmup, dtype=args.dtype, device=args.device, backend=args.backend,
        compile=args.compile, gguf_quant=args.gguf_quant, llama_exact=args.llama_exact, threads=args.threads,
    )
    axes = (args.drafter, args.gamma, args.temperature, args.batch_size)
    own = [_own_gamma(d) for d in args.drafter]  # SPEC@γ: that drafter at its own γ
    if any(g for _, g in own):
        if not all(g for _, g in own):
            raise DraftwiseError("give every --drafter its own γ (SPEC@γ), or none")
        grid = BenchGridConfig(bench=replace(config, drafter=own[0][0], gamma=own[0][1]), drafters=tuple(d for d, _ in own),
                               drafter_gammas=tuple(g for _, g in own), temperatures=args.temperature,
                               batch_sizes=args.batch_size)
        bench_grid.run(grid, args.out, executor(args))
    elif all(len(a) <= 1 for a in axes):
        bench.run(config, args.out, executor(args))
    else:
        grid = BenchGridConfig(bench=config, drafters=tuple(args.drafter), gammas=args.gamma, temperatures=args.temperature,
                               batch_sizes=args.batch_size)
        bench_grid.run(grid, args.out, executor(args))


def _own_gamma(spec: str) -> tuple[str, int | None]:
    head, at, tail = spec.rpartition("@")
    return (head, int(tail)) if at and tail.isdigit() else (spec, None)
