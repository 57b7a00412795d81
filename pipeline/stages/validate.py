"""The validate stage: the validation report of a decision file (or its slice) with the held-out split
summary, and, for a run, the validated rows split in two (`RunFolder.split`) for every later stage to read.

The same function for `dvc repro validate` and the retraining flow's validate task.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pipeline.config import ValidateConfig
from pipeline.data.pins import dvc_root
from pipeline.data.read import RowSlice
from pipeline.data.split import SplitData, TrainSource, ledger_path, record_heldout
from pipeline.data.validate import ValidationReport


@dataclass(frozen=True)
class ValidateResult:
    """The report, the split's row and decision counts, and how many rows it newly added to the ledger."""

    report: ValidationReport
    split: dict[str, int]
    newly_held_out: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """`validation.json`: the report with the split summary."""
        return self.report.to_dict() | {"split": self.split}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ValidateResult:
        """The result as `to_dict` wrote it (`validation.json`)."""
        return cls(ValidationReport.from_dict(values), values.get("split", {}))


def write_validated(
    validated: SplitData, out: str | Path | None = None, split_out: str | Path | None = None
) -> ValidateResult:
    """Validated rows as the validate stage leaves them: the report with the split summary written to `out`,
    and the split itself to `split_out` (a run's `RunFolder.split`), each where given."""
    result = ValidateResult(validated.report, validated.split.summary())
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    if split_out is not None:
        validated.save(split_out)
    return result


def validate_stage(
    data: str | Path,
    config: ValidateConfig,
    out: str | Path | None = None,
    row_slice: str | None = None,
    split_out: str | Path | None = None,
    report: Callable[[str], None] | None = None,
) -> ValidateResult:
    """The report of `data` (or its slice) with the split summary; written to `out` if given, and the split
    itself to `split_out` (a run's `RunFolder.split`) if given; `report` hears of reading and checking that
    run past 2 s.

    The held-out rows are added to the data set's ledger (`ledger_path`), so they stay held out as the data
    grows: for `dvc repro validate` and the retrain flow's validate task alike, wherever the data lies in a
    DVC project.
    """
    validated = TrainSource(data, RowSlice.parse(row_slice), split_config=config).validated(report)
    result = write_validated(validated, out, split_out)
    ledger = ledger_path(data, config)
    if ledger is None or dvc_root(ledger) is None:  # a Hub id, a file outside a DVC project: nothing pins it
        return result
    # Kept out of the written report: the count depends on what earlier runs held out, and the written report
    # is a DVC metric that must depend on the data and params alone.
    return replace(result, newly_held_out=record_heldout(validated.split, ledger))
