"""The `monitor` Prefect flow: drift and label-free monitoring of a served model, on demand or on a schedule.

One task calls the monitor stage (`pipeline.stages.monitor`): a window of the decisions the inference store
logged for the serving version, against that version's own answers to the rows it trained on, compared by
Evidently's data drift preset. The report goes to the version's MLflow run and beside the inference tables;
the run's markdown artifact is the verdict with expected against measured accuracy. A drifted window emits the
Prefect event `decision.drift.detected` (resource `decision-model.<name>`), which an automation can answer,
e.g. by retraining.

The same window re-certifies the version (`pipeline.flywheel.recertify`): each certificate its export carries
is checked on the feedback to the answers the server automated. A broken one (the one-sided Clopper-Pearson
lower bound on their error above ε) emits `decision.certificate.broken` for the same resource, its payload's
`reason` naming each broken question's count, realised error and bounds; the flywheel automation retrains on
it too (`flows.flywheel_automations`).

    decision monitor                                    # decision-model@champion, params.yaml's monitor:
    decision monitor --model tickets@champion --inference /srv/inference --window-hours 6
    decision monitor --run-config tiny --json           # this flow in its own process
"""

from __future__ import annotations

import datetime as dt
import sys
from dataclasses import replace
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.events import emit_event

from flows.launched import run_launched
from pipeline.config import ConfigError, MonitorConfig, ValidateConfig, load_params
from pipeline.data.read import UnreadableInput
from pipeline.flywheel.drift import drift_markdown
from pipeline.flywheel.recertify import certificates_markdown
from pipeline.mlops.registry import RegistryError
from pipeline.stages.monitor import (
    MonitorError,
    MonitorOutcome,
    champion_of,
    inference_of,
    monitor_stage,
)

DRIFT_EVENT = "decision.drift.detected"
CERTIFICATE_EVENT = "decision.certificate.broken"


def model_resource(name: str) -> str:
    """The Prefect resource id a model's drift events are about (the retrain automation matches it)."""
    return f"decision-model.{name}"


# No retries: a window that failed is judged again by the next run, and a retry would score the reference
# again.
@task(name="judge-window")
def judge(
    model: str,
    config: MonitorConfig,
    split_config: ValidateConfig,
    row_slice: str | None,
    window_end: dt.datetime | None,
    reference: str | None,
) -> MonitorOutcome:
    return monitor_stage(model, config, split_config, row_slice, window_end, reference, get_run_logger().info)


@flow(name="monitor", log_prints=True)
def monitor(
    model: str | None = None,
    inference: str | None = None,
    window_hours: float | None = None,
    window_end: str | None = None,
    reference: str | None = None,
    params_file: str = "params.yaml",
    run_config: str | None = None,
) -> dict[str, Any]:
    """Judge the window of `window_hours` (monitor.window_hours) ending at `window_end` (ISO 8601; now) of the
    decisions `model` (NAME@ALIAS or NAME/VERSION; the run's retrain.model_name@champion) answered, as logged
    in `inference` (monitor.inference, else flywheel.inference), against the rows it trained on (`reference`:
    its `data` tag). Returns the outcome, with `event` (the emitted drift event's id when the window drifted)
    and `certificate_event` (the emitted `decision.certificate.broken` event's id when a certificate broke)."""
    params = load_params(params_file, run_config)
    model = model or champion_of(params)
    overrides = {"inference": inference_of(params, inference), "window_hours": window_hours}
    config = replace(params.monitor, **{k: v for k, v in overrides.items() if v is not None})
    end = dt.datetime.fromisoformat(window_end) if window_end else None
    outcome = judge(model, config, params.validate, params.retrain.slice, end, reference)
    print(outcome.line())
    for line in outcome.certificate_lines():
        print(f"certificate {line}")
    event = certificate_event = None
    if outcome.result is not None:
        create_markdown_artifact(_report_markdown(outcome), key="drift-report", description=outcome.line())
        event = announce(outcome) if outcome.result.breached else None
    if outcome.broken:
        certificate_event = announce_broken(outcome)
    return outcome.to_dict() | {"event": event, "certificate_event": certificate_event}


def announce(outcome: MonitorOutcome) -> str | None:
    """Emit `decision.drift.detected` for the model's name; the event's id (None where no events client
    runs)."""
    name = outcome.model.split("/")[0]
    result = outcome.result
    emitted = emit_event(
        DRIFT_EVENT,
        resource={"prefect.resource.id": model_resource(name), "prefect.resource.name": outcome.model},
        payload={
            "model": outcome.model,
            "share": result.share,
            "threshold": result.threshold,
            "columns": result.drifted,
            "window_start": outcome.window_start,
            "window_end": outcome.window_end,
            "decisions": outcome.decisions,
            "report": outcome.artifact,
            "reason": f"drift in {', '.join(result.drifted)}: share {result.share:.2f} >= "
            f"{result.threshold:.2f}",
        },
    )
    return str(emitted.id) if emitted is not None else None


def announce_broken(outcome: MonitorOutcome) -> str | None:
    """Emit `decision.certificate.broken` for the model's name, one event for every broken question of the
    window (`questions`, each check in `certificates`, and `reason`: their lines, which a retrain it starts
    logs); the event's id (None where no events client runs)."""
    name = outcome.model.split("/")[0]
    broken = outcome.broken
    emitted = emit_event(
        CERTIFICATE_EVENT,
        resource={"prefect.resource.id": model_resource(name), "prefect.resource.name": outcome.model},
        payload={
            "model": outcome.model,
            "questions": [check.question for check in broken],
            "certificates": [check.to_dict() for check in broken],
            "reason": "; ".join(check.line() for check in broken),
            "window_start": outcome.window_start,
            "window_end": outcome.window_end,
        },
    )
    return str(emitted.id) if emitted is not None else None


def _report_markdown(outcome: MonitorOutcome) -> str:
    """The drift verdict, then the certificates re-checked on the window (none for a model without)."""
    drift = drift_markdown(outcome.result, outcome.model, _window(outcome))
    table = certificates_markdown(outcome.certificates)
    return f"{drift}\n\n## Certificates on the window's automated answers\n\n{table}" if table else drift


def _window(outcome: MonitorOutcome) -> str:
    return f"{outcome.window_start} to {outcome.window_end}"


REFUSED = (ConfigError, MonitorError, RegistryError, UnreadableInput)
"""What ends this flow's process in one line, exit 2."""


def main(argv: list[str] | None = None) -> int:
    """The flow's own process, as `decision monitor` starts it (`flows.launched`)."""
    return run_launched(monitor, "monitor", REFUSED, "nothing recorded", argv)


if __name__ == "__main__":
    sys.exit(main())
