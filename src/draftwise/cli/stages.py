"""The stage subcommands: profile, sweep, predict, prune, agree, quality, gen-data, distill."""

from __future__ import annotations

import argparse

from ..config import GGUF_QUANTS, PRECISIONS
from . import dtype_arg, engine_args, executor, executor_args, floats, ints, model_args


def add(sub) -> dict:
    for parser in (_profile_parser, _sweep_parser, _predict_parser, _prune_parser, _agree_parser, _quality_parser,
                   _gen_data_parser, _distill_parser):
        parser(sub)
    return {"profile": _profile, "sweep": _sweep, "predict": _predict, "prune": _prune, "agree": _agree,
            "quality": _quality, "gen-data": _gen_data, "distill": _distill}


def _profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="time the target's AR step and verify passes, drafter steps and the LM head",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--drafter", action="append", default=[], help="a drafter to time (repeatable): checkpoint or layers:...")
    p.add_argument("--depths", type=ints, default=(1, 2, 4, 8, 16), help="full-width truncations of the target to time")
    p.add_argument("--gammas", type=ints, default=(1, 2, 3, 4, 6, 8, 12, 16))
    p.add_argument("--batch", type=ints, default=(1, 4, 8))
    p.add_argument("--context", type=int, default=256, help="positions in the KV cache when timing")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--compile", action="store_true", help="torch.compile the lean forward's layers (helps on GPUs)")
    model_args(p)
    executor_args(p)
    p.add_argument("--out", required=True)


def _profile(args) -> None:
    from ..config import ProfileConfig
    from ..stages import profile

    config = ProfileConfig(
        target=args.target, drafters=tuple(args.drafter), depths=args.depths, gammas=args.gammas, batches=args.batch,
        context=args.context, warmup=args.warmup, repeats=args.repeats, dtype=args.dtype, device=args.device,
        backend=args.backend, compile=args.compile, gguf_quant=args.gguf_quant, threads=args.threads,
    )
    profile.run(config, args.out, executor(args))


def _sweep_parser(sub) -> None:
    p = sub.add_parser("sweep", help="time drafter shapes: equal-budget depths, widths, target truncations",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--budget", default="15M", help="non-embedding parameters of the equal-budget shapes")
    p.add_argument("--layers", type=ints, default=(1, 2, 3, 4, 6, 8, 12, 24))
    p.add_argument("--widths", type=ints, default=(192, 384, 576, 768, 960), help="hidden sizes at --width-depth")
    p.add_argument("--width-depth", type=int, default=2)
    p.add_argument("--truncations", type=ints, default=(1, 2, 4, 8), help="full-width k-layer truncations of the target")
    p.add_argument("--vocab", type=ints, default=(0,), help="LM-head sizes to time each shape with (0 = the target's)")
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--memory", default="16GiB", help="memory budget for the largest batch beside the target")
    p.add_argument("--batch", type=ints, default=(1, 4))
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10)
    dtype_arg(p)
    p.add_argument("--device", default="cpu")
    engine_args(p, ["lean", "llama.cpp"], "lean")
    p.add_argument("--threads", type=int)
    executor_args(p)
    p.add_argument("--out", required=True)


def _sweep(args) -> None:
    from ..config import SweepConfig
    from ..stages import sweep

    config = SweepConfig(
        target=args.target, budget=args.budget, layers=args.layers, widths=args.widths, width_depth=args.width_depth,
        truncations=args.truncations, vocabs=args.vocab, context=args.context, memory=args.memory, batches=args.batch,
        warmup=args.warmup, repeats=args.repeats, dtype=args.dtype, device=args.device, backend=args.backend,
        gguf_quant=args.gguf_quant, threads=args.threads,
    )
    sweep.run(config, args.out, executor(args))


def _predict_parser(sub) -> None:
    p = sub.add_parser("predict", help="predicted tokens/s per profiled drafter and γ, ranked",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--profile", required=True, help="a profile run folder")
    p.add_argument("--bench", help="a bench run folder: measured acceptance of its drafter, and a check of the prediction")
    p.add_argument("--alpha", type=float, help="assumed i.i.d. acceptance for drafters without measured acceptance")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--gammas", type=ints, help="γ values to predict (default: the profiled ones)")
    p.add_argument("--out", help="write the predictions as JSON here")


def _predict(args) -> None:
    from ..stages import predict

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
    from ..config import PruneConfig
    from ..stages import prune

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
    p.add_argument("--gammas", type=ints, default=(1, 2, 3, 4, 5, 6, 8))
    dtype_arg(p)
    engine_args(p)
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)


def _agree(args) -> None:
    from ..config import AgreeConfig
    from ..stages import agree

    agree.run(AgreeConfig(target=args.target, drafter=args.drafter, suites=args.suites, split=args.split, limit=args.limit,
                          max_new_tokens=args.max_new_tokens, gammas=args.gammas, dtype=args.dtype, backend=args.backend,
                          gguf_quant=args.gguf_quant, threads=args.threads), args.out)


def _quality_parser(sub) -> None:
    p = sub.add_parser("quality", help="what lossy runtimes (int8, bf16, quantized GGUF) cost: top-1 agreement with "
                                       "the fp32 lean engine and NLL, teacher-forced on eval prompts",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default", help="'default', a .gguf file or a Hugging Face model directory")
    p.add_argument("--runtimes", default="lean:int8,llama.cpp",
                   help=f"comma list, each compared with the fp32 lean reference: lean:{'|'.join(PRECISIONS)}, "
                        f"llama.cpp (the target's own GGUF: Q4_1 for 'default') or llama.cpp:{'|'.join(GGUF_QUANTS)} "
                        "(the target written as GGUF at that precision)")
    p.add_argument("--suites", default="all", help="packaged suites whose eval prompts are scored: a name, a comma list "
                                                   "or 'all'")
    p.add_argument("--limit", type=int, default=24, help="eval prompts (round-robin over suites and categories)")
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="longer prompts are skipped")
    p.add_argument("--threads", type=int, help="torch (and llama.cpp) threads; unset: torch's choice")
    p.add_argument("--out", required=True, help="run folder; rerun the same command to resume")


def _quality(args) -> None:
    from ..config import QualityConfig
    from ..stages import quality

    quality.run(QualityConfig(target=args.target, runtimes=args.runtimes, suites=args.suites, limit=args.limit,
                              max_prompt_tokens=args.max_prompt_tokens, threads=args.threads), args.out)


def _gen_data_parser(sub) -> None:
    p = sub.add_parser("gen-data", help="the target's continuations of train prompts, with its top-k distribution",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default="default")
    p.add_argument("--split", default="train", choices=["train"], help="training data comes from the train split only")
    p.add_argument("--suites", default="all")
    p.add_argument("--prompts", help="extra prompts (JSONL or text); any that fall in the eval split are dropped")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperatures", type=floats, default="0,1", help="comma list: each prompt is continued at each")
    p.add_argument("--topk", type=int, default=32)
    p.add_argument("--limit", type=int, help="prompts (before temperatures multiply them)")
    p.add_argument("--skip", type=int, default=0, help="prompts passed over first (continue where another run stopped)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--shard-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int)
    p.add_argument("--out", required=True)


def _gen_data(args) -> None:
    from ..config import GenDataConfig
    from ..stages import gen_data

    temps = args.temperatures
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
    from ..config import DistillConfig
    from ..stages import distill

    distill.run(DistillConfig(target=args.target, drafter=args.drafter, data=args.data, loss=args.loss,
                              minutes=None if args.tokens else args.minutes, tokens=args.tokens, lr=args.lr,
                              batch_size=args.batch_size, grad_accum=args.grad_accum, train_embeddings=args.train_embeddings,
                              draft_vocab=args.draft_vocab,
                              on_policy_every=args.on_policy_every, eval_every=args.eval_every,
                              checkpoint_every=args.checkpoint_every, seed=args.seed, threads=args.threads), args.out)
