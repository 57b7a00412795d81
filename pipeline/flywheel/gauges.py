"""The drift monitor's latest summary as the server's gauges: `monitor/latest.json` read at scrape time.

`drift.write_latest` writes it after each judged window; `decision serve` reads it here on every `GET
/metrics` (a file read, no pandas or Evidently), so the gauges are as fresh as the last monitor run, and their
age says how old.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

LATEST = Path("monitor") / "latest.json"
"""The latest summary, under the summary folder (by default the inference folder): what /metrics reads."""
GAUGES = (
    "drift_share",
    "drifted_columns",
    "expected_accuracy",
    "measured_accuracy",
    "labelled_decisions",
    "window_decisions",
    "report_age_seconds",
)


def read_gauges(folder: str | Path, now: dt.datetime | None = None) -> dict[str, float]:
    """The latest summary's gauges (see `GAUGES`) with its age in seconds; {} when none was written yet.
    `measured_accuracy` is absent while no decision in the window has feedback."""
    path = Path(folder) / LATEST
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    written = dt.datetime.fromisoformat(summary["written_at"])
    age = ((now or dt.datetime.now(dt.UTC)) - written).total_seconds()
    return {**summary["gauges"], "report_age_seconds": round(age, 3)}
