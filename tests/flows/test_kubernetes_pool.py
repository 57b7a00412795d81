"""The Kubernetes variant of `retrain`, as far as a machine without a cluster can check it (about a minute):
the base job template in deploy/k8s/ registers as a `kubernetes` work pool on a real Prefect server, `prefect
deploy --name retrain-k8s` registers the shipped deployment on it, and the Kubernetes worker's own job
configuration renders the Job it would submit for a flow run of that deployment, which the official Kubernetes
client's models read back field for field (a misplaced or misspelt field would be dropped by them).

    python -m pytest tests/flows/test_kubernetes_pool.py -q
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import httpx
import pytest
import yaml
from prefect.client.orchestration import get_client
from prefect.settings import PREFECT_API_URL, temporary_settings

from pipeline.stages.smoke import free_port
from tests.flows.processes import background, wait_healthy

kubernetes_client = pytest.importorskip(
    "kubernetes_asyncio.client", reason="needs prefect-kubernetes (dev extra)"
)
worker = pytest.importorskip("prefect_kubernetes.worker", reason="needs prefect-kubernetes (dev extra)")

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy/k8s/base-job-template.json"
PREFECT = [sys.executable, "-m", "prefect"]


def _variant() -> dict:
    shipped = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return next(d for d in shipped["deployments"] if d["name"] == "retrain-k8s")


def _prefect(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([*PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> tuple[str, dict[str, str]]:
    """A Prefect server on a free loopback port, in a private home: (API URL, the CLI's environment)."""
    tmp = tmp_path_factory.mktemp("k8s-pool")
    (tmp / "home").mkdir()
    api = f"http://127.0.0.1:{free_port()}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(tmp / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    port = api.removeprefix("http://127.0.0.1:").removesuffix("/api")
    command = [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port, "--no-ui"]
    with background(command, env, tmp / "server.log") as proc:
        wait_healthy(api, proc, tmp / "server.log")
        yield api, env | {"PREFECT_API_URL": api}


@pytest.fixture(scope="module")
def registered(server) -> tuple[dict, dict]:
    """The pool and the deployment as the server holds them after the documented commands."""
    api, env = server
    pool = _variant()["work_pool"]["name"]
    _prefect(["work-pool", "create", pool, "--type", "kubernetes", "--base-job-template", str(TEMPLATE)], env)
    _prefect(["--no-prompt", "deploy", "--name", "retrain-k8s"], env)
    return (
        httpx.get(f"{api}/work_pools/{pool}", timeout=10).json(),
        httpx.get(f"{api}/deployments/name/retrain/retrain-k8s", timeout=10).json(),
    )


def test_the_template_keeps_every_variable_of_the_workers_default():
    """A worker fills the template from its own variables: ours may add some and change defaults, never drop
    or retype one (or the worker's job configuration would not validate)."""
    ours = json.loads(TEMPLATE.read_text())
    default = worker.KubernetesWorker.get_default_base_job_template()
    assert set(ours["job_configuration"]) == set(default["job_configuration"])
    for name, schema in default["variables"]["properties"].items():
        mine = ours["variables"]["properties"][name]
        assert (mine.get("type"), mine.get("anyOf")) == (schema.get("type"), schema.get("anyOf")), name


def test_the_pool_and_the_deployment_register_with_the_image_and_template(registered):
    pool, deployment = registered
    variant = _variant()
    assert (pool["type"], pool["base_job_template"]) == ("kubernetes", json.loads(TEMPLATE.read_text()))
    assert deployment["work_pool_name"] == pool["name"]
    assert deployment["job_variables"] == variant["work_pool"]["job_variables"]
    assert deployment["job_variables"]["image"].startswith("decision-pipeline:")
    assert deployment["pull_steps"] == variant["pull"]  # the image's folder, not this checkout's
    assert deployment["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == (
        "/opt/decision-pipeline"
    )
    assert deployment["global_concurrency_limit"]["limit"] == 1
    assert deployment["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    assert deployment["schedules"][0]["schedule"]["cron"] == "0 3 * * 1"


def test_a_flow_run_renders_a_job_the_kubernetes_models_read_back_unchanged(server, registered):
    api, _ = server
    pool, deployment = registered
    manifest, command = anyio.run(_render_job, api, pool, deployment["id"])

    assert _round_trip(manifest) == manifest
    container = manifest["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert container["image"] == deployment["job_variables"]["image"]
    assert (command, container["args"]) == ("prefect flow-run execute", ["prefect", "flow-run", "execute"])
    assert env["PREFECT_API_URL"] == api  # the worker's own setting reaches the pod
    assert env["MLFLOW_TRACKING_URI"].startswith("http://")
    assert env["PREFECT_LOCAL_STORAGE_PATH"].startswith(container["volumeMounts"][0]["mountPath"])
    claim = manifest["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"]
    assert claim == pool["base_job_template"]["variables"]["properties"]["results_claim"]["default"]


def test_the_round_trip_catches_a_misplaced_field():
    """The upstream default puts `completions` and `parallelism` in the pod spec, where Kubernetes has no such
    fields: the check that passes ours must drop them from it."""
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "spec": {"template": {"spec": {"completions": 1, "containers": [{"name": "x", "image": "y"}]}}},
    }
    assert "completions" not in _round_trip(job)["spec"]["template"]["spec"]


async def _render_job(api: str, pool: dict, deployment_id: str) -> tuple[dict, str]:
    """What the Kubernetes worker does before it submits a Job: its job configuration from the pool's template
    and the deployment's job variables, prepared for a real flow run of the deployment."""
    with temporary_settings({PREFECT_API_URL: api}):
        async with get_client() as client:
            flow_run = await client.create_flow_run_from_deployment(deployment_id)
            deployment = await client.read_deployment(deployment_id)
            flow = await client.read_flow(deployment.flow_id)
            configuration = await worker.KubernetesWorkerJobConfiguration.from_template_and_values(
                pool["base_job_template"], deployment.job_variables, client=client
            )
            configuration.prepare_for_flow_run(flow_run, deployment=deployment, flow=flow)
    return configuration.job_manifest, configuration.command


def _round_trip(manifest: dict) -> dict:
    """`manifest` read into the Kubernetes client's V1Job model and written out again: unknown fields
    vanish."""

    async def read_back() -> dict:
        async with kubernetes_client.ApiClient() as api:  # no cluster: its JSON-to-model reader only
            return api.sanitize_for_serialization(api._ApiClient__deserialize(manifest, "V1Job"))

    return anyio.run(read_back)
