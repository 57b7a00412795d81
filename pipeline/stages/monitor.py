"""The monitor stage: a window of served decisions judged against the rows the serving version trained on.

The version an alias points at is looked up in the registry. Its reference is the data its `data` tag names
(or `reference`), validated as the params file says, at most `monitor.reference_rows` rows in content-hash
order, answered by that version's own export. The window is what the inference store logged under
`NAME/VERSION` in the `monitor.window_hours` before its end; fewer than `monitor.min_decisions` decisions are
not judged. The drift report (`pipeline.flywheel.drift`) goes to the version's MLflow run as
`monitoring/drift-<window end>.html`, its gauges as `monitor_*` metrics (step: the window end in epoch
seconds), and the summary to `monitor/latest.json` (the HTML beside it as `latest.html`) under the summary
folder, where the server reads its gauges.

The window also re-certifies the version: each certificate its export carries (`scoring.certify`) is checked
against the feedback on the answers the server automated (`pipeline.flywheel.recertify`); the checks go in the
outcome, the summary (the server's `decision_certificate_*` gauges) and the run's metrics
(`certificate_<question>_<gauge>`). A model exported without certificates automates nothing, so has none.

    params = load_params()
    outcome = monitor_stage("decision-model@champion", params.monitor, params.validate)
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.config import MonitorConfig, Params, ValidateConfig
from pipeline.data.contract import Record
from pipeline.data.facts import announced
from pipeline.data.read import RowSlice
from pipeline.data.split import TrainSource
from pipeline.families import load_decision_model
from pipeline.families.base import DecisionModel
from pipeline.families.exporting import CERTIFICATES, read_carried
from pipeline.flywheel.drift import (
    DecisionRow,
    DriftResult,
    QuestionAccuracy,
    drift_report,
    features_frame,
    question_columns,
    served_rows,
    window_accuracy,
    write_latest,
)
from pipeline.flywheel.gauges import LATEST
from pipeline.flywheel.recertify import CertificateCheck, check_certificates
from pipeline.flywheel.table import POSTGRES_SCHEMES, missing_log, open_store
from pipeline.mlops.promotion import CHAMPION
from pipeline.mlops.registry import (
    MODEL_URI_PREFIX,
    RegistryError,
    client,
    registered_version,
)
from pipeline.mlops.tracking import log_values
from pipeline.scoring.certify import Certificate, read_certificates
from pipeline.serving.offline import answer_rows, row_request
from pipeline.stages.predict import model_folder

MONITORING = "monitoring"
"""The folder of a version's run that holds its drift reports."""
LATEST_HTML = "latest.html"
"""The latest HTML report, beside `monitor/latest.json`."""


class MonitorError(ValueError):
    """A window that cannot be judged as asked: no reference data known, no folder for the summary."""


@dataclass(frozen=True)
class MonitorOutcome:
    """What one monitoring run judged, and where it wrote; `result` is None when the window was too small."""

    model: str
    """NAME/VERSION, the name the server answers under and logs."""
    run_id: str
    window_start: str
    window_end: str
    decisions: int
    needed: int
    result: DriftResult | None = None
    artifact: str | None = None
    """The HTML report's path among the run's artifacts."""
    latest: str | None = None
    certificates: tuple[CertificateCheck, ...] = ()
    """Each certified question of the version re-checked on the window (`recertify`), in question order."""

    @property
    def broken(self) -> tuple[CertificateCheck, ...]:
        """The certificates the window's feedback shows broken."""
        return tuple(check for check in self.certificates if check.broken)

    def certificate_lines(self) -> list[str]:
        """One line per certified question: its status on the window, with the realised error and bounds."""
        return [check.line() for check in self.certificates]

    def line(self) -> str:
        """One line: the verdict, or why nothing was judged."""
        window = f"{self.decisions} decisions from {self.window_start} to {self.window_end}"
        if self.result is None:
            return f"{self.model}: {window}, fewer than {self.needed}: nothing judged"
        r, gauges = self.result, self.result.gauges()
        verdict = f"drift in {len(r.drifted)} of {len(r.columns)} columns ({', '.join(r.drifted) or 'none'})"
        measured = (
            f", measured {gauges['measured_accuracy']:.4f} on {int(gauges['labelled_decisions'])} labelled "
            "answers"
            if "measured_accuracy" in gauges
            else ", no feedback yet"
        )
        return (
            f"{self.model}: {window}: {verdict}, share {r.share:.2f} "
            f"{'>=' if r.breached else '<'} {r.threshold:.2f}; expected accuracy "
            f"{gauges.get('expected_accuracy', float('nan')):.4f}{measured}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "result": None if self.result is None else self.result.to_dict(),
            "certificates": [check.to_dict() for check in self.certificates],
            "line": self.line(),
        }


def champion_of(params: Params) -> str:
    """The model a monitor watches by default: the run's registered model at its champion alias."""
    return f"{params.retrain.model_name}@{CHAMPION}"


def inference_of(params: Params, inference: str | None) -> str:
    """The inference store a window is read from: `inference`, else monitor.inference, else
    flywheel.inference."""
    return inference or params.monitor.inference or params.flywheel.inference


def monitor_stage(
    model: str,
    config: MonitorConfig,
    split_config: ValidateConfig,
    row_slice: str | None = None,
    window_end: dt.datetime | None = None,
    reference: str | None = None,
    report: Callable[[str], None] | None = None,
) -> MonitorOutcome:
    """Judge the window ending at `window_end` (now) for `model` (`NAME@ALIAS`, `NAME/VERSION`, either behind
    `models:/`): see the module docstring. `row_slice` and `split_config` read the reference data as training
    did; `report` hears of the two long steps (the reference answered, the drift report) while they run."""
    # First, before any work: a PostgreSQL store without a summary folder is refused.
    summary = summary_folder(config)
    if (problem := missing_log(config.inference)) is not None:
        raise MonitorError(problem)
    name, version = resolve_version(model)
    registered = client().get_model_version(name, version)
    end = utc(window_end or dt.datetime.now(dt.UTC))
    start = end - dt.timedelta(hours=config.window_hours)
    store = open_store(config.inference)
    served = served_rows(served_by(store.decisions(since=start, until=end), f"{name}/{version}"))
    outcome = MonitorOutcome(
        f"{name}/{version}",
        registered.run_id,
        start.isoformat(),
        end.isoformat(),
        len(served),
        config.min_decisions,
    )
    if len(served) < config.min_decisions:
        return outcome
    data = reference or trained_on(registered.tags, outcome.model)
    with announced(
        report, f"answering up to {config.reference_rows:,} reference rows of {data} with {outcome.model}"
    ):
        answered, certificates = answered_reference(
            outcome.model, data, split_config, row_slice, config.reference_rows
        )
    columns = question_columns(answered, config.max_question_columns)
    feedback = store.feedback()
    accuracy = window_accuracy(served, feedback)
    checks = check_certificates(served, feedback, certificates)
    frames = features_frame(served, columns), features_frame(answered, columns)
    with announced(
        report,
        f"comparing {len(served):,} served decisions with {len(answered):,} reference rows (Evidently)",
    ):
        result, artifact = report_on_run(
            *frames, accuracy, config.drift_share, registered.run_id, end, summary
        )
    record_certificates(registered.run_id, checks, end)
    latest = write_latest(
        summary, result, outcome.model, start, end, certificates={c.question: c.to_dict() for c in checks}
    )
    return replace(outcome, result=result, artifact=artifact, latest=str(latest), certificates=checks)


def answered_reference(
    model: str, data: str, split_config: ValidateConfig, row_slice: str | None, limit: int
) -> tuple[list[DecisionRow], dict[str, Certificate]]:
    """The reference rows (`reference_records`) as `model` (NAME/VERSION) answers them, its export fetched,
    and the certificates that export carries."""
    records = reference_records(data, split_config, row_slice, limit)
    with model_folder(MODEL_URI_PREFIX + model) as (_, folder):
        return reference_rows(records, load_decision_model(folder)), served_certificates(folder)


def served_certificates(folder: str | Path) -> dict[str, Certificate]:
    """The certificates an export carries ({} for one without: it automates nothing)."""
    return read_certificates(read_carried(folder, CERTIFICATES))


def report_on_run(
    current: pd.DataFrame,
    reference: pd.DataFrame,
    accuracy: tuple[QuestionAccuracy, ...],
    drift_share: float,
    run_id: str,
    window_end: dt.datetime,
    summary: str,
) -> tuple[DriftResult, str]:
    """The drift report logged on the run (`record_on_run`) and kept as `monitor/latest.html` under `summary`;
    the result and the report's artifact path."""
    reports = Path(summary) / LATEST.parent
    reports.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=reports, prefix=".drift-") as staging:
        html = Path(staging) / f"drift-{window_end:%Y%m%dT%H%M%SZ}.html"
        result = drift_report(current, reference, drift_share, html, accuracy)
        artifact = record_on_run(run_id, result, html, window_end)
        os.replace(html, reports / LATEST_HTML)  # the same folder: one rename, never half a file
    return replace(result, html=str(reports / LATEST_HTML)), artifact


def utc(moment: dt.datetime) -> dt.datetime:
    """`moment` in UTC; a naive one is read as UTC (the inference table's clock), never as local time."""
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


def resolve_version(model: str) -> tuple[str, str]:
    """(name, version) for `NAME@ALIAS` or `NAME/VERSION`, with or without `models:/`."""
    uri = model if model.startswith(MODEL_URI_PREFIX) else MODEL_URI_PREFIX + model
    if (registered := registered_version(uri)) is not None:
        return registered
    raise RegistryError(f"--model {model}: expected NAME@ALIAS or NAME/VERSION, e.g. decision-model@champion")


def served_by(decisions: pa.Table, served_name: str) -> pa.Table:
    """The decisions answered under `served_name` (NAME/VERSION): other models' traffic is another
    comparison."""
    return decisions.filter(pc.equal(decisions["model"], served_name))


def trained_on(tags: dict[str, str], model: str) -> str:
    """The data a version trained on, from its `data` tag (the retrain and sweep flows set it)."""
    if not tags.get("data"):
        raise MonitorError(
            f"{model} has no `data` tag (registered by hand?): give the data it trained on with "
            "--reference DATA"
        )
    return tags["data"]


def reference_records(
    data: str, split_config: ValidateConfig, row_slice: str | None, limit: int
) -> list[Record]:
    """At most `limit` validated rows of `data` (training, validation and held-out alike), in content-hash
    order: the same rows on every run, spread over the file."""
    split = TrainSource(data, RowSlice.parse(row_slice), split_config=split_config).validated().split
    return sorted(split.every_record(), key=Record.content_hash)[:limit]


def summary_folder(config: MonitorConfig) -> str:
    """Where monitor/latest.json goes: `monitor.summary_folder`, else the inference folder."""
    if config.summary_folder is not None:
        return config.summary_folder
    if config.inference.startswith(POSTGRES_SCHEMES):
        raise MonitorError(
            "monitor.summary_folder: a folder is needed for monitor/latest.json when "
            "monitor.inference is a PostgreSQL URL"
        )
    return config.inference


def record_on_run(run_id: str, result: DriftResult, html: Path, window_end: dt.datetime) -> str:
    """The HTML report under the run's `monitoring/` and its gauges as `monitor_*` metrics at the window end
    (as step, in epoch seconds, and as timestamp); the report's artifact path."""
    client().log_artifact(run_id, str(html), MONITORING)
    log_values(
        run_id,
        metrics={f"monitor_{k}": v for k, v in result.gauges().items()},
        step=int(window_end.timestamp()),
        timestamp_ms=int(window_end.timestamp() * 1000),
    )
    return f"{MONITORING}/{html.name}"


def record_certificates(run_id: str, checks: tuple[CertificateCheck, ...], window_end: dt.datetime) -> None:
    """Each check's gauges as `certificate_<question>_<gauge>` metrics on the version's run, at the window end
    (as `record_on_run` logs the drift gauges)."""
    metrics = {f"certificate_{c.question}_{k}": v for c in checks for k, v in c.gauges().items()}
    if metrics:
        log_values(
            run_id,
            metrics=metrics,
            step=int(window_end.timestamp()),
            timestamp_ms=int(window_end.timestamp() * 1000),
        )


def reference_rows(
    records: Sequence[Record], model: DecisionModel, batch_size: int = 64
) -> list[DecisionRow]:
    """Training rows answered by `model` as the API answers them; a row the API would refuse is left out."""
    asked = [record.request_questions() for record in records]  # as trained: options in model order
    requests = [
        row_request(i, None, r.state, questions) for i, (r, questions) in enumerate(zip(records, asked))
    ]
    scored = answer_rows(model, requests, batch_size)
    return [
        DecisionRow(None, record.state, questions, row.answers)
        for record, questions, row in zip(records, asked, scored)
        if row.answers is not None
    ]
