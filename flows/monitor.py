"""The `monitor` Prefect flow: drift and label-free monitoring of a served model, on demand or on a schedule.

One task calls the monitor stage (`pipeline.stages.monitor`): a window of the decisions the inference store
logged for the serving version, against that version's own answers to the rows it trained on, compared by
Evidently's data drift preset. The report goes to the version's MLflow run and beside the inference tables;
the run's markdown artifact is the verdict with expected against measured accuracy. A drifted window emits the
Prefect event `decision.drift.detected` (resource `decision-model.<name>`), which an automation can answer,
e.g. by retraining.

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
from pipeline.mlops.registry import RegistryError
from pipeline.stages.monitor import (
    MonitorError,
    MonitorOutcome,
    champion_of,
    inference_of,
    monitor_stage,
)

DRIFT_EVENT = "decision.drift.detected"


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
    its `data` tag). Returns the outcome, with `event` (the emitted event's id when the window drifted)."""
    params = load_params(params_file, run_config)
    model = model or champion_of(params)
    overrides = {"inference": inference_of(params, inference), "window_hours": window_hours}
    config = replace(params.monitor, **{k: v for k, v in overrides.items() if v is not None})
    end = dt.datetime.fromisoformat(window_end) if window_end else None
    outcome = judge(model, config, params.validate, params.retrain.slice, end, reference)
    print(outcome.line())
    event = None
    if outcome.result is not None:
        create_markdown_artifact(
            drift_markdown(outcome.result, outcome.model, _window(outcome)),
            key="drift-report",
            description=outcome.line(),
        )
        event = announce(outcome) if outcome.result.breached else None
    return outcome.to_dict() | {"event": event}


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
        },
    )
    return str(emitted.id) if emitted is not None else None


def _window(outcome: MonitorOutcome) -> str:
    return f"{outcome.window_start} to {outcome.window_end}"


REFUSED = (ConfigError, MonitorError, RegistryError, UnreadableInput)
"""What ends this flow's process in one line, exit 2."""


def main(argv: list[str] | None = None) -> int:
    """The flow's own process, as `decision monitor` starts it (`flows.launched`)."""
    return run_launched(monitor, "monitor", REFUSED, "nothing recorded", argv)


if __name__ == "__main__":
    sys.exit(main())
