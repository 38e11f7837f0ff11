"""Typed, frozen configuration of each stage, saved as `config.json` in its run folder.

A config holds everything that decides a stage's result, so a run folder can be compared, resumed and reproduced
from its config alone. Validation happens on construction and raises `DraftwiseError` with one line. Each field that is
a user option carries its help (`opt`); the `draftwise` command's parsers are derived from the fields (cli/options.py),
so an option is declared once. By concern: base (what every config shares), bench, timing (profile, sweep, predict),
train (prune, gen-data, distill, agree), feature (train-feature), teacher, quality, design (and export-gguf), serve.
"""

from __future__ import annotations

from .base import (
    BACKENDS,
    GGUF_QUANTS,
    INTEGER,
    LOSSES,
    PRECISIONS,
    all_if_zero,
    check_gguf_quant,
    check_positive,
    from_dict,
    internal,
    load,
    opt,
    to_dict,
    user_fields,
)
from .bench import (
    BASELINES,
    LLAMA_SERVER,
    PLAIN_BATCH1,
    BenchConfig,
    BenchGridConfig,
    llama_server_args,
    split_baselines,
)
from .design import DesignConfig, ExportGgufConfig, ReportConfig
from .feature import TrainFeatureConfig
from .load_test import LoadConfig
from .quality import RUNTIME_FORMS, QualityConfig, asked_activations, check_runtime
from .serve import ServeConfig
from .teacher import TeacherConfig
from .timing import PredictConfig, ProfileConfig, SweepConfig
from .train import AgreeConfig, DistillConfig, GenDataConfig, PruneConfig

__all__ = [
    "BACKENDS",
    "GGUF_QUANTS",
    "INTEGER",
    "LOSSES",
    "PRECISIONS",
    "all_if_zero",
    "check_gguf_quant",
    "check_positive",
    "from_dict",
    "internal",
    "load",
    "opt",
    "to_dict",
    "user_fields",
    "BASELINES",
    "LLAMA_SERVER",
    "PLAIN_BATCH1",
    "BenchConfig",
    "BenchGridConfig",
    "llama_server_args",
    "split_baselines",
    "DesignConfig",
    "ExportGgufConfig",
    "ReportConfig",
    "TrainFeatureConfig",
    "LoadConfig",
    "RUNTIME_FORMS",
    "QualityConfig",
    "ServeConfig",
    "TeacherConfig",
    "asked_activations",
    "check_runtime",
    "PredictConfig",
    "ProfileConfig",
    "SweepConfig",
    "AgreeConfig",
    "DistillConfig",
    "GenDataConfig",
    "PruneConfig",
]
