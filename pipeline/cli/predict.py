"""`decision predict`: batch scoring of a decision file with a served model, into Parquet.

decision predict --model models/vader-minilm --data data/new.jsonl --out scores.parquet
decision predict --model models:/decision-model@champion --data new.parquet --out scores.parquet --json
decision predict --model models/tickets --data new.csv --mapping configs/tickets.mapping.yaml --out s.parquet
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.cli.launch import launch_flow
from pipeline.cli.mapping_flags import BadMappingFlags, add_mapping_arguments, loaded_mapping, mapping_value
from pipeline.cli.options import AT_LEAST_ONE, SCORING_DEVICE_HELP, device_option, load_run_params
from pipeline.cli.runner import EXIT_INTERRUPTED, EXIT_OK, input_errors, refuse, run_command
from pipeline.cli.tables import progress_outputs
from pipeline.config import SERVING_PRECISIONS
from pipeline.interrupts import terminate_as_interrupt
from pipeline.strict_json import to_json


def handle_predict(args: argparse.Namespace) -> int:
    from pipeline.stages.predict import dated

    if args.model is None and args.run_config is None:
        return refuse(args, "say which model: --model DIR|models:/NAME@ALIAS, or --run-config NAME")
    args.out = dated(args.out)
    if (problem := out_file_problem(Path(args.out), args.data)) is not None:
        return refuse(args, problem)
    if args.flow:
        return _predict_as_flow(args)
    return run_command(
        args,
        lambda: _predicted(args),
        lambda result: print(_summary_line(result.to_dict())),
        refused_input=_refused_inputs(),
        done=lambda result: _scored_any(args, result.scored, result.failed, args.out),
        interrupted=f"interrupted; {args.out} was not written",
    )


def _predicted(args: argparse.Namespace):
    from pipeline.stages.predict import predict_stage

    bars, say = progress_outputs(args)
    model, value = _model_and_mapping(args)
    mapping = loaded_mapping(value)
    with terminate_as_interrupt():
        return predict_stage(
            model,
            args.data,
            args.out,
            args.batch_size,
            args.device,
            args.precision,
            progress=bars,
            report=say,
            mapping=mapping,
        )


def _predict_as_flow(args: argparse.Namespace) -> int:
    """The same scoring as the Prefect `batch-predict` flow in its own process (a flow run with its artifact,
    as its deployment runs it), its inputs checked first: one line and exit 2 before a flow run starts."""
    from pipeline.config import ConfigError
    from pipeline.stages.predict import check_inputs

    try:
        model, value = _model_and_mapping(args)
        mapping = loaded_mapping(value)
        if args.precision != "fp32":
            raise ConfigError("--precision with --flow: the batch-predict flow scores at fp32")
        check_inputs(model, args.data, mapping)
    except (*_refused_inputs(), *input_errors()) as error:
        return refuse(args, error)
    except KeyboardInterrupt:  # while the model was looked up: no flow started, nothing written
        return refuse(args, f"interrupted; {args.out} was not written", EXIT_INTERRUPTED)
    parameters = {
        "data": args.data,
        "model": model,
        "out": args.out,
        "batch_size": args.batch_size,
        "device": args.device,
        "mapping": value,
    }
    launched = launch_flow("flows.batch_predict", parameters, args.quiet)
    if launched.result is None:
        return launched.code
    result = launched.result
    print(to_json(result) if args.json else _summary_line(result))
    scored = _scored_any(args, result["scored"], result["failed"], result["out"])
    return launched.code if scored == EXIT_OK else scored


def _refused_inputs() -> tuple[type[Exception], ...]:
    """What makes predict refuse its input (exit 2) besides `input_errors`: a source, a model's layout, a
    precision the device lacks, mapping flags that make no mapping."""
    from pipeline.data.read import UnreadableInput
    from pipeline.device import PrecisionUnavailable
    from pipeline.families.base import ModelLayoutError

    return (UnreadableInput, ModelLayoutError, PrecisionUnavailable, BadMappingFlags)


def _scored_any(args: argparse.Namespace, scored: int, failed: dict[str, int], out: str) -> int:
    """Exit 2 where no row was scored: a file of refusals only is no result."""
    if scored == 0:
        return refuse(args, nothing_scored(args.data, out, failed))
    return EXIT_OK


def out_file_problem(out: Path, data: str) -> str | None:
    """Why the scores must not go to `out` (checked before any model loads), or None: it is the data being
    scored or lies in its folder of shards, it is a folder, or in a place no file can be written."""
    from pipeline.data.sources import written_into

    if clash := written_into(out, data):
        return f"--out {out}: {clash}; write the scores to another file"
    if out.is_dir():
        return f"--out {out}: a folder; give the Parquet file to write, e.g. {out / 'scores.parquet'}"
    if out.suffix.lower() != ".parquet":  # a .csv or .jsonl name would hold Parquet bytes
        return (
            f"--out {out}: the scores are written as Parquet; give a .parquet file, e.g. "
            f"{out.with_suffix('.parquet')}"
        )
    from pipeline.families.base_folders import unwritable_place

    unwritable = unwritable_place(out)  # the stage makes the folders above it that are missing
    return f"--out {out}: {unwritable}" if unwritable else None


def _model_and_mapping(args: argparse.Namespace) -> tuple[str, str | dict | None]:
    """--model and the mapping the flags say; --run-config NAME fills what they leave out: the champion of the
    model the run registers, and the run's `validate.mapping` (the mapping `decision init` recorded)."""
    value = mapping_value(args)
    if args.run_config is None:
        return args.model, value
    params = load_run_params(args.run_config)
    model = args.model or f"models:/{params.retrain.model_name}@champion"
    return model, value if value is not None else params.validate.mapping


def refusal_counts(failed: dict[str, int]) -> str:
    """Refused rows by reason, as words (`missing_state 3, too_long 1`), or none."""
    return ", ".join(f"{reason} {n}" for reason, n in failed.items()) or "none"


def nothing_scored(data: str, out: str, failed: dict[str, int]) -> str:
    """Why a run that scored no row is exit 2: a file of refusals only is no result."""
    return f"no row of {data} could be scored ({refusal_counts(failed)}); each row's reason is in {out}"


def _summary_line(summary: dict) -> str:
    failed = refusal_counts(summary["failed"])
    return (
        f"{summary['out']}: {summary['rows']} rows, {summary['scored']} scored by {summary['model']}, "
        f"refused: {failed}; {summary['seconds']:.1f} s ({summary['rows_per_second']} rows/s)"
    )


DESCRIPTION = (
    "Answer every row of DATA as the Decision API would (its parsing, its model, its calibration), "
    "BATCH_SIZE requests per forward pass, reading and writing a chunk at a time. OUT gets one row per "
    "source row, in order: row, row_id (the id, row_id or decision_id column, else the row's index), "
    "answers (the API's JSON), input_tokens, error (a reason code, e.g. bad_criteria or missing_state) and "
    "error_message for a row that cannot be scored, and <question>.label and <question>.confidence per "
    "question of the first readable row. A plain table is read through the mapping its model was trained "
    "with (--mapping FILE or the same flags): only its state and id columns are read, label columns need "
    "not be there and are ignored; row_id is the mapping's id column, else the row's index; options the "
    "mapping takes from the labels are the ones the model records it trained with. OUT is written whole or "
    "not at all. Exit 2 for a bad model, source or mapping (a column DATA lacks, options nothing gives), "
    "before anything is scored, or when no row is scored."
)


def add_predict(commands) -> None:
    """`decision predict` on the `decision` subparsers."""
    predict = commands.add_parser(
        "predict",
        help="score the rows of a decision file, or of a plain table through a mapping (no gold needed), "
        "with a served model into a Parquet file",
        description=DESCRIPTION,
    )
    _add_inputs(predict)
    predict.add_argument(
        "--batch-size", type=AT_LEAST_ONE, default=64, help="requests per call of the model (default 64)"
    )
    predict.add_argument("--device", default="cpu", type=device_option, help=SCORING_DEVICE_HELP)
    predict.add_argument(
        "--precision",
        choices=SERVING_PRECISIONS,
        default="fp32",
        help="as decision serve --precision: fp32 (default), bf16 autocast, int8 (the export's int8 encoder "
        "and its own calibrator; refused where its int8 report fails its bounds) or auto",
    )
    predict.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object on stdout (progress stays on stderr)",
    )
    predict.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    predict.add_argument(
        "--flow",
        action="store_true",
        help="run it as the Prefect batch-predict flow (a flow run with its refused-rows artifact, as its "
        "deployment runs it), in its own process",
    )
    add_mapping_arguments(predict)
    predict.set_defaults(handler=handle_predict)


def _add_inputs(predict: argparse.ArgumentParser) -> None:
    """Which model scores which rows, into which file."""
    predict.add_argument(
        "--model", help="an export folder (decision export / finetune) or models:/NAME@ALIAS"
    )
    predict.add_argument(
        "--run-config",
        metavar="NAME",
        help="a run decision init set up (configs/NAME.yaml): its model's champion unless --model says "
        "otherwise, and its validate.mapping unless --mapping or the flags do",
    )
    predict.add_argument(
        "--data",
        required=True,
        help="decision rows (gold optional), or a plain table with --mapping or the mapping flags: a .jsonl, "
        ".parquet or .csv file, a folder or glob of shards, a save_to_disk folder or hf:OWNER/NAME "
        "(docs/data-format.md, Sources)",
    )
    predict.add_argument(
        "--out",
        required=True,
        help="the Parquet file to write, e.g. scores.parquet; {date} becomes today's date (UTC)",
    )
