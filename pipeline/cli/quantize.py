"""`decision quantize`: an export's encoder at int8, with the report that says whether it may serve.

decision quantize --model runs/<key>/export              # the run folder beside it: validation and held-out rows
decision quantize --model models/vader --data rows.jsonl # the rows, halved: one half fits, the other checks
decision quantize --model models/vader --data rows.jsonl --json
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.cli.options import DATA_HELP, add_output_flags
from pipeline.cli.runner import run_command
from pipeline.cli.tables import console, progress_outputs

DESCRIPTION = (
    "Quantize the export's encoder (encoder.onnx) to int8 with ONNX Runtime's dynamic quantization, answer "
    "rows the model never trained on at fp32 and at int8, refit the calibrator (and the certificates) on the "
    "int8 answers, and write encoder.int8.onnx and int8.json into the export: argmax agreement with fp32, "
    "accuracy and ECE of both, per question and overall, and the verdict against params.yaml's quantize: "
    "bounds. `decision serve --precision auto` (the default) serves the int8 encoder only where it passes. "
    "The rows: --data (split in halves: one fits, one checks), else the run folder beside the export "
    "(its validation split fits, its held-out split checks)."
)


def add_quantize(commands) -> None:
    """`decision quantize` on the `decision` subparsers."""
    quantize = commands.add_parser(
        "quantize",
        help="an export's encoder at int8, measured against fp32 on held-out rows (docs/serving.md, Precision)",
        description=DESCRIPTION,
    )
    quantize.add_argument("--model", required=True, help="an export folder (decision export, a run's export)")
    quantize.add_argument("--data", help=f"rows to fit and check on, with gold: {DATA_HELP}")
    quantize.add_argument("--slice", metavar="START:END", help="with --data: its rows [START, END) only")
    quantize.add_argument(
        "--run-dir", help="the run folder whose split to use (default: beside the export, or EXPORT.run)"
    )
    quantize.add_argument(
        "--params", default="params.yaml", help="the params file (its quantize: and certify:)"
    )
    add_output_flags(quantize)
    quantize.set_defaults(handler=handle_quantize)


def handle_quantize(args: argparse.Namespace) -> int:
    from pipeline.config import ConfigError, load_params
    from pipeline.families.base import ModelLayoutError
    from pipeline.stages.quantize import quantize_export

    _, say = progress_outputs(args)

    def quantized():
        if not Path(args.model).is_dir():
            raise ConfigError(f"--model {args.model}: no such folder (an export folder)")
        params = load_params(args.params)
        asked = replace(params.quantize, int8=True)  # asked for by name, whatever the params' int8 says
        return quantize_export(args.model, _rows(args), asked, params.certify, say=say)

    return run_command(args, quantized, print_quantized, refused=(ModelLayoutError, FileNotFoundError))


def _rows(args: argparse.Namespace):
    """--data's rows halved, else the run folder's split (ConfigError where there is none)."""
    from pipeline.config import ConfigError
    from pipeline.data.read import RowSlice
    from pipeline.data.split import refuse_unusable
    from pipeline.data.validate import validate_file
    from pipeline.stages.quantize import halves, run_rows

    if args.data:
        validated = validate_file(args.data, RowSlice.parse(args.slice))
        refuse_unusable(args.data, validated.report)
        return halves(validated.records)
    model = Path(args.model)
    for folder in [args.run_dir] if args.run_dir else [model.parent, model.with_name(model.name + ".run")]:
        rows = run_rows(folder)
        if rows.check:
            return rows
    raise ConfigError(
        f"{args.model}: no run folder with a saved split beside it: give --data ROWS (with gold) or --run-dir"
    )


def print_quantized(result) -> None:
    """The verdict, and per question the figures against fp32 from the report."""
    import json

    from rich.table import Table

    print(
        f"{result.export_dir}: {'int8 may serve' if result.passes else 'int8 does not serve'}: {result.why}"
    )
    if not result.quantized:
        return
    report: dict[str, Any] = json.loads((Path(result.export_dir) / "int8.json").read_text())
    table = Table(title=f"int8 against fp32 on {report['measured_on']}")
    names = ("decisions", "argmax_agreement", "accuracy_fp32", "accuracy", "ece_fp32", "ece")
    table.add_column("question")
    for name in names:
        table.add_column(name, justify="right")
    for question, figures in {**report["by_question"], "overall": report["overall"]}.items():
        table.add_row(
            question, *(f"{figures[n]:,}" if n == "decisions" else f"{figures[n]:.4f}" for n in names)
        )
    console().print(table)
