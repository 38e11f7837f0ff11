"""`draftwise design` (the whole study), `draftwise report` (its report, rendered again) and `draftwise export-gguf`."""

from __future__ import annotations

from ..config import DesignConfig, ExportGgufConfig, ReportConfig
from .command import Command, executor, executor_args, out_arg, simple, subparser


def add(sub) -> dict[str, Command]:
    p = subparser(
        sub,
        "design",
        "the whole study: candidates, prune, distill, bench, select drafter and γ*, report, export",
        DesignConfig,
    )
    executor_args(p)
    out_arg(p)
    p.add_argument(
        "--retry-died",
        action="store_true",
        help="measure again the rows whose engine died (by a signal) in an earlier run of this folder",
    )
    design = simple(DesignConfig, _design, p)
    p = subparser(sub, "report", "render a finished design folder's report again, from the folder alone", ReportConfig)
    out_arg(p, "the design's run folder")
    report = simple(ReportConfig, _report, p)
    p = subparser(
        sub, "export-gguf", "write a model as a GGUF file llama.cpp runs, with the target's tokenizer", ExportGgufConfig
    )
    out_arg(p, "the .gguf file to write")
    return {"design": design, "report": report, "export-gguf": simple(ExportGgufConfig, _export_gguf, p)}


def _design(config: DesignConfig, args) -> None:
    from .. import design

    design.run(config, args.out, executor(args), started=args.started, retry_died=args.retry_died)


def _report(config: ReportConfig, args) -> None:
    from ..design import report

    print(f"report: {report.render(args.out)}")


def _export_gguf(config: ExportGgufConfig, args) -> None:
    from ..gguf.export import export

    path = export(config.model, args.out, config.quant, config.target)
    print(f"{path} ({path.stat().st_size / 2**20:.1f} MiB)")
