"""The monitor's latest summary as the server's gauges: `monitor/latest.json` read at scrape time.

`drift.write_latest` writes it after each judged window; `decision serve` reads it here on every `GET
/metrics` (a file read, no pandas or Evidently), so the gauges are as fresh as the last monitor run, and their
age says how old. Beside the drift gauges, each certified question's re-certification on the window
(`recertify.CertificateCheck`) is a set of gauges of its own.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

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
CERTIFICATE_GAUGES = (
    "target_error",
    "automated",
    "automated_labelled",
    "errors",
    "realised_error",
    "error_upper_bound",
    "error_lower_bound",
    "broken",
)
"""Per certified question (`recertify.CertificateCheck.gauges`); `realised_error` is absent while none of the
window's automated answers has feedback."""


def read_latest(folder: str | Path) -> dict[str, Any] | None:
    """The latest summary under `folder`; None when none was written yet."""
    try:
        return json.loads((Path(folder) / LATEST).read_text())
    except FileNotFoundError:
        return None


def read_gauges(folder: str | Path, now: dt.datetime | None = None) -> dict[str, float]:
    """The latest summary's gauges (see `GAUGES`) with its age in seconds; {} when none was written yet.
    `measured_accuracy` is absent while no decision in the window has feedback."""
    summary = read_latest(folder)
    if summary is None:
        return {}
    written = dt.datetime.fromisoformat(summary["written_at"])
    age = ((now or dt.datetime.now(dt.UTC)) - written).total_seconds()
    return {**summary["gauges"], "report_age_seconds": round(age, 3)}


def read_certificate_gauges(folder: str | Path) -> dict[str, dict[str, float]]:
    """Per certified question, the latest window's certificate gauges (see `CERTIFICATE_GAUGES`); {} before
    the first summary, or for a model without certificates."""
    summary = read_latest(folder) or {}
    return {question: check["gauges"] for question, check in summary.get("certificates", {}).items()}
