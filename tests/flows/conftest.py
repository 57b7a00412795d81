"""Flow fixtures: a Prefect test harness, a private MLflow store, and a tiny project (synthetic rows, tiny
base)."""

import os
import sys
from pathlib import Path

import pytest
import yaml

from pipeline.stages.smoke import free_port
from tests.flows.processes import background, wait_healthy
from tests.tiny import pin_inputs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect API for the session (its start dominates: ~15 s)."""
    import os

    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault(
        "PREFECT_SERVER_ANALYTICS_ENABLED", "false"
    )  # else a fresh home logs "database is locked"
    # A busy 2-core machine (xdist workers, other jobs) can take past the 30 s default to start the API.
    with prefect_test_harness(server_startup_timeout=180):
        yield


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch) -> str:
    uri = f"sqlite:///{tmp_path}/mlflow/mlflow.db"
    (tmp_path / "mlflow").mkdir()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri


def write_tiny_params(folder: Path, data: Path, base: Path, pin: bool = True, **overrides) -> Path:
    """A params.yaml for the whole flow on tiny inputs (a few seconds of training); with `pin`, data and base
    are pinned in `folder/dvc.lock` (copied into `folder` first when outside it), as the flow requires."""
    if pin:
        data, base = pin_inputs(folder, data, base)
    params = {
        # A validation split of ~44 decisions (10% of the training rows): the calibrator fits on it, as in a
        # real run.
        "validate": {
            "data": str(data),
            "report": str(folder / "validation.json"),
            "holdout_max_decisions": 40,
            "validation_min_decisions": 30,
        },
        "train": {
            "max_steps": 4,
            "micro_batch": 4,
            "grad_accum": 2,
            "log_every": 1,
            "lora_r": 4,
            "lora_alpha": 4,
        },
        "retrain": {
            "data": str(data),
            "base": str(base),
            "runs_dir": str(folder / "runs"),
            "model_name": "tiny-model",
            "smoke_decisions": 20,
            "device": "cpu",
        },
        # A few steps on tiny data learn little: the learning check would rightly hold such runs back.
        "promote": {"max_ece": 1.0, "refuse_unlearned": False},
        # The export's int8 encoder, as params.yaml ships it; bounds a random tiny model's answers can meet, so
        # the first scheme is kept (each further one would answer the validation rows again).
        "quantize": {"int8": True, "min_agreement": 0.5, "max_accuracy_drop": 0.5, "max_ece_rise": 0.5},
    }
    for section, values in overrides.items():
        params[section] = {**params.get(section, {}), **values}
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


@pytest.fixture
def tiny_params(tmp_path, synthetic_train_file, tiny_base) -> Path:
    return write_tiny_params(tmp_path, synthetic_train_file, tiny_base)


@pytest.fixture(scope="module")
def prefect_api(tmp_path_factory):
    """A private Prefect server and home for every flow of a module that runs flows as processes (`python -m
    flows.NAME`): their environment, with PREFECT_API_URL."""
    home = tmp_path_factory.mktemp("prefect-home")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env |= {"PREFECT_HOME": str(home), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "prefect",
        "server",
        "start",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-ui",
    ]
    with background(command, env, home / "server.log") as server:
        api = f"http://127.0.0.1:{port}/api"
        wait_healthy(api, server, home / "server.log")
        yield env | {"PREFECT_API_URL": api}


def flow_env(prefect_env: dict[str, str], mlflow_uri: str) -> dict[str, str]:
    """The environment of a flow process: `prefect_api`'s, this checkout first on the path, the MLflow
    store."""
    # The flow must import this checkout's `pipeline` and `flows`, whatever the caller's PYTHONPATH says.
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    # One thread: the tiny model gains nothing from more, and on a busy machine spinning threads made its
    # steps 20x slower (0.9 s instead of 0.04 s), the test's time with them.
    return prefect_env | {
        "MLFLOW_TRACKING_URI": mlflow_uri,
        "PYTHONPATH": path,
        "PYTHONUNBUFFERED": "1",
        "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
        "OMP_NUM_THREADS": "1",
    }
