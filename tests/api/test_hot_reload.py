"""Serving `models:/NAME@champion`: moving the alias swaps versions under load, and a bad version never
serves."""

import shutil
import threading
import time

import httpx
import pytest

from tests.api.conftest import QUESTIONS, live_server, make_app
from tests.tiny import write_tiny_base

NAME = "decision-model"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    return tmp_path


def register(folder, alias=None) -> str:
    from pipeline.mlops.registry import client, register_export

    version = register_export(folder, NAME)
    if alias:
        client().set_registered_model_alias(NAME, alias, version)
    return version


@pytest.mark.slow
def test_moving_the_alias_swaps_versions_without_failing_a_request(registry, tiny_base):
    from pipeline.mlops.registry import client

    first = register(tiny_base, "champion")
    second = register(write_tiny_base(registry / "second", seed=7))
    broken = registry / "broken"
    shutil.copytree(tiny_base, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    third = register(broken)

    app = make_app(f"models:/{NAME}@champion", poll_s=0.2)
    with live_server(app) as url:
        seen, failures, stop = [], [], threading.Event()

        def client_loop():
            with httpx.Client(base_url=url, timeout=30) as http:
                while not stop.is_set():
                    response = http.post(
                        "/v1/systemone", json={"state": "a great product", "questions": QUESTIONS}
                    )
                    if response.status_code != 200:
                        failures.append(response.status_code)
                    else:
                        body = response.json()
                        seen.append((body["model"], body["answers"]["tone"]["probabilities"]["negative"]))

        threads = [threading.Thread(target=client_loop) for _ in range(3)]
        for thread in threads:
            thread.start()
        try:
            _wait_for(lambda: len(seen) > 5)
            client().set_registered_model_alias(NAME, "champion", second)
            _wait_for(lambda: seen[-1][0] == f"{NAME}/{second}")
            client().set_registered_model_alias(NAME, "champion", third)  # fails to load: keep serving second
            time.sleep(2.0)
            n_before = len(seen)
            _wait_for(lambda: len(seen) > n_before + 5)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        health = httpx.get(f"{url}/healthz").json()

    assert failures == []
    names = [name for name, _ in seen]
    assert names[0] == f"{NAME}/{first}" and names[-1] == f"{NAME}/{second}"
    assert f"{NAME}/{third}" not in names and health["model"] == f"{NAME}/{second}"
    switch = names.index(f"{NAME}/{second}")
    assert all(name == f"{NAME}/{second}" for name in names[switch:])  # no flapping back
    assert {p for name, p in seen if name.endswith(first)} != {p for name, p in seen if name.endswith(second)}


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
