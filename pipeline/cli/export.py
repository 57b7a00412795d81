"""`decision export`: a fine-tune merged into one servable, self-describing folder of its family, crash-safe.

decision export --adapter models/tuned --out models/vader-minilm
decision export --adapter models/tuned --out models/vader-minilm --json      # {"out", "written", "manifest"}
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

from pipeline.cli.options import add_json_flag, model_out
from pipeline.cli.runner import run_command

DESCRIPTION = (
    "Merge LoRA adapters into a copy of the base on the CPU, check every tensor is finite, write fp16 "
    "weights, temperatures and a lineage manifest into a staging folder and swap it in atomically (the "
    "family's marker file last). Exporting the same source again is a no-op."
)


def add_export(commands) -> None:
    """`decision export` on the `decision` subparsers."""
    export = commands.add_parser(
        "export",
        help="merge a fine-tune into one servable, self-describing folder of its family, crash-safe",
        description=DESCRIPTION,
    )
    export.add_argument("--adapter", required=True, help="a LoRA fine-tune folder, or a full model folder")
    export.add_argument("--out", required=True, type=model_out, help="the export folder")
    add_json_flag(export)
    export.set_defaults(handler=handle_export)


def handle_export(args: argparse.Namespace) -> int:
    from pipeline.families.base import ModelLayoutError
    from pipeline.families.exporting import NonFiniteWeights
    from pipeline.stages.export import export_folder

    return run_command(
        args,
        lambda: export_folder(args.adapter, args.out),
        print_exported,
        refused=(ModelLayoutError, NonFiniteWeights, FileNotFoundError),
        as_json=asdict,
    )


def print_exported(result) -> None:
    """Where the export went, or that it was there already."""
    print(
        f"exported to {result.out}"
        if result.written
        else f"{result.out} is already this export; nothing to do"
    )
