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

from tests.api.conftest import QUESTIONS, free_port, make_app, wait_ready

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
        wait_ready(api)
        expected = [
            api.post("/v1/systemone", json={"state": s, "questions": QUESTIONS}).json()["answers"]
            for s in STATES
        ]

    port = free_port()
    mlflow_cli = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [
            str(mlflow_cli),
            "models",
            "serve",
            "-m",
            "models:/decision-model@champion",
            "--env-manager",
            "local",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
        ],
        # mlflow execs `uvicorn` from PATH: the one beside this interpreter, also when pytest runs outside
        # `make`.
        env={
            **os.environ,
            "MLFLOW_TRACKING_URI": uri,
            "PATH": f"{mlflow_cli.parent}{os.pathsep}{os.environ['PATH']}",
        },
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
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


LOADER = """
import json, sys
# The project is not importable here: its editable-install finder is dropped and it is not on the path.
sys.meta_path = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
sys.path = [p for p in sys.path if p not in ("", sys.argv[1])]
import importlib.util
assert importlib.util.find_spec("pipeline") is None, "the project is still importable"
import mlflow
model = mlflow.pyfunc.load_model("models:/decision-model/1")
print(json.dumps(model.predict(json.loads(sys.argv[2]))))
"""


@pytest.mark.slow
def test_a_registered_version_answers_from_a_fresh_process_that_cannot_import_the_project(
    tmp_path, monkeypatch, served_folder
):
    import json

    from pipeline.mlops.registry import register_export

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert register_export(served_folder, "decision-model") == "1"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    requests = [{"state": s, "questions": QUESTIONS} for s in STATES]
    project = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", LOADER, project, json.dumps(requests)],
        cwd=elsewhere,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers = json.loads(done.stdout.strip().splitlines()[-1])
    with TestClient(make_app(served_folder)) as api:
        wait_ready(api)
        expected = [api.post("/v1/systemone", json=r).json()["answers"] for r in requests]
    assert [a["answers"] for a in answers] == expected
