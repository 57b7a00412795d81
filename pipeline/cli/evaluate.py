"""`decision evaluate`: a model's metrics on decision rows, per question type, with its calibration report
and, on request, reliability and confusion plots and split-conformal prediction sets.

decision evaluate --model models/vader-minilm --data data/processed/vader.jsonl --plots plots/
decision evaluate --model models:/decision-model@champion --data new.parquet --conformal 0.1 --json
"""

from __future__ import annotations

import argparse
from typing import Any

from pipeline.cli.mapping_flags import add_mapping_arguments, loaded_mapping, mapping_value
from pipeline.cli.options import (
    DATA_HELP,
    MISCOVERAGE,
    SCORING_DEVICE_HELP,
    add_output_flags,
    device_option,
    plots_folder,
)
from pipeline.cli.runner import run_command
from pipeline.cli.tables import console, progress_outputs
from pipeline.config import SERVING_PRECISIONS

DESCRIPTION = (
    "Score every usable decision of DATA with MODEL (its calibrator applied, as served): accuracy per "
    "decision and per record, ECE (15 bins, (lo, hi]), Brier, KL from soft gold, score MAE, per question "
    "type and overall; then the calibration report (NLL, ECE-15 with a 95% record-bootstrap interval, "
    "classwise ECE, per type and per question); what its certificates automate (coverage and realised error "
    "with 95% intervals, per question and overall; 'not certified' for a model without certificates); "
    "--plots DIR writes reliability diagrams (all, per type) and a confusion matrix per question; "
    "--conformal ALPHA adds split-conformal prediction sets."
)


def add_evaluate(commands) -> None:
    """`decision evaluate` on the `decision` subparsers."""
    evaluate = commands.add_parser(
        "evaluate",
        help="metrics of a model on decision rows, per question type, with reliability and confusion plots",
        description=DESCRIPTION,
    )
    evaluate.add_argument(
        "--model",
        required=True,
        help="an export of any family (Laya layout or joint), a fine-tune folder, or a registered version: "
        "models:/NAME@ALIAS or models:/NAME/VERSION",
    )
    evaluate.add_argument("--data", required=True, help=DATA_HELP)
    evaluate.add_argument("--slice", metavar="START:END", help="evaluate rows [START, END) only")
    evaluate.add_argument("--plots", metavar="DIR", type=plots_folder, help="write PNG plots here")
    evaluate.add_argument("--device", default="cpu", type=device_option, help=SCORING_DEVICE_HELP)
    evaluate.add_argument(
        "--precision",
        choices=SERVING_PRECISIONS,
        default="fp32",
        help="as decision serve --precision: fp32 (default), bf16 autocast, int8 (the export's int8 encoder "
        "with its own calibrator and certificates; refused where its int8 report fails its bounds) or auto",
    )
    evaluate.add_argument(
        "--conformal",
        type=MISCOVERAGE,
        metavar="ALPHA",
        help="add split-conformal prediction sets at miscoverage ALPHA (e.g. 0.1): coverage and mean set "
        "size per type",
    )
    add_output_flags(evaluate)
    add_mapping_arguments(evaluate)
    evaluate.set_defaults(handler=handle_evaluate)


def handle_evaluate(args: argparse.Namespace) -> int:
    from pipeline.data.read import RowSlice
    from pipeline.stages.evaluate import evaluate_model

    bars, say = progress_outputs(args)

    def evaluated() -> dict[str, Any]:
        mapping = loaded_mapping(mapping_value(args))
        return evaluate_model(
            args.model,
            args.data,
            args.plots,
            RowSlice.parse(args.slice),
            args.device,
            progress=bars,
            conformal=args.conformal,
            report=say,
            mapping=mapping,
            precision=args.precision,
        ).to_dict()

    # ValueError: a model's layout, a source, a slice, a mapping (exit_code: the user's input 2, else 1).
    return run_command(
        args, evaluated, print_evaluation, refused=(FileNotFoundError, ValueError), as_json=dict
    )


def print_evaluation(report: dict[str, Any]) -> None:
    """Metrics per type, the calibration report, conformal sets and the plots written."""
    from rich.table import Table

    from pipeline.scoring.report import report_table

    model = report["model"]
    if model.startswith("models:/"):  # the version an alias points at now
        model = f"{model} ({report['served_as']})"
    table = Table(
        title=f"{model} on {report['data']} ({report['metrics']['overall']['decisions']:,} decisions)"
    )
    names = ("accuracy", "record_accuracy", "ece", "brier", "kl_soft", "score_mae")
    table.add_column("type")
    for name in names:
        table.add_column(name, justify="right")
    for kind, metrics in report["metrics"].items():
        table.add_row(kind, *(f"{metrics[n]:.4f}" for n in names))
    console().print(table)
    if report["calibration"]:
        print(
            "\ncalibration report (ECE-15 interval: 95% record bootstrap)\n"
            + report_table(report["calibration"])
        )
    if report.get("automation") is not None:
        print_automation(report["automation"], "certified automation")
    if "conformal" in report:
        print_conformal(report["conformal"])
    print("plots: " + (", ".join(report["plots"]) or "none (use --plots DIR)"))


def print_conformal(conformal: dict) -> None:
    """Coverage and mean set size per type of split-conformal prediction sets."""
    print(
        f"\nsplit-conformal prediction sets, alpha {conformal['alpha']} (target coverage "
        f"{conformal['target_coverage']:.2f}; calibrated on one half of the records, measured on the other):"
    )
    for name, figures in conformal["by_type"].items():
        print(
            f"  {name:7s} coverage {figures['coverage']:.4f}, mean set size {figures['mean_set_size']:.2f} "
            f"of {figures['mean_options']:.2f} options ({figures['decisions']} decisions)"
        )


AUTOMATION_COLUMNS = (
    "question",
    "certified",
    "threshold",
    "decisions",
    "automated",
    "coverage [95%]",
    "realised error [95%]",
    "ε",
)


def print_automation(automation: dict[str, Any], title: str) -> None:
    """What a model's certificates automate on the rows, per question and overall (`all`), with 95%
    Clopper-Pearson intervals; one line for a model without certificates."""
    from rich.table import Table

    if not automation["certified"]:
        overall = automation["overall"]
        console().print(
            f"{title}: not certified (no certificates in the export): coverage 0 of "
            f"{overall['decisions']:,} decisions",
            highlight=False,
        )
        return
    table = Table(title=f"{title} (95% Clopper-Pearson intervals)")
    for column in AUTOMATION_COLUMNS:
        table.add_column(column, justify="left" if column in ("question", "certified") else "right")
    rows = [*automation["by_question"].items(), ("all", automation["overall"] | {"certified": None})]
    for question, figures in rows:
        certified = {True: "yes", False: "not certified", None: ""}[figures["certified"]]
        threshold = figures.get("threshold")
        table.add_row(
            question,
            certified,
            "-" if threshold is None else f"{threshold:.4f}",
            f"{figures['decisions']:,}",
            f"{figures['automated']:,}",
            coverage_text(figures),
            error_text(figures),
            "-" if figures["target_error"] is None else f"{figures['target_error']:g}",
        )
    console().print(table)


def coverage_text(figures: dict[str, Any]) -> str:
    """`0.620 [0.571, 0.667]`: the share automated with its interval."""
    return f"{figures['coverage']:.3f} [{figures['coverage_low']:.3f}, {figures['coverage_high']:.3f}]"


def error_text(figures: dict[str, Any]) -> str:
    """`0.031 [0.018, 0.050]`: the error among the automated answers with its interval; `-` with none."""
    if figures["error"] is None:
        return "-"
    return f"{figures['error']:.3f} [{figures['error_low']:.3f}, {figures['error_high']:.3f}]"
