"""The `batch-predict` Prefect flow: score a decision file with a served model into Parquet (`decision
predict` as a flow), on demand or on the schedule of its deployment in `prefect.yaml` (off until a user turns
it on).

One task calls the predict stage (`pipeline.stages.predict`); the run's artifact is the count of refused rows
by reason. `{date}` in `out` becomes the run's date (UTC), so a scheduled run writes a file of its own and
never overwrites yesterday's.

    decision predict --flow --data data/new.jsonl --out 'predictions/{date}.parquet'   # this flow, its own process
    decision predict --flow --data new_tickets.csv --model models:/tickets@champion --mapping configs/tickets.mapping.yaml --out s.parquet
    prefect deployment run batch-predict/batch-predict --param data=data/new.parquet
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact

from flows.launched import run_launched
from pipeline.data.mapping import MappingError, load_mapping
from pipeline.data.read import UnreadableInput
from pipeline.families.base import ModelLayoutError
from pipeline.mlops.registry import RegistryError
from pipeline.stages.predict import DEFAULT_MODEL, DEFAULT_OUT, dated, predict_stage


@task(name="predict")
def predict(
    model: str, data: str, out: str, batch_size: int, device: str, mapping: str | dict[str, Any] | None = None
) -> dict[str, Any]:
    read_as = load_mapping(mapping) if mapping is not None else None
    result = predict_stage(
        model, data, out, batch_size, device, mapping=read_as, report=get_run_logger().info
    )
    rows = [{"reason": reason, "rows": n} for reason, n in result.failed.items()]
    create_table_artifact(
        rows or [{"reason": "(none)", "rows": 0}],
        key="refused-rows",
        description=f"{result.scored} of {result.rows} rows scored into {result.out}",
    )
    return result.to_dict()


@flow(name="batch-predict", log_prints=True)
def batch_predict(
    data: str,
    model: str = DEFAULT_MODEL,
    out: str = DEFAULT_OUT,
    batch_size: int = 64,
    device: str = "cpu",
    mapping: str | dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Score every row of `data` with `model` (an export folder or `models:/NAME@ALIAS`) into `out`; a row
    that cannot be scored keeps its reason code there. `mapping` (a mapping file, or the mapping itself, as
    `validate.mapping`) reads a plain table. Returns the summary (rows, scored, refused by reason, rate)."""
    return predict(model, data, dated(out), batch_size, device, mapping)


REFUSED = (UnreadableInput, MappingError, ModelLayoutError, RegistryError)
"""What ends this flow's process in one line, exit 2."""


def main(argv: list[str] | None = None) -> int:
    """The flow's own process, as `decision predict` starts it (`flows.launched`)."""
    return run_launched(batch_predict, "predict", REFUSED, "its out file was not written", argv)


if __name__ == "__main__":
    sys.exit(main())
