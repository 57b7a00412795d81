"""The `batch-predict` Prefect flow: score a decision file with a served model into Parquet (`decision predict` as a
flow), on demand or on the schedule of its deployment in `prefect.yaml` (off until a user turns it on).

One task calls the predict stage (`pipeline.stages.predict`); the run's artifact is the count of refused rows by
reason. `{date}` in `out` becomes the run's date (UTC), so a scheduled run writes a file of its own and never
overwrites yesterday's.

    python -m flows.batch_predict --data data/new.jsonl            # the champion, into predictions/<date>.parquet
    python -m flows.batch_predict --data new.parquet --model models/vader-minilm --out scores.parquet --json
    python -m flows.batch_predict --data new_tickets.csv --model models:/tickets@champion --mapping configs/tickets.mapping.yaml
    prefect deployment run batch-predict/batch-predict --param data=data/new.parquet
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from flows.interrupts import stoppable_run
from pipeline.cli.data import BadMappingFlags, add_mapping_arguments, mapping_value
from pipeline.cli.predict import nothing_scored, out_file_problem, refusal_counts
from pipeline.cli.tables import AT_LEAST_ONE, device_option, quiet_libraries
from pipeline.data.mapping import MappingError, load_mapping
from pipeline.data.read import UnreadableInput
from pipeline.families.base import ModelLayoutError
from pipeline.mlops.registry import RegistryError
from pipeline.stages.predict import check_inputs, predict_stage

DEFAULT_MODEL = "models:/decision-model@champion"


@task(name="predict")
def predict(model: str, data: str, out: str, batch_size: int, device: str,
            mapping: str | dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    read_as = load_mapping(mapping) if mapping is not None else None
    result = predict_stage(
        model, data, out, batch_size, device, mapping=read_as, report=get_run_logger().info
    )
    rows = [{"reason": reason, "rows": n} for reason, n in result.failed.items()]
    create_table_artifact(rows or [{"reason": "(none)", "rows": 0}], key="refused-rows",
                          description=f"{result.scored} of {result.rows} rows scored into {result.out}")  # fmt: skip
    return result.to_dict()


def dated(out: str, today: dt.date | None = None) -> str:
    """`out` with `{date}` replaced by the date (today, UTC): each scheduled run writes its own file."""
    return out.replace("{date}", (today or dt.datetime.now(dt.UTC).date()).isoformat())


@flow(name="batch-predict", log_prints=True)
def batch_predict(
    data: str,
    model: str = DEFAULT_MODEL,
    out: str = "predictions/{date}.parquet",
    batch_size: int = 64,
    device: str = "cpu",
    mapping: str | dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score every row of `data` with `model` (an export folder or `models:/NAME@ALIAS`) into `out`; a row that
    cannot be scored keeps its reason code there. `mapping` (a mapping file, or the mapping itself, as
    `validate.mapping`) reads a plain table. Returns the summary (rows, scored, refused by reason, rate)."""
    return predict(model, data, dated(out), batch_size, device, mapping)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.batch_predict", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument(
        "--data",
        required=True,
        help="decision rows (gold optional), or a plain table with --mapping or the mapping flags: a .jsonl, .parquet or .csv file, a folder or glob of shards, a save_to_disk folder or hf:OWNER/NAME (docs/data-format.md, Sources)",
    )
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"an export folder or models:/NAME@ALIAS "
                        f"(default: {DEFAULT_MODEL})")  # fmt: skip
    parser.add_argument("--out", default="predictions/{date}.parquet",
                        help="the Parquet file to write; {date} becomes today's date (default: %(default)s)")  # fmt: skip
    parser.add_argument("--batch-size", type=AT_LEAST_ONE, default=64, help="requests per call of the model")
    parser.add_argument("--device", default="cpu", type=device_option, help="cpu (default), cuda, cuda:1")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    add_mapping_arguments(parser)
    args = parser.parse_args(argv)
    quiet_libraries(args)  # no library progress bars between the flow's log lines where stderr is no terminal
    try:
        mapping = mapping_value(args)
    except BadMappingFlags as error:
        parser.error(str(error))
    if (problem := out_file_problem(Path(dated(args.out)), args.data)) is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        # The model, source, columns and out place: one line and exit 2 before a flow run starts (whose failure
        # Prefect would log with its traceback). The flow checks them again, as a deployment runs it without this.
        check_inputs(args.model, args.data, load_mapping(mapping) if mapping is not None else None)
        with stoppable_run():
            summary = batch_predict(args.data, args.model, args.out, args.batch_size, args.device, mapping)
    except (UnreadableInput, MappingError, ModelLayoutError, RegistryError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the stage has removed its staging file
        print(f"batch-predict: interrupted; {dated(args.out)} was not written", file=sys.stderr)
        return 130
    print(json.dumps(summary) if args.json else f"{summary['out']}: {summary['scored']} of {summary['rows']} rows "
          f"scored by {summary['model']}; refused: {refusal_counts(summary['failed'])}")  # fmt: skip
    if summary["scored"] == 0:  # as decision predict
        print(f"error: {nothing_scored(args.data, summary['out'], summary['failed'])}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
