"""The flywheel's Prefect automation: a retrain starts when a harvest brings enough new rows, drift is detected
or a certificate breaks.

    PREFECT_API_URL=http://127.0.0.1:4200/api python -m flows.flywheel_automations --run-config tickets

One automation per run config (replaced when run again) answers either event with a run of the `retrain`
deployment (prefect.yaml) for that run config:

- `decision.harvest.ready`: `flows.harvest` emits it when a harvest adds at least `flywheel.retrain_after_rows`
  rows to the run's data set (resource `decision.dataset.<retrain.data>`);
- `decision.drift.detected`: the `monitor` flow emits it when served traffic drifts past its threshold (resource
  `decision-model.<retrain.model_name>`);
- `decision.certificate.broken`: the `monitor` flow emits it when the feedback on the answers the server
  automated shows a question's error above its certificate's ε (same resource).

The retrain runs with `only_new_data`, so drift with no new labelled rows since the champion's data revision
skips with its reason instead of training the same model again; its `reason` parameter, filled from the event
("started by decision.certificate.broken: tone broken: 6 wrong of 40 ..."), is the first line of its log. The
schedule in prefect.yaml stays as it is.
"""

from __future__ import annotations

import argparse
import sys
from uuid import UUID

import httpx
from prefect.automations import Automation
from prefect.client.orchestration import get_client
from prefect.events.actions import RunDeployment
from prefect.events.schemas.automations import EventTrigger, Posture
from prefect.events.schemas.events import ResourceSpecification
from prefect.exceptions import ObjectNotFound
from prefect.settings import PREFECT_API_URL

from flows.harvest import READY_EVENT, dataset_resource
from flows.monitor import CERTIFICATE_EVENT, DRIFT_EVENT, model_resource
from pipeline.config import ConfigError, load_params

DEPLOYMENT = "retrain/retrain"
TRIGGERS = (READY_EVENT, DRIFT_EVENT, CERTIFICATE_EVENT)
REASON = "started by {{ event.event }}{% if event.payload.reason %}: {{ event.payload.reason }}{% endif %}"
"""The retrain's `reason`, rendered by the Prefect server from the event that started it."""


def automation_name(run_config: str | None) -> str:
    return f"decision: retrain {run_config or 'default'} on new rows or drift"


class AutomationRefused(RuntimeError):
    """No Prefect server to hold the automation, or no deployment for it to run; says what to do."""


def retrain_on_new_data(
    params_file: str = "params.yaml", run_config: str | None = None, deployment: str = DEPLOYMENT
) -> str:
    """Create (or replace) the automation for one run config; its id. AutomationRefused, saying what to do,
    without a Prefect server (PREFECT_API_URL) that answers, or where the deployment does not exist on it."""
    params = load_params(params_file, run_config)
    resources = [dataset_resource(params.retrain.data), model_resource(params.retrain.model_name)]
    name = automation_name(run_config)
    deployment_id = _replace_automation(name, deployment)
    parameters = {"params_file": params_file, "only_new_data": True, "reason": REASON} | (
        {"run_config": run_config} if run_config else {}
    )
    automation = Automation(
        name=name,
        trigger=EventTrigger(
            expect=set(TRIGGERS),
            match=ResourceSpecification({"prefect.resource.id": resources}),
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[RunDeployment(source="selected", deployment_id=deployment_id, parameters=parameters)],
    )
    return str(automation.create().id)


def _replace_automation(name: str, deployment: str) -> UUID:
    """The deployment's id, once the server's automations called `name` are deleted."""
    url = PREFECT_API_URL.value()
    if not url:  # a temporary server ends with this process, and the automation with it
        raise AutomationRefused(
            "an automation lives on a Prefect server, and PREFECT_API_URL names none; start one "
            "(make schedule does, with the retrain deployment) and set PREFECT_API_URL="
            "http://127.0.0.1:4200/api"
        )
    try:
        with get_client(sync_client=True) as client:
            deployment_id = client.read_deployment_by_name(deployment).id
            for found in client.read_automations_by_name(name):
                client.delete_automation(found.id)
    except ObjectNotFound:
        raise AutomationRefused(
            f"no deployment {deployment} on the Prefect server at {url}; create it first: "
            "prefect --no-prompt deploy --name retrain (make schedule does)"
        ) from None
    except httpx.HTTPError as error:
        raise AutomationRefused(
            f"the Prefect server at {url} does not answer ({type(error).__name__}: {error}); "
            "start it (make schedule) or fix PREFECT_API_URL"
        ) from None
    return deployment_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m flows.flywheel_automations",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--run-config", metavar="NAME", help="configs/NAME.yaml: the run to retrain")
    parser.add_argument(
        "--deployment", default=DEPLOYMENT, help=f"the retrain deployment (default {DEPLOYMENT})"
    )
    args = parser.parse_args(argv)
    try:
        automation = retrain_on_new_data(args.params, args.run_config, args.deployment)
    except (ConfigError, AutomationRefused) as error:
        print(f"flywheel automation: {error}", file=sys.stderr)
        return 2
    print(
        f"automation {automation}: {', '.join(TRIGGERS)} runs {args.deployment} "
        f"({args.run_config or 'default'} run config, only on new data)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
