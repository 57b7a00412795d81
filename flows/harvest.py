"""The `harvest` Prefect flow: labelled served decisions become a new, pinned revision of a run's data set.

One task runs the harvest stage (`pipeline.stages.harvest`): feedback joined to the inference log, rows
validated with reasons, one new shard, `dvc add`, a git commit of the pin. MLflow records the revision, the
counts, the date range, the model versions the rows came from and every decision id (experiment `harvest`);
the flow run gets a markdown artifact. A harvest of at least `flywheel.retrain_after_rows` new rows emits the
Prefect event `decision.harvest.ready`, which the retrain automation (`flows/flywheel_automations.py`) answers
by running the retrain deployment. Two harvests of one data set never interleave: the second waits for the
first.

    decision harvest --run-config tickets             # into the data set configs/tickets.yaml trains on
    decision harvest --run-config tickets --inference postgresql://...  --json   # this flow in its own process
"""

from __future__ import annotations

import sys
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.events import emit_event

from flows.launched import run_launched
from pipeline.config import ConfigError, ValidateConfig, load_params
from pipeline.data.read import UnreadableInput
from pipeline.flywheel.harvest import HarvestRefused
from pipeline.mlops.tracking import log_harvest
from pipeline.stages.harvest import HarvestResult, harvest

READY_EVENT = "decision.harvest.ready"
ANY_MODEL = "any"


def dataset_resource(dataset: str) -> str:
    """The Prefect resource id a data set's harvest events are about (the retrain automation matches it)."""
    return f"decision.dataset.{dataset}"


@task(name="harvest")
def harvest_task(
    inference: str, dataset: str, split_config: ValidateConfig, commit: bool, model: str | None
) -> HarvestResult:
    return harvest(inference, dataset, split_config, commit=commit, model=model)


@task(name="record-harvest")
def record(result: HarvestResult) -> str:
    return log_harvest(result.to_dict(), list(result.decision_ids))


@flow(name="harvest", log_prints=True)
def harvest_flow(
    params_file: str = "params.yaml",
    run_config: str | None = None,
    inference: str | None = None,
    dataset: str | None = None,
    commit: bool = True,
    model: str | None = None,
) -> dict[str, Any]:
    """Harvest the labelled decisions `model` made (default the run's `retrain.model_name`; `any`: every
    model's) in `inference` (default `flywheel.inference`) into `dataset` (default the run's `retrain.data`).
    Returns the summary; `mlflow_run_id` names the harvest's MLflow run."""
    params = load_params(params_file, run_config)
    inference = inference or params.flywheel.inference
    dataset = dataset or params.retrain.data
    model = model or params.retrain.model_name
    result = harvest_task(inference, dataset, params.validate, commit, None if model == ANY_MODEL else model)
    print(result.line())
    summary = result.to_dict() | {"mlflow_run_id": record(result) if result.rows else None, "ready": False}
    if result.rows >= params.flywheel.retrain_after_rows:
        emit_event(
            READY_EVENT,
            resource={"prefect.resource.id": dataset_resource(dataset)},
            payload={"rows": result.rows, "revision": result.revision, "run_config": run_config},
        )
        summary["ready"] = True
    create_markdown_artifact(_markdown(summary), key="harvest", description=result.line())
    return summary


def _markdown(summary: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items() if k != "skipped")
    skipped = ", ".join(f"{r}: {n}" for r, n in summary["skipped"].items()) or "none"
    return f"# Harvest\n\n| | |\n|---|---|\n{rows}\n\nSkipped by reason: {skipped}\n"


REFUSED = (HarvestRefused, UnreadableInput, ConfigError)
"""What ends this flow's process in one line, exit 2."""


def main(argv: list[str] | None = None) -> int:
    """The flow's own process, as `decision harvest` starts it (`flows.launched`)."""
    return run_launched(harvest_flow, "harvest", REFUSED, "a rerun takes what this one did not harvest", argv)


if __name__ == "__main__":
    sys.exit(main())
