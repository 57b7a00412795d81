"""The validate stage: the validation report of a decision file (or its slice) with the held-out split summary.

The same function for `dvc repro validate` and the retraining flow's validate task.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.config import ValidateConfig
from pipeline.data.read import RowSlice
from pipeline.data.split import record_heldout, split_holdout
from pipeline.data.validate import validate_file


def validate_report(data: str | Path, config: ValidateConfig, out: str | Path | None = None,
                    row_slice: str | None = None, ledger: str | Path | None = None) -> dict[str, Any]:  # fmt: skip
    """The report of `data` (or its slice) with the split summary; written to `out` if given.

    With `ledger` (the DVC stage passes `validate.holdout_ledger`), the held-out rows are added to it, so they
    stay held out as the data grows; the flow's validate task only reads it.
    """
    validated = validate_file(data, RowSlice.parse(row_slice))
    split = split_holdout(validated.records, config)
    report = validated.report.to_dict() | {"split": split.summary()}
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(report, indent=2) + "\n")
    if ledger is not None:
        # Returned, not written: the count depends on what earlier runs held out, and the written report is a DVC
        # metric that must depend on the data and params alone.
        return report | {"split": report["split"] | {"newly_held_out": record_heldout(split, ledger)}}
    return report
