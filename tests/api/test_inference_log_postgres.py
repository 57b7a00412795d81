"""The inference and feedback tables in PostgreSQL (`--inference-log postgresql://...`): a real cluster, a
real server writing to it, feedback upserted on (decision, question), and the harvest's join reading it
back."""

import json

import pytest
from fastapi.testclient import TestClient

from pipeline.flywheel.harvest import labelled_rows
from pipeline.flywheel.log import LogConfig
from pipeline.flywheel.table import open_store
from pipeline.serving.catalog import Catalog
from pipeline.serving.keys import KeyStore
from pipeline.serving.server import ServerConfig, create_app
from tests.api.conftest import QUESTIONS, wait_ready
from tests.services import postgres_cluster

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def database():
    with postgres_cluster() as pg:
        yield pg.create_database("inference")


def test_a_server_logs_to_postgres_and_feedback_replaces_per_question(served_folder, database):
    app = create_app(
        Catalog(str(served_folder)), KeyStore(), ServerConfig(), log_config=LogConfig(database, flush_s=0.2)
    )
    with TestClient(app) as api:
        wait_ready(api)
        ids = [
            api.post("/v1/systemone", json={"state": {"text": f"late {i}"}, "questions": QUESTIONS}).json()[
                "x_decision_id"
            ]
            for i in range(3)
        ]
        for label in ("negative", "positive"):
            sent = api.post(
                "/v1/feedback", json={"decision_id": ids[0], "gold": {"tone": label, "intensity": 1}}
            )
            assert sent.status_code == 200, sent.text
    store = open_store(database)
    assert "password" not in store.where and set(store.decisions().column("decision_id").to_pylist()) == set(
        ids
    )
    feedback = {r["question_id"]: json.loads(r["gold"]) for r in store.feedback().to_pylist()}
    assert feedback == {"tone": "positive", "intensity": 1}  # upserted: the re-send replaced, never added
    (row,) = labelled_rows(store, harvested={}).rows
    assert (
        row["decision_id"] == ids[0]
        and row["state"] == {"text": "late 0"}
        and set(row["questions"]) == {"tone", "intensity"}
    )
