"""`draftwise design` (the whole study) and `draftwise export-gguf`."""

from __future__ import annotations

import argparse

from . import dtype_arg, executor, executor_args, floats, ints


def add(sub) -> dict:
    _design_parser(sub)
    _export_gguf_parser(sub)
    return {"design": _design, "export-gguf": _export_gguf}


def _export_gguf_parser(sub) -> None:
    p = sub.add_parser("export-gguf", help="write a model as a GGUF file llama.cpp runs, with the target's tokenizer",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("model", help="'default', a checkpoint or prune / distill run folder, a .gguf file, layers:i,j,... "
                                 "or random:... (of --target)")
    p.add_argument("--quant", default="f32", help="f32, f16 or q8_0 (matrices; norms and biases stay f32)")
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.add_argument("--target", default="default",
                   help="the target whose tokenizer metadata the file carries (copied from its GGUF when it has one)")


def _export_gguf(args) -> None:
    from ..models.gguf_export import export

    path = export(args.model, args.out, args.quant, args.target)
    print(f"{path} ({path.stat().st_size / 2 ** 20:.1f} MiB)")


def _design_parser(sub) -> None:
    p = sub.add_parser("design", help="the whole study: candidates, prune, distill, bench, select drafter and γ*, report, export",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--minutes", type=float, default=30.0,
                   help="the whole run's budget: every stage is sized to it from timings measured as the run goes, "
                        "optional stages left out when it is short (the report says which)")
    p.add_argument("--fixed-sizes", action="store_true",
                   help="run every stage at the sizes given here instead (--minutes then sizes only data and distillation)")
    p.add_argument("--budget", default="", help="drafters' non-embedding parameters (default: the target's first 2 layers')")
    p.add_argument("--wide-layers", type=ints, default=(),
                   help="override the cost model's shapes: k full-width layers and their deep-narrow twin")
    p.add_argument("--narrow-factor", type=int, default=3, help="deep-narrow twin: layers x f, heads/KV/FFN / f")
    p.add_argument("--drafter", help="your own drafter, benchmarked beside the candidates")
    p.add_argument("--no-lookups", action="store_true", help="model drafters only (no n-gram, suffix or hybrid candidates)")
    p.add_argument("--no-scheduler", action="store_true",
                   help="no scheduled candidates (the tuned lookups under the round scheduler, calibrated on the target's text)")
    p.add_argument("--loss", default="fkl", choices=["fkl", "rkl", "tvd", "jsd"])
    p.add_argument("--temperatures", type=floats, default="0,0.5,1")
    p.add_argument("--bench-suites", default="all", help="suites of the selection grid (TAR and speedup per task)")
    p.add_argument("--bench-limit", type=int, default=18, help="eval prompts of the selection grid")
    p.add_argument("--refine-limit", type=int, default=9, help="eval prompts of the γ, temperature and batch benchmarks")
    p.add_argument("--select-repeats", type=int, default=1,
                   help="extra interleaved passes over the same prompts when candidates tie within noise")
    p.add_argument("--tune-prompts", type=int, default=27, help="eval prompts whose target text tunes the lookup settings")
    p.add_argument("--corpus-gain", type=float, default=0.01,
                   help="extend gen-data once when doubling the suffix corpus last gained at least this (predicted)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--memory", default="1GiB",
                   help="budget for target + drafter weights and KV caches: the largest batch that fits with SD on")
    p.add_argument("--context", type=int, default=1024, help="KV positions per sequence in that footprint")
    p.add_argument("--batch-cap", type=int, default=8, help="the largest batch benchmarked on this machine")
    p.add_argument("--rows", "--engines", dest="rows", default="lean,lean-int8,llama.cpp",
                   help="where verdicts are measured: lean (draftwise's engine at --dtype, where candidates are built), "
                        "lean-int8 (the same engine at int8: a lossy choice, its quality measured) and llama.cpp (the "
                        "target's own GGUF, at its quantization); the design's answer compares every one's choice with "
                        "the fastest plain decoding of any of them")
    p.add_argument("--gguf-quants", default="",
                   help="further llama.cpp rows: the target written at these precisions (comma list of f32, f16, q8_0; "
                        "each a lossy choice you make)")
    p.add_argument("--llama-server", help="the llama-server binary of the llama.cpp rows (default: PATH, then .venv/bin)")
    p.add_argument("--seed", type=int, default=0)
    dtype_arg(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    executor_args(p)
    p.add_argument("--out", required=True, help="run folder; rerun the same command to resume after a kill")


def _design(args) -> None:
    from ..config import DesignConfig
    from .. import design

    temps = args.temperatures
    design.run(DesignConfig(target=args.target, minutes=args.minutes, wide_layers=args.wide_layers, budget=args.budget,
                            narrow_factor=args.narrow_factor, drafter=args.drafter, lookups=not args.no_lookups,
                            scheduler=not args.no_scheduler, loss=args.loss, temperatures=temps,
                            bench_suites=args.bench_suites, bench_limit=args.bench_limit,
                            refine_limit=args.refine_limit, tune_prompts=args.tune_prompts, corpus_gain=args.corpus_gain,
                            select_repeats=args.select_repeats, plan=not args.fixed_sizes,
                            max_new_tokens=args.max_new_tokens, memory=args.memory,
                            context=args.context, batch_cap=args.batch_cap, seed=args.seed,
                            rows=_list(args.rows), gguf_quants=_list(args.gguf_quants),
                            llama_server=args.llama_server,
                            dtype=args.dtype, device=args.device, threads=args.threads), args.out, executor(args),
               started=args.started)


def _list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())
