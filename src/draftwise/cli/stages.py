"""The stage subcommands: profile, sweep, predict, prune, agree, quality, gen-data, teacher, distill, train-feature."""

from __future__ import annotations

from ..config import (
    AgreeConfig,
    DistillConfig,
    GenDataConfig,
    PredictConfig,
    ProfileConfig,
    PruneConfig,
    QualityConfig,
    SweepConfig,
    TeacherConfig,
    TrainFeatureConfig,
)
from . import options
from .command import Command, executor, executor_args, out_arg, run_stage, simple, subparser

# command: (config, help), in the order `draftwise --help` lists them
STAGES = {
    "profile": (ProfileConfig, "time the target's AR step and verify passes, drafter steps and the LM head"),
    "sweep": (SweepConfig, "time drafter shapes: equal-budget depths, widths, target truncations"),
    "predict": (PredictConfig, "predicted tokens/s per profiled drafter and γ, ranked"),
    "prune": (PruneConfig, "carve a drafter of an exact shape out of the target (importance or L0 masks)"),
    "agree": (AgreeConfig, "teacher-forced top-1 agreement with the target, and the greedy TAR it implies"),
    "quality": (
        QualityConfig,
        "what lossy runtimes (int8, bf16, quantized GGUF) cost: top-1 agreement with the fp32 "
        "lean engine and NLL, teacher-forced on eval prompts",
    ),
    "gen-data": (GenDataConfig, "the target's continuations of train prompts, with its top-k distribution"),
    "teacher": (
        TeacherConfig,
        "the target's top-k and features over text, teacher-forced at prefill speed (cached, resumable)",
    ),
    "distill": (DistillConfig, "train a drafter toward the target on gen-data or teacher data (resumable)"),
    "train-feature": (
        TrainFeatureConfig,
        "train a feature-level drafter (an EAGLE-style head on the target's features) on teacher data (resumable)",
    ),
}
WITH_EXECUTOR = ("profile", "sweep")  # they hand their points to an executor


def add(sub) -> dict[str, Command]:
    commands = {}
    for name, (config, help) in STAGES.items():
        p = subparser(sub, name, help, config)
        if name == "gen-data":  # kept for old command lines (a field would change saved configs for nothing)
            p.add_argument(
                "--split", default="train", choices=["train"], help="training data comes from the train split only"
            )
        if name in WITH_EXECUTOR:
            executor_args(p)
        if name == "predict":
            out_arg(p, "write the predictions as JSON here", required=False)
        else:
            out_arg(p)
        commands[name] = simple(config, _predict if name == "predict" else _run_stage, p)
    commands["distill"] = Command(DistillConfig, _distill_config, _run_stage, commands["distill"].parser)
    return commands


def _distill_config(args) -> DistillConfig:
    """`distill`'s options; with --resume-from, those left out are the source run's (`resume.settings`)."""
    from ..stages import resume

    return DistillConfig(**resume.settings(options.values(DistillConfig, args)))


def _run_stage(config, args) -> None:
    from ..stages import agree, distill, feature, gen_data, profile, prune, quality, sweep, teacher

    stage = {
        "profile": profile,
        "sweep": sweep,
        "prune": prune,
        "agree": agree,
        "quality": quality,
        "gen-data": gen_data,
        "teacher": teacher,
        "distill": distill,
        "train-feature": feature,
    }[args.command]
    made = executor(args) if args.command in WITH_EXECUTOR and args.executor != "inprocess" else None
    run_stage(stage.run, config, args, made)


def _predict(config: PredictConfig, args) -> None:
    from ..stages import predict

    predict.run(config.profile, config.bench, config.alpha, config.batch, list(config.gammas) or None, args.out)
