"""The `draftwise` command: parses arguments into a stage config and dispatches; no logic of its own."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

from .errors import DraftwiseError


def _bench_parser(sub) -> None:
    p = sub.add_parser("bench", help="speculative decoding with a drafter vs baselines, same prompts, same process",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default", help="'default', a local HF model directory or a .gguf file")
    p.add_argument("--drafter", action="append", default=[],
                   help="a checkpoint directory, a .gguf file, layers:i,j,..., random:..., ngram[:...], suffix[:DIR,...] or "
                        "hybrid:MODEL+LOOKUP (repeat for a grid; SPEC@γ gives that drafter its own γ)")
    p.add_argument("--gamma", type=_ints, default=(4,), help="lookahead: tokens drafted per round (a comma list: a grid)")
    p.add_argument("--draft-stop", type=float, default=0.0,
                   help="adaptive lookahead: stop a round's drafting once the drafter's probability of its token is below this")
    p.add_argument("--temperature", type=_floats, default=(0.0,), help="0 = greedy (a comma list: a grid)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--suite", default="spec_bench", help="packaged suite(s): a name, a comma list or 'all'")
    p.add_argument("--split", default="eval", choices=["train", "eval", "all"])
    p.add_argument("--prompts", help="your own prompts: JSONL (prompt or turns per line) or text, one per line")
    p.add_argument("--limit", type=int, default=10, help="number of prompts, spread over categories (0 = all)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--baseline", default="ar",
                   help="comma list of ar, hf-generate, hf-assisted, hf-prompt-lookup ('' for none)")
    p.add_argument("--batch-size", type=_ints, default=(1,),
                   help="prompts decoded together (batched SD and AR; a comma list: a grid)")
    p.add_argument("--synthetic-alpha", type=float,
                   help="accept each drafted token with this probability instead of testing it: measures system cost "
                        "for random-weight shapes (not lossless)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs of each method before measuring")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--backend", default="auto", choices=["auto", "lean", "transformers"])
    p.add_argument("--compile", action="store_true", help="torch.compile the lean forward's layers (helps on GPUs)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    _executor_args(p)
    p.add_argument("--out", required=True, help="run folder (rerun on the same folder to resume)")


def _bench(args) -> None:
    from .config import BenchConfig, BenchGridConfig
    from .stages import bench, bench_grid

    config = BenchConfig(
        target=args.target, drafter=_own_gamma((args.drafter or [None])[0])[0] if args.drafter else None,
        gamma=args.gamma[0], draft_stop=args.draft_stop,
        temperature=args.temperature[0], top_p=args.top_p,
        suite=args.suite, split=args.split, prompts=args.prompts, limit=args.limit or None,
        max_new_tokens=args.max_new_tokens, baselines=tuple(b for b in args.baseline.split(",") if b),
        batch_size=args.batch_size[0], synthetic_alpha=args.synthetic_alpha,
        seed=args.seed, warmup=args.warmup, dtype=args.dtype, device=args.device, backend=args.backend,
        compile=args.compile, threads=args.threads,
    )
    axes = (args.drafter, args.gamma, args.temperature, args.batch_size)
    own = [_own_gamma(d) for d in args.drafter]  # SPEC@γ: that drafter at its own γ
    if any(g for _, g in own):
        if not all(g for _, g in own):
            raise DraftwiseError("give every --drafter its own γ (SPEC@γ), or none")
        grid = BenchGridConfig(bench=replace(config, drafter=own[0][0], gamma=own[0][1]), drafters=tuple(d for d, _ in own),
                               drafter_gammas=tuple(g for _, g in own), temperatures=args.temperature,
                               batch_sizes=args.batch_size)
        bench_grid.run(grid, args.out, _executor(args))
    elif all(len(a) <= 1 for a in axes):
        bench.run(config, args.out, _executor(args))
    else:
        grid = BenchGridConfig(bench=config, drafters=tuple(args.drafter), gammas=args.gamma, temperatures=args.temperature,
                               batch_sizes=args.batch_size)
        bench_grid.run(grid, args.out, _executor(args))


def _own_gamma(spec: str) -> tuple[str, int | None]:
    head, at, tail = spec.rpartition("@")
    return (head, int(tail)) if at and tail.isdigit() else (spec, None)


def _executor_args(p) -> None:
    p.add_argument("--executor", default="inprocess", choices=["inprocess", "ray"],
                   help="where the points run: here, one after another, or as Ray tasks (pip install 'draftwise[ray]')")
    p.add_argument("--ray-address", help="an existing Ray cluster (default with --executor ray: start a local one)")


def _executor(args):
    from .executors import make

    return make(args.executor, args.ray_address)


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None


def _model_args(p) -> None:
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--backend", default="auto", choices=["auto", "lean", "transformers"])
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")


def _profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="time the target's AR step and verify passes, drafter steps and the LM head",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", action="append", default=[], help="a drafter to time (repeatable): checkpoint or layers:...")
    p.add_argument("--depths", type=_ints, default=(1, 2, 4, 8, 16), help="full-width truncations of the target to time")
    p.add_argument("--gammas", type=_ints, default=(1, 2, 3, 4, 6, 8, 12, 16))
    p.add_argument("--batch", type=_ints, default=(1, 4, 8))
    p.add_argument("--context", type=int, default=256, help="positions in the KV cache when timing")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--compile", action="store_true", help="torch.compile the lean forward's layers (helps on GPUs)")
    _model_args(p)
    _executor_args(p)
    p.add_argument("--out", required=True)


def _profile(args) -> None:
    from .config import ProfileConfig
    from .stages import profile

    config = ProfileConfig(
        target=args.target, drafters=tuple(args.drafter), depths=args.depths, gammas=args.gammas, batches=args.batch,
        context=args.context, warmup=args.warmup, repeats=args.repeats, dtype=args.dtype, device=args.device,
        backend=args.backend, compile=args.compile, threads=args.threads,
    )
    profile.run(config, args.out, _executor(args))


def _sweep_parser(sub) -> None:
    p = sub.add_parser("sweep", help="time drafter shapes: equal-budget depths, widths, target truncations",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--budget", default="15M", help="non-embedding parameters of the equal-budget shapes")
    p.add_argument("--layers", type=_ints, default=(1, 2, 3, 4, 6, 8, 12, 24))
    p.add_argument("--widths", type=_ints, default=(192, 384, 576, 768, 960), help="hidden sizes at --width-depth")
    p.add_argument("--width-depth", type=int, default=2)
    p.add_argument("--truncations", type=_ints, default=(1, 2, 4, 8), help="full-width k-layer truncations of the target")
    p.add_argument("--vocab", type=_ints, default=(0,), help="LM-head sizes to time each shape with (0 = the target's)")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--memory", default="16GiB", help="memory budget for the largest batch beside the target")
    p.add_argument("--batch", type=_ints, default=(1, 4))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int)
    _executor_args(p)
    p.add_argument("--out", required=True)


def _sweep(args) -> None:
    from .config import SweepConfig
    from .stages import sweep

    config = SweepConfig(
        target=args.target, budget=args.budget, layers=args.layers, widths=args.widths, width_depth=args.width_depth,
        truncations=args.truncations, vocabs=args.vocab, context=args.context, memory=args.memory, batches=args.batch,
        warmup=args.warmup, repeats=args.repeats, dtype=args.dtype, device=args.device, threads=args.threads,
    )
    sweep.run(config, args.out, _executor(args))


def _predict_parser(sub) -> None:
    p = sub.add_parser("predict", help="predicted tokens/s per profiled drafter and γ, ranked",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--profile", required=True, help="a profile run folder")
    p.add_argument("--bench", help="a bench run folder: measured acceptance of its drafter, and a check of the prediction")
    p.add_argument("--alpha", type=float, help="assumed i.i.d. acceptance for drafters without measured acceptance")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--gammas", type=_ints, help="γ values to predict (default: the profiled ones)")
    p.add_argument("--out", help="write the predictions as JSON here")


def _predict(args) -> None:
    from .stages import predict

    predict.run(args.profile, args.bench, args.alpha, args.batch, list(args.gammas) if args.gammas else None, args.out)


def _prune_parser(sub) -> None:
    p = sub.add_parser("prune", help="carve a drafter of an exact shape out of the target (importance or L0 masks)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--shape", default="", help="layers=3,hidden=576,heads=9,kv_heads=3,ffn=1536 (left out: the target's)")
    p.add_argument("--method", default="importance", choices=["importance", "l0"])
    p.add_argument("--calib-tokens", type=int, default=2048, help="target-generated tokens from the train split")
    p.add_argument("--calib-suites", default="all")
    p.add_argument("--max-new-tokens", type=int, default=64, help="per calibration continuation")
    p.add_argument("--l0-steps", type=int, default=60)
    p.add_argument("--layer-criterion", default="tvd", choices=["tvd", "kl"], help="what layer elimination minimises")
    p.add_argument("--draft-vocab", type=int, default=0, help="also write reduced/: the head cut to the N hottest tokens")
    p.add_argument("--vocab-data", help="gen-data run folder whose token frequencies choose the draft vocabulary")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)


def _prune(args) -> None:
    from .config import PruneConfig
    from .stages import prune

    prune.run(PruneConfig(target=args.target, shape=args.shape, method=args.method, calib_tokens=args.calib_tokens,
                          calib_suites=args.calib_suites, max_new_tokens=args.max_new_tokens, l0_steps=args.l0_steps,
                          layer_criterion=args.layer_criterion, draft_vocab=args.draft_vocab, vocab_data=args.vocab_data,
                          seed=args.seed, threads=args.threads), args.out)


def _agree_parser(sub) -> None:
    p = sub.add_parser("agree", help="teacher-forced top-1 agreement with the target, and the greedy TAR it implies",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", required=True)
    p.add_argument("--suites", default="all")
    p.add_argument("--split", default="eval", choices=["train", "eval"])
    p.add_argument("--limit", type=int, default=60, help="prompts (round-robin over suites and categories)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gammas", type=_ints, default=(1, 2, 3, 4, 5, 6, 8))
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)


def _agree(args) -> None:
    from .config import AgreeConfig
    from .stages import agree

    agree.run(AgreeConfig(target=args.target, drafter=args.drafter, suites=args.suites, split=args.split, limit=args.limit,
                          max_new_tokens=args.max_new_tokens, gammas=args.gammas, threads=args.threads), args.out)


def _gen_data_parser(sub) -> None:
    p = sub.add_parser("gen-data", help="the target's continuations of train prompts, with its top-k distribution",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--split", default="train", choices=["train"], help="training data comes from the train split only")
    p.add_argument("--suites", default="all")
    p.add_argument("--prompts", help="extra prompts (JSONL or text); any that fall in the eval split are dropped")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperatures", default="0,1", help="comma list: each prompt is continued at each")
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("--limit", type=int, help="prompts (before temperatures multiply them)")
    p.add_argument("--skip", type=int, default=0, help="prompts passed over first (continue where another run stopped)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--shard-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)


def _gen_data(args) -> None:
    from .config import GenDataConfig
    from .stages import gen_data

    try:
        temps = tuple(float(t) for t in args.temperatures.split(",") if t.strip())
    except ValueError:
        raise DraftwiseError(f"--temperatures takes numbers, got {args.temperatures!r}") from None
    gen_data.run(GenDataConfig(target=args.target, suites=args.suites, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                               temperatures=temps, topk=args.topk, limit=args.limit, skip=args.skip, batch_size=args.batch_size,
                               shard_size=args.shard_size, seed=args.seed, threads=args.threads), args.out)


def _distill_parser(sub) -> None:
    p = sub.add_parser("distill", help="train a drafter toward the target on gen-data (resumable)",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", required=True, help="checkpoint, prune run folder, or layers:...")
    p.add_argument("--data", required=True, help="a gen-data run folder")
    p.add_argument("--loss", default="tvd", choices=["fkl", "rkl", "tvd", "jsd"])
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--minutes", type=float, default=10.0)
    budget.add_argument("--tokens", type=int, help="budget in trained positions instead of minutes (deterministic)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--train-embeddings", action="store_true", help="also train the embedding / LM head")
    p.add_argument("--draft-vocab", type=int, default=0, help="also write reduced/: the head cut to the N hottest tokens of --data")
    p.add_argument("--on-policy-every", type=int, default=0, help="every n-th step on-policy (0 = off)")
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--checkpoint-every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True, help="run folder; rerun the same command to resume after a kill")


def _distill(args) -> None:
    from .config import DistillConfig
    from .stages import distill

    distill.run(DistillConfig(target=args.target, drafter=args.drafter, data=args.data, loss=args.loss,
                              minutes=None if args.tokens else args.minutes, tokens=args.tokens, lr=args.lr,
                              batch_size=args.batch_size, grad_accum=args.grad_accum, train_embeddings=args.train_embeddings,
                              draft_vocab=args.draft_vocab,
                              on_policy_every=args.on_policy_every, eval_every=args.eval_every,
                              checkpoint_every=args.checkpoint_every, seed=args.seed, threads=args.threads), args.out)


def _design_parser(sub) -> None:
    p = sub.add_parser("design", help="the whole study: candidates, prune, distill, bench, select drafter and γ*, report, export",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--minutes", type=float, default=30.0, help="sizes data generation and distillation (the rest is fixed)")
    p.add_argument("--budget", default="", help="drafters' non-embedding parameters (default: the target's first 2 layers')")
    p.add_argument("--wide-layers", type=_ints, default=(),
                   help="override the cost model's shapes: k full-width layers and their deep-narrow twin")
    p.add_argument("--narrow-factor", type=int, default=3, help="deep-narrow twin: layers x f, heads/KV/FFN / f")
    p.add_argument("--drafter", help="your own drafter, benchmarked beside the candidates")
    p.add_argument("--no-lookups", action="store_true", help="model drafters only (no n-gram, suffix or hybrid candidates)")
    p.add_argument("--loss", default="fkl", choices=["fkl", "rkl", "tvd", "jsd"])
    p.add_argument("--temperatures", default="0,0.5,1")
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    _executor_args(p)
    p.add_argument("--out", required=True, help="run folder; rerun the same command to resume after a kill")


def _design(args) -> None:
    from .config import DesignConfig
    from .stages import design

    try:
        temps = tuple(float(t) for t in args.temperatures.split(",") if t.strip())
    except ValueError:
        raise DraftwiseError(f"--temperatures takes numbers, got {args.temperatures!r}") from None
    design.run(DesignConfig(target=args.target, minutes=args.minutes, wide_layers=args.wide_layers, budget=args.budget,
                            narrow_factor=args.narrow_factor, drafter=args.drafter, lookups=not args.no_lookups,
                            loss=args.loss, temperatures=temps, bench_suites=args.bench_suites, bench_limit=args.bench_limit,
                            refine_limit=args.refine_limit, tune_prompts=args.tune_prompts, corpus_gain=args.corpus_gain,
                            select_repeats=args.select_repeats,
                            max_new_tokens=args.max_new_tokens, memory=args.memory,
                            context=args.context, batch_cap=args.batch_cap, seed=args.seed,
                            dtype=args.dtype, device=args.device, threads=args.threads), args.out, _executor(args))


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a model hub
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = argparse.ArgumentParser(prog="draftwise", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _bench_parser(sub)
    _profile_parser(sub)
    _sweep_parser(sub)
    _predict_parser(sub)
    _prune_parser(sub)
    _agree_parser(sub)
    _gen_data_parser(sub)
    _distill_parser(sub)
    _design_parser(sub)
    args = parser.parse_args(argv)
    commands = {"bench": _bench, "profile": _profile, "sweep": _sweep, "predict": _predict, "prune": _prune, "agree": _agree,
                "gen-data": _gen_data, "distill": _distill, "design": _design}
    try:
        commands[args.command](args)
    except DraftwiseError as e:
        print(f"draftwise: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
