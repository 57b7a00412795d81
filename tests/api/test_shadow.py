"""Shadow challenger: it scores a sampled share of the champion's requests after they are answered, reports
agreement, mean |dp| and its latency on /v1/shadow, and records them on its registry version in MLflow."""

import time

import pytest
from fastapi.testclient import TestClient

from pipeline.serving.catalog import Catalog
from pipeline.serving.keys import KeyStore
from pipeline.serving.server import create_app
from pipeline.serving.shadow import ShadowScorer
from tests.api.conftest import QUESTIONS, wait_ready
from tests.tiny import write_tiny_base

NAME = "decision-model"
BODY = {"state": "the order was late", "questions": QUESTIONS}


def _wait_scored(client, n: int, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while (report := client.get("/v1/shadow").json())["scored"] < n:
        assert time.monotonic() < deadline, report
        time.sleep(0.05)
    return report


class SlowServing:
    """A challenger catalog whose model takes `delay_s` longer to answer (to show the champion never
    waits)."""

    def __init__(self, catalog: Catalog, delay_s: float) -> None:
        self.catalog, self.delay_s = catalog, delay_s
        self.load_error = None

    def start(self) -> None:
        self.catalog.start()

    def stop(self) -> None:
        self.catalog.stop()

    @property
    def serving(self):
        served = self.catalog.serving
        if served is not None and not getattr(served.model, "slowed", False):
            answer = served.model.answer

            def slow(requests):
                time.sleep(self.delay_s)
                return answer(requests)

            served.model.answer, served.model.slowed = slow, True
        return served


def test_the_champion_answers_without_waiting_for_a_slow_shadow(served_folder, tmp_path):
    challenger = write_tiny_base(tmp_path / "challenger", seed=7)
    shadow = ShadowScorer(SlowServing(Catalog(str(challenger)), delay_s=1.5), share=1.0, seed=0)
    with TestClient(create_app(Catalog(str(served_folder)), KeyStore(), shadow=shadow)) as client:
        wait_ready(client)
        _wait_for(lambda: shadow.source.serving is not None)
        took = []
        for _ in range(3):
            started = time.perf_counter()
            assert client.post("/v1/systemone", json=BODY).status_code == 200
            took.append(time.perf_counter() - started)
        report = _wait_scored(client, 3, timeout_s=30)
    assert max(took) < 1.0, (
        took
    )  # every answer came back while the shadow was still sleeping on an earlier one
    assert report["challenger_latency_ms"]["p50"] >= 1500 and report["offered"] == 3
    assert 0.0 <= report["agreement"] <= 1.0 and report["mean_abs_diff"] > 0  # a different model: it differs


def test_a_registry_challenger_is_followed_and_its_comparison_recorded_on_its_version(
    served_folder, tmp_path, monkeypatch
):
    from pipeline.mlops.registry import client as mlflow_client
    from pipeline.mlops.registry import register_export
    from pipeline.mlops.tracking import record_shadow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    champion = register_export(served_folder, NAME)
    challenger = register_export(served_folder, NAME)  # the same weights: it must agree everywhere
    mlflow_client().set_registered_model_alias(NAME, "champion", champion)
    mlflow_client().set_registered_model_alias(NAME, "challenger", challenger)
    source = Catalog(f"models:/{NAME}@challenger", poll_s=0.2)
    shadow = ShadowScorer(source, share=0.5, seed=1, on_report=record_shadow)
    with TestClient(
        create_app(Catalog(f"models:/{NAME}@champion", poll_s=0.2), KeyStore(), shadow=shadow)
    ) as api:
        wait_ready(api)
        _wait_for(lambda: source.serving is not None)
        for _ in range(20):
            assert api.post("/v1/systemone", json=BODY).status_code == 200
        report = _wait_scored(api, 1)
        assert report["challenger"] == f"{NAME}/{challenger}" and report["offered"] == 20
        assert 0 < report["scored"] + report["dropped"] < 20  # a share, not every request
        assert report["agreement"] == 1.0 and report["mean_abs_diff"] == pytest.approx(0.0, abs=1e-9)
    # Leaving the server reports to MLflow: metrics on the challenger version's run, tags on the version.
    version = mlflow_client().get_model_version(NAME, challenger)
    assert float(version.tags["shadow_agreement"]) == 1.0
    history = mlflow_client().get_metric_history(version.run_id, "shadow_agreement")
    assert history and history[-1].value == 1.0


def test_no_shadow_is_a_404(served_folder):
    with TestClient(create_app(Catalog(str(served_folder)), KeyStore())) as client:
        assert client.get("/v1/shadow").status_code == 404


def _wait_for(condition, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)
