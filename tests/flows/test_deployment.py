"""The shipped `prefect.yaml` on a real Prefect server: deploy `retrain`, run it through a process worker on
the tiny project, and find the version it registered in a private MLflow store (about a minute).

    python -m pytest tests/flows/test_deployment.py -q -s

The server, the worker and the flow run they start live in a temporary Prefect home, never the project's
`.prefect/`; every process started here is stopped (its whole process group) whatever the outcome.
"""

import contextlib
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pipeline.stages.smoke import free_port
from tests.flows.conftest import write_tiny_params
from tests.flows.processes import background, tail, wait_healthy

ROOT = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _prefect(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([*PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _wait_finished(api: str, run_id: str, worker_log: Path, timeout: float = 240) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = httpx.get(f"{api}/flow_runs/{run_id}", timeout=10).json()
        if run["state_type"] in TERMINAL:
            return run
        time.sleep(2)
    raise AssertionError(
        f"flow run {run_id} still {run['state_type']} after {timeout} s:\n{tail(worker_log)}"
    )


@pytest.fixture
def prefect_env(tmp_path, monkeypatch) -> dict[str, str]:
    """The environment of every Prefect process here: a private home, API, MLflow store; no PREFECT_*
    inherited (`make test` exports the project's PREFECT_HOME)."""
    home, store = tmp_path / "prefect-home", tmp_path / "mlflow"
    home.mkdir()
    store.mkdir()
    uri = f"sqlite:///{store}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # for this process's registry check
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    return env | {
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "MLFLOW_TRACKING_URI": uri,
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "PYTHONUNBUFFERED": "1",
    }


def _deploy_and_run(
    env: dict[str, str], pool: str, parameters: dict[str, str], logs: Path
) -> tuple[dict, dict, dict]:
    """Server, work pool, `prefect deploy` of the shipped file, worker, one run with `parameters`: the
    deployment as deployed, the finished run, and the deployment after it."""
    api = env["PREFECT_API_URL"]
    server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
    port = api.removeprefix("http://127.0.0.1:").removesuffix("/api")
    server_cmd = [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", port, "--no-ui"]
    with contextlib.ExitStack() as stack:  # the worker stops first, then the server
        server = stack.enter_context(background(server_cmd, server_env, logs / "server.log"))
        wait_healthy(api, server, logs / "server.log")
        _prefect(["work-pool", "create", pool, "--type", "process"], env)
        _prefect(["--no-prompt", "deploy", "--name", "retrain"], env)
        deployed = httpx.get(f"{api}/deployments/name/retrain/retrain", timeout=10).json()
        worker_cmd = [*PREFECT, "worker", "start", "--pool", pool]
        stack.enter_context(background(worker_cmd, env, logs / "worker.log"))
        overrides = [arg for key, value in parameters.items() for arg in ("--param", f"{key}={value}")]
        out = _prefect(["deployment", "run", "retrain/retrain", *overrides], env)
        run = _wait_finished(api, re.search(r"UUID: ([0-9a-f-]{36})", out).group(1), logs / "worker.log")
        assert run["state_type"] == "COMPLETED", f"{run['state']}\n{tail(logs / 'worker.log')}"
        after = httpx.get(f"{api}/deployments/{deployed['id']}", timeout=10).json()
    return deployed, run, after


@pytest.mark.slow
def test_prefect_yaml_deploys_and_a_worker_runs_retrain(
    tmp_path, prefect_env, synthetic_train_file, tiny_base
):
    shipped = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    pool = next(d for d in shipped["deployments"] if d["name"] == "retrain")["work_pool"]["name"]
    (tmp_path / "project").mkdir()
    params = write_tiny_params(tmp_path / "project", synthetic_train_file, tiny_base)
    overrides = {"params_file": str(params), "lock": str(tmp_path / "project" / "dvc.lock")}

    deployed, run, after = _deploy_and_run(prefect_env, pool, overrides, tmp_path)

    assert run["parameters"] == {"only_new_data": True, **overrides}  # the deployment's own, and ours
    schedule = deployed["schedules"][0]
    assert (schedule["schedule"]["cron"], schedule["schedule"]["timezone"], schedule["active"]) == (
        "0 3 * * 1",
        "UTC",
        True,
    )
    assert deployed["global_concurrency_limit"]["limit"] == 1
    assert deployed["concurrency_options"]["collision_strategy"] == "ENQUEUE"
    assert after["global_concurrency_limit"]["active_slots"] == 0, "the finished run still holds the slot"
    assert deployed["parameters"] == {"params_file": "params.yaml", "only_new_data": True}
    assert deployed["work_pool_name"] == pool
    assert deployed["pull_steps"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": str(ROOT)}}
    ]

    from pipeline.mlops.registry import client

    versions = client().search_model_versions("name='tiny-model'")
    assert [v.tags["prefect_flow_run_id"] for v in versions] == [run["id"]]
