"""The `harvest` Prefect flow: labelled served decisions become a new, pinned revision of a run's data set.

One task runs the harvest stage (`pipeline.stages.harvest`): feedback joined to the inference log, rows
validated with reasons, one new shard, `dvc add`, a git commit of the pin. MLflow records the revision, the
counts, the date range, the model versions the rows came from and every decision id (experiment `harvest`);
the flow run gets a markdown artifact. A harvest of at least `flywheel.retrain_after_rows` new rows emits the
Prefect event `decision.harvest.ready`, which the retrain automation (`flows/flywheel_automations.py`) answers by
running the retrain deployment. Two harvests of one data set never interleave: the second waits for the first.

    python -m flows.harvest --run-config tickets             # into the data set configs/tickets.yaml trains on
    python -m flows.harvest --run-config tickets --inference postgresql://...  --json
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.events import emit_event

from flows.interrupts import EXIT_INTERRUPTED, stoppable_run
from pipeline.config import ConfigError, ValidateConfig, load_params
from pipeline.data.read import UnreadableInput
from pipeline.flywheel.harvest import HarvestRefused
from pipeline.flywheel.table import missing_log
from pipeline.mlops.tracking import log_harvest
from pipeline.stages.harvest import HarvestResult, check_target, harvest

READY_EVENT = "decision.harvest.ready"
ANY_MODEL = "any"


def dataset_resource(dataset: str) -> str:
    """The Prefect resource id a data set's harvest events are about (the retrain automation matches it)."""
    return f"decision.dataset.{dataset}"


@task(name="harvest")
def harvest_task(inference: str, dataset: str, split_config: ValidateConfig, commit: bool,
                 model: str | None) -> HarvestResult:  # fmt: skip
    return harvest(inference, dataset, split_config, commit=commit, model=model)


@task(name="record-harvest")
def record(result: HarvestResult) -> str:
    return log_harvest(result.to_dict(), list(result.decision_ids))


@flow(name="harvest", log_prints=True)
def harvest_flow(params_file: str = "params.yaml", run_config: str | None = None, inference: str | None = None,
                 dataset: str | None = None, commit: bool = True, model: str | None = None) -> dict[str, Any]:  # fmt: skip
    """Harvest the labelled decisions `model` made (default the run's `retrain.model_name`; `any`: every model's)
    in `inference` (default `flywheel.inference`) into `dataset` (default the run's `retrain.data`). Returns the
    summary; `mlflow_run_id` names the harvest's MLflow run."""
    params = load_params(params_file, run_config)
    inference = inference or params.flywheel.inference
    dataset = dataset or params.retrain.data
    model = model or params.retrain.model_name
    result = harvest_task(inference, dataset, params.validate, commit, None if model == ANY_MODEL else model)
    print(result.line())
    summary = result.to_dict() | {"mlflow_run_id": record(result) if result.rows else None, "ready": False}
    if result.rows >= params.flywheel.retrain_after_rows:
        emit_event(READY_EVENT, resource={"prefect.resource.id": dataset_resource(dataset)},
                   payload={"rows": result.rows, "revision": result.revision, "run_config": run_config})  # fmt: skip
        summary["ready"] = True
    create_markdown_artifact(_markdown(summary), key="harvest", description=result.line())
    return summary


def _markdown(summary: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v} |" for k, v in summary.items() if k != "skipped")
    skipped = ", ".join(f"{r}: {n}" for r, n in summary["skipped"].items()) or "none"
    return f"# Harvest\n\n| | |\n|---|---|\n{rows}\n\nSkipped by reason: {skipped}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.harvest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--run-config", metavar="NAME", help="configs/NAME.yaml: its data set is the target")
    parser.add_argument(
        "--inference", metavar="DIR|URL", help="the inference log (default: flywheel.inference)"
    )
    parser.add_argument("--dataset", help="the folder of shards to add to (default: the run's retrain.data)")
    parser.add_argument("--model", metavar="NAME", help="whose labelled decisions: a served model's name or "
                        f"NAME/VERSION (default: the run's retrain.model_name; {ANY_MODEL!r}: every model's)")  # fmt: skip
    parser.add_argument("--no-commit", action="store_true", help="pin with DVC but make no git commit")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    args = parser.parse_args(argv)
    try:
        # The data set and config: one line and exit 2 before a flow run starts (whose failure Prefect would log
        # with its traceback). The flow checks them again, as a deployment runs it without this.
        params = load_params(args.params, args.run_config)
        check_target(args.dataset or params.retrain.data, params.validate)
        if missing := missing_log(args.inference or params.flywheel.inference):
            raise HarvestRefused(missing)
        with stoppable_run():
            summary = harvest_flow(args.params, args.run_config, args.inference, args.dataset, not args.no_commit,
                                   args.model)  # fmt: skip
    # The data set or the config is wrong: named, nothing written.
    except (HarvestRefused, UnreadableInput, ConfigError) as error:
        print(f"harvest: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: a rerun takes what this one did not harvest
        print("harvest: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    rows = f"{summary['rows']} {'row' if summary['rows'] == 1 else 'rows'}"
    print(json.dumps(summary) if args.json else f"{rows} harvested into {summary['dataset']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
