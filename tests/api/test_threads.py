"""A server process runs torch on its share of the CPU budget (`--threads`, split between `--workers`), its
inference thread on the count the load governor says now, and `/healthz` says how many threads and why."""

import pytest
import torch
from fastapi.testclient import TestClient

from pipeline.cli.main import main
from pipeline.cpu.budget import CpuBudget
from pipeline.cpu.load import ThreadGovernor
from pipeline.serving.catalog import Catalog
from pipeline.serving.keys import KeyStore
from pipeline.serving.server import ServeOptions, ServerConfig, build_app, create_app
from tests.api.conftest import wait_ready


@pytest.fixture
def torch_threads():
    """Put the test process's torch thread count back (building a server's app sets it)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_healthz_reports_the_threads_of_this_workers_share(served_folder, torch_threads):
    app = build_app(ServeOptions(str(served_folder), threads=4, workers=2))  # this process: one of 2 workers
    with TestClient(app) as client:
        health = wait_ready(client).get("/healthz").json()
    assert (health["threads"], health["threads_source"]) == (2, "--threads 4, split among 2 workers")
    assert (health["threads_budget"], health["threads_adaptive"]) == (2, False)  # a set count is held
    assert torch.get_num_threads() == 2


def test_healthz_names_the_detected_budget_without_a_setting(served_folder, torch_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0})
    with TestClient(build_app(ServeOptions(str(served_folder)))) as client:
        health = wait_ready(client).get("/healthz").json()
    # a quota can only be 1 or more; a found budget follows other processes' load
    assert (health["threads"], health["threads_budget"], health["threads_adaptive"]) == (1, 1, True)
    assert health["threads_source"] == "affinity 1; following other processes' load"


def test_serve_by_run_config_refuses_one_that_does_not_exist(capsys):
    assert main(["serve", "--run-config", "no-such-run"]) == 2
    assert "--run-config no-such-run: run config 'no-such-run': no file" in capsys.readouterr().err


def test_serve_by_run_config_serves_the_champion_of_its_model(monkeypatch):
    served = {}
    monkeypatch.setattr(
        "pipeline.serving.server.run_server", lambda options, *rest: served.update(model=options.model)
    )
    monkeypatch.setattr(
        "pipeline.mlops.registry.parse_alias_uri", lambda uri: ("decision-model-tiny", "champion")
    )
    monkeypatch.setattr(
        "pipeline.mlops.registry.alias_problem", lambda name, alias: None
    )  # a champion exists
    assert main(["serve", "--run-config", "tiny"]) == 0
    assert served["model"] == "models:/decision-model-tiny@champion"  # tiny.yaml's retrain.model_name


def test_the_inference_thread_runs_on_the_count_the_governor_says(served_folder):
    governor = ThreadGovernor(
        CpuBudget(2, "affinity 2", automatic=True), sample_s=3600
    )  # no sample in the test
    app = create_app(Catalog(str(served_folder)), KeyStore(), ServerConfig(), None, governor)
    body = {"state": "late again", "questions": {"late": {"type": "noul", "instructions": "It was late."}}}
    with TestClient(app) as client:
        wait_ready(client)
        inference = app.state.batcher._executor
        for busy, threads in ((1.0, 1), (0.0, 2)):  # a neighbour takes a core, then leaves
            governor.observe(busy)
            assert client.post("/v1/systemone", json=body).status_code == 200
            assert inference.submit(torch.get_num_threads).result() == threads
            assert client.get("/healthz").json()["threads"] == threads
