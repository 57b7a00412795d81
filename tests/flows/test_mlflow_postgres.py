"""MLflow on PostgreSQL: a real `mlflow server` whose backend store is a PostgreSQL cluster this module
starts, with proxied artifacts, selected by one setting (`MLFLOW_TRACKING_URI=http://…`). The retrain flow
registers, smoke-tests (`decision serve` on the fetched version) and promotes through it; the Decision API
follows `@champion` on it; the pyfunc loads from it. A PostgreSQL that is down or refuses fails the flow
before any training, naming the URI with its password masked.

    python -m pytest tests/flows/test_mlflow_postgres.py -q      # skips, saying why, without PostgreSQL
"""

from pathlib import Path

import httpx
import pytest

from pipeline.stages.smoke import free_port
from tests.api.conftest import QUESTIONS, live_server, make_app
from tests.services import mlflow_server, postgres_cluster
from tests.tiny import write_tiny_base

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster():
    with postgres_cluster() as pg:
        yield pg


@pytest.fixture(scope="module")
def tracking_server(cluster, tmp_path_factory):
    """(server URL, its artifacts folder) for an MLflow server on a fresh PostgreSQL database."""
    folder = tmp_path_factory.mktemp("mlflow-server")
    backend = cluster.create_database("mlflow")
    with mlflow_server(backend, folder / "artifacts", folder / "server.log") as url:
        yield url, folder / "artifacts"


def _rows(cluster, sql: str) -> list[tuple]:
    import psycopg

    with psycopg.connect(cluster.uri("mlflow")) as connection:
        return connection.execute(sql).fetchall()


def test_the_flow_registers_promotes_and_serves_through_a_tracking_server_on_postgres(
    prefect_harness, cluster, tracking_server, tiny_params, monkeypatch, tmp_path
):
    import mlflow.pyfunc

    from pipeline.mlops.promotion import CHAMPION, current, set_alias
    from pipeline.mlops.registry import INPUT_EXAMPLE, client, register_export
    from tests.flows.test_retrain import run_flow

    url, artifacts = tracking_server
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    summary = run_flow(tiny_params)

    assert summary.release.version == "1" and summary.release.promoted and summary.release.smoke.passed
    assert current("tiny-model", CHAMPION) == "1"
    # The server kept them in PostgreSQL, and the artifacts went through it into its artifacts destination.
    assert _rows(cluster, "SELECT name, version FROM model_versions") == [("tiny-model", 1)]
    assert _rows(cluster, f"SELECT status FROM runs WHERE run_uuid = '{summary.tracked.mlflow_run_id}'") == [
        ("FINISHED",)
    ]
    assert any(artifacts.rglob("manifest.json")) and any(artifacts.rglob("loss_curve.png"))

    answers = mlflow.pyfunc.load_model("models:/tiny-model@champion").predict(INPUT_EXAMPLE)
    assert set(answers[0]["answers"]) == {"tone"}

    second = register_export(write_tiny_base(tmp_path / "second", seed=7), "tiny-model")
    with live_server(make_app("models:/tiny-model@champion", poll_s=0.2)) as served:
        assert _served(served) == "tiny-model/1"
        set_alias("tiny-model", CHAMPION, second, "test: the server follows the alias")
        _wait_until(lambda: _served(served) == f"tiny-model/{second}")
    assert client().get_registered_model("tiny-model").aliases[CHAMPION] == second


def _served(url: str) -> str:
    body = {"state": "a fine day", "questions": QUESTIONS}
    return httpx.post(f"{url}/v1/systemone", json=body, timeout=30).json()["model"]


def _wait_until(check, timeout_s: float = 60) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the server did not follow the alias"
        time.sleep(0.2)


@pytest.mark.parametrize("case", ["down", "refuses"])
def test_a_postgres_that_is_down_or_refuses_fails_the_flow_before_training(
    case, prefect_harness, cluster, tiny_params, monkeypatch
):
    from pipeline.mlops.store import TrackingStoreError
    from tests.flows.test_retrain import run_flow

    password = "not-the-password" if case == "refuses" else cluster.password
    port = cluster.port if case == "refuses" else free_port()  # nothing listens on a fresh free port
    uri = f"postgresql://decision:{password}@127.0.0.1:{port}/mlflow"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    with pytest.raises(TrackingStoreError) as raised:
        run_flow(tiny_params)

    message = str(raised.value)
    assert f"postgresql://decision:***@127.0.0.1:{port}/mlflow" in message and password not in message
    assert not (Path(tiny_params).parent / "runs").exists(), "training started"


def test_a_tracking_server_whose_postgres_went_down_is_named_in_the_error(tmp_path):
    from pipeline.mlops.store import TrackingStoreError, check_tracking_store

    with postgres_cluster() as pg:
        backend = pg.create_database("mlflow")
        with mlflow_server(backend, tmp_path / "artifacts", tmp_path / "server.log") as url:
            check_tracking_store(url)  # up: no error
            pg.stop()
            with pytest.raises(TrackingStoreError, match=f"store {url} is not reachable"):
                check_tracking_store(url)
