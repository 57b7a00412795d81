"""A registered version served by `mlflow models serve` answers /invocations as the Decision API does."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import QUESTIONS, free_port, make_app

STATES = ["I love this product, it is great", {"text": "the order was late", "stars": 2}]


@pytest.mark.slow
def test_mlflow_models_serve_answers_like_the_decision_api(tmp_path, monkeypatch, served_folder):
    from pipeline.mlops.promotion import CHAMPION, set_alias
    from pipeline.mlops.registry import register_export

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    version = register_export(served_folder, "decision-model")
    set_alias("decision-model", CHAMPION, version, "test")

    with TestClient(make_app(served_folder)) as api:
        while api.get("/healthz").status_code != 200:
            time.sleep(0.05)
        expected = [api.post("/v1/systemone", json={"state": s, "questions": QUESTIONS}).json()["answers"]
                    for s in STATES]  # fmt: skip

    port = free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [str(mlflow_cli), "models", "serve", "-m", "models:/decision-model@champion", "--env-manager", "local",
         "-h", "127.0.0.1", "-p", str(port)],
        env={**os.environ, "MLFLOW_TRACKING_URI": uri}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        body = {"dataframe_records": [{"state": s, "questions": QUESTIONS} for s in STATES]}
        predictions = _post_when_ready(f"http://127.0.0.1:{port}/invocations", body, server)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
    assert [p["answers"] for p in predictions] == expected


def _post_when_ready(url: str, body: dict, server: subprocess.Popen, timeout_s: float = 120) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert server.poll() is None, "mlflow models serve exited"
        try:
            response = httpx.post(url, json=body, timeout=30)
            if response.status_code == 200:
                return response.json()["predictions"]
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer")
