"""Prefect on PostgreSQL with a shared work pool: a real Prefect server whose database is a PostgreSQL cluster
this module starts (`PREFECT_API_DATABASE_CONNECTION_URL=postgresql+asyncpg://…`), MLflow on a tracking server
on the same cluster, the shipped `retrain` deployment on its process pool, and two workers, each with its own
Prefect home. Task results go to the server's default result storage (`python -m flows.shared_pool`), a
folder both see. A worker killed mid-run (SIGKILL, with its flow run) leaves the run CRASHED once its
heartbeats stop (`python -m flows.shared_pool`'s automation); the rerun, picked up by the other worker,
finds the crashed run's finished tasks in the shared cache; with both workers polling, the deployment's
concurrency limit still runs two retrains one after the other.

    python -m pytest tests/flows/test_shared_pool.py -q -s      # a few minutes; skips without PostgreSQL
"""

import contextlib
import datetime as dt
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from tests.flows.conftest import write_tiny_params
from tests.flows.processes import background, tail
from tests.services import mlflow_server, postgres_cluster, prefect_env, prefect_server

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
# Tasks the crashed run finished before its worker was stopped (it is stopped once calibration is on disk).
FINISHED_BEFORE_THE_KILL = ("validate", "train", "calibrate")
# A heartbeat every 30 s (prefect.yaml): marked CRASHED after 45 s without one, so the test waits ~1 minute.
CRASH_AFTER_S = 45


@dataclass(frozen=True)
class Stack:
    api: str
    env: dict[str, str]
    """The environment of every Prefect client here (CLI, workers, the flow runs they start)."""
    root: Path

    @property
    def shared_results(self) -> Path:
        return self.root / "shared-results"


def _prefect(args: list[str], env: dict[str, str]) -> str:
    done = subprocess.run([*PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"prefect {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory) -> Iterator[Stack]:
    """PostgreSQL; a Prefect server and an MLflow server on it; the work pool, the shared result storage and
    the deployment, as docs/scale-out.md sets them up."""
    root = tmp_path_factory.mktemp("stack")
    with postgres_cluster() as pg:
        pg.create_database("prefect")
        with (
            prefect_server(pg.uri("prefect", "postgresql+asyncpg"), root / "server") as api,
            mlflow_server(pg.create_database("mlflow"), root / "artifacts", root / "mlflow.log") as tracking,
        ):
            path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
            env = prefect_env(
                root / "client",
                api,
                MLFLOW_TRACKING_URI=tracking,
                PREFECT_WORKER_QUERY_SECONDS="1",
                MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR="false",
                OMP_NUM_THREADS="1",
                PYTHONPATH=path,
            )
            _prefect(["work-pool", "create", _pool(), "--type", "process"], env)
            shared = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "flows.shared_pool",
                    str(root / "shared-results"),
                    "--crash-after",
                    str(CRASH_AFTER_S),
                ],
                env=env,
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert shared.returncode == 0, shared.stderr
            _prefect(["--no-prompt", "deploy", "--name", "retrain"], env)
            yield Stack(api, env, root)


def _pool() -> str:
    shipped = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    return next(d for d in shipped["deployments"] if d["name"] == "retrain")["work_pool"]["name"]


@contextlib.contextmanager
def worker(stack: Stack, name: str) -> Iterator[subprocess.Popen]:
    """A process worker on the pool with a Prefect home of its own (its local storage is not shared)."""
    env = stack.env | {"PREFECT_HOME": str(stack.root / name)}
    command = [*PREFECT, "worker", "start", "--pool", _pool(), "--name", name]
    with background(command, env, stack.root / f"{name}.log") as proc:
        yield proc


def _kill_mid_run(proc: subprocess.Popen) -> None:
    """SIGKILL the worker and every process under it (the flow run it started), as a lost machine would."""
    family = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(family, timeout=60)


def _run(stack: Stack, parameters: dict[str, str]) -> str:
    overrides = [arg for key, value in parameters.items() for arg in ("--param", f"{key}={value}")]
    out = _prefect(["deployment", "run", "retrain/retrain", *overrides], stack.env)
    return re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)


def _flow_run(stack: Stack, run_id: str) -> dict:
    return httpx.get(f"{stack.api}/flow_runs/{run_id}", timeout=10).json()


def _wait(stack: Stack, run_id: str, done, what: str, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run = _flow_run(stack, run_id)
        if done(run):
            return run
        time.sleep(1)
    logs = "\n".join(tail(log, 3000) for log in sorted(stack.root.glob("worker-*.log")))
    raise AssertionError(f"flow run {run_id} not {what} after {timeout} s ({run['state_type']}):\n{logs}")


def _finished(stack: Stack, run_id: str) -> dict:
    return _wait(stack, run_id, lambda run: run["state_type"] in TERMINAL, "finished")


def _task_states(stack: Stack, run_id: str) -> dict[str, str]:
    body = {"task_runs": {"flow_run_id": {"any_": [run_id]}}}
    runs = httpx.post(f"{stack.api}/task_runs/filter", json=body, timeout=10).json()
    return {run["name"].rsplit("-", 1)[0]: run["state"]["name"] for run in runs}


def _versions() -> list:
    from pipeline.mlops.registry import client

    return client().search_model_versions("name='tiny-model'")


@pytest.fixture
def project(stack, tmp_path, monkeypatch, synthetic_train_file, tiny_base) -> dict[str, str]:
    """The tiny project's flow parameters; this process's MLflow client on the stack's tracking server."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", stack.env["MLFLOW_TRACKING_URI"])
    params = write_tiny_params(tmp_path, synthetic_train_file, tiny_base)
    return {"params_file": str(params), "lock": str(tmp_path / "dvc.lock")}


def test_a_worker_killed_mid_run_crashes_it_and_the_other_worker_resumes_from_the_shared_cache(
    stack, project
):
    runs_dir = Path(project["params_file"]).parent / "runs"
    with worker(stack, "worker-a") as first:
        crashed = _run(stack, project)
        _wait(
            stack,
            crashed,
            lambda run: any(runs_dir.glob("*/calibration.json")) or run["state_type"] in TERMINAL,
            "calibrated",
        )
        _kill_mid_run(first)
    # No one is left to report it: the heartbeat automation marks it once CRASH_AFTER_S pass in silence.
    assert _finished(stack, crashed)["state_type"] == "CRASHED"

    with worker(stack, "worker-b"):
        rerun = _run(stack, project)
        finished = _finished(stack, rerun)
    assert finished["state_type"] == "COMPLETED", tail(stack.root / "worker-b.log")

    states = _task_states(stack, rerun)
    print(f"\ncrashed run's tasks: {_task_states(stack, crashed)}\nrerun's tasks on worker-b: {states}")
    assert {name: states[name] for name in FINISHED_BEFORE_THE_KILL} == dict.fromkeys(
        FINISHED_BEFORE_THE_KILL, "Cached"
    )
    assert (
        rerun in (stack.root / "worker-b.log").read_text()
        and rerun not in (stack.root / "worker-a.log").read_text()
    )
    # The results (and cache records) are in the shared folder, not in either worker's own home.
    assert any(stack.shared_results.iterdir())
    assert not any((stack.root / name / "storage").exists() for name in ("worker-a", "worker-b"))
    assert len(_versions()) == 1


def test_two_workers_on_the_pool_never_run_two_retrains_at_once(stack, project):
    with worker(stack, "worker-a"), worker(stack, "worker-b"):
        runs = [_run(stack, project), _run(stack, project)]
        finished = [_finished(stack, run_id) for run_id in runs]
    assert [run["state_type"] for run in finished] == ["COMPLETED", "COMPLETED"]
    spans = sorted(
        (dt.datetime.fromisoformat(r["start_time"]), dt.datetime.fromisoformat(r["end_time"]))
        for r in finished
    )
    print(f"\nruns: {[(str(s), str(e)) for s, e in spans]}")
    assert spans[0][1] <= spans[1][0], f"the two retrains overlapped: {spans}"
    deployment = httpx.get(f"{stack.api}/deployments/name/retrain/retrain", timeout=10).json()
    assert deployment["global_concurrency_limit"]["active_slots"] == 0
